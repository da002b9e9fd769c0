"""Trial runner: each candidate config runs in a child process that can die without taking us.

A Triton candidate may hang, segfault or poison the CUDA context (illegal access), so trials run
in a long-lived child (spawn context: a forked child of a process that probed CUDA cannot use
it); the child is killed, with every process its kernels' code started (it leads its own
session), and replaced when a trial exceeds its timeout or the child dies. The pipeline in the
child is: validate -> compile (first launch, timed) -> check over the kernel's input domain
(kernels.check) -> measure with the benchmark's protocol.

Compile-ahead: on a GPU, a pool of processes compiles upcoming configs with Triton's launches
turned into warmups (compile, no launch); Triton's on-disk cache then makes the child's first
launch a cache load, so the GPU never waits on the compiler. The pool starts with the child
(its workers import torch and Triton and create their CUDA context before the first config
arrives) and compiles on uninitialised tensors of the case's shapes. Under the interpreter there
is nothing to compile and the pool is not started.

A trial never pays for the pool's start: while the pool warms up (seconds to tens of seconds for
15 workers on a busy host), a config the pool has not compiled yet is compiled by the child
instead of waited for, and the trial's timeout clock does not run (the warming workers compete
with the child for the CPU). The child itself initialises (CUDA context, Triton's driver, one
tiny kernel) before it reports ready, so the first trial's timeout is not spent on that either.

The child keeps the current case's inputs between trials (kernels.check.InputCache): the
benchmark draw for the first launch and the timing, the check's draws with their float64
references. A trial that modified its inputs drops them.

The child's side is trial_child.py, the pool's compile_pool.py, a trial's result
trial_outcome.py; their names used elsewhere are importable from here too.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing as mp
import os
import time
from typing import Any, Callable, Mapping, Sequence

from kernelsearch.kernels.errors import FailureKind, TrialCrash
from kernelsearch.kernels.registry import get_kernel

from .compile_pool import _SHAPED, _compile_init, _key, _warm_worker, compile_config  # noqa: F401 - _SHAPED: tests reach it here
from .process_lifetime import die_with_parent, how_it_ended, kill_group
from .trial_child import _child_main
from .trial_outcome import TrialCancelled, TrialOutcome

log = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 300.0
# A trial's time limit when none is given: on a GPU, and under the Triton interpreter, where one
# call of a kernel takes seconds (B: a default trial of about 15 s on a 2-core host).
GPU_TRIAL_TIMEOUT_S = 120.0
INTERPRETER_TRIAL_TIMEOUT_S = 600.0
# How often a waiting trial asks its `cancel` callable.
_CANCEL_POLL_S = 0.2


def _origin(kernel: str) -> dict[str, Any]:
    """How a child learns a kernel registered here after it started: the module it imports, or
    for a kernel no import makes (a captured call's), the spec it is made again from."""
    try:
        k = get_kernel(kernel)
    except KeyError:
        return {"module": None}
    spec = getattr(k, "child_spec", None)
    return {"module": k.module, "child_spec": spec() if callable(spec) else None}


class TrialRunner:
    """Runs trials in a kept-alive child process; replaces it after a crash or a timeout.

    `kernel_modules` are imported in every child before the first trial (a module that registers
    extra kernels, e.g. a test's). `compile_workers` sizes the compile-ahead pool on a GPU
    (None: one per CPU core up to 16; 0: off); under the Triton interpreter it is off.
    `trial_timeout_s` None: the child's device decides (GPU_TRIAL_TIMEOUT_S, or
    INTERPRETER_TRIAL_TIMEOUT_S under the interpreter).
    """

    # Tests set this on a subclass to exercise the compile-ahead pool under the interpreter,
    # where "compiling" a config runs it on the CPU.
    compile_under_interpreter = False

    def __init__(self, *, trial_timeout_s: float | None = None, kernel_modules: Sequence[str] = (),
                 compile_workers: int | None = None, startup_timeout_s: float = _STARTUP_TIMEOUT_S):
        if trial_timeout_s is not None and trial_timeout_s <= 0:
            raise ValueError("trial_timeout_s: must be positive")
        if compile_workers is not None and compile_workers < 0:
            raise ValueError("compile_workers: must be >= 0")
        self._trial_timeout_s = float(trial_timeout_s) if trial_timeout_s is not None else None
        self.startup_timeout_s = float(startup_timeout_s)
        from kernelsearch.kernels import registry

        # Named modules must import in the child; those that only registered kernels in this
        # process are imported where they can be (trial_child._import_modules).
        self.kernel_modules = tuple(dict.fromkeys(kernel_modules))
        self.registered_modules = tuple(m for m in registry.plugin_modules()
                                        if m not in self.kernel_modules)
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.device_info: dict[str, Any] | None = None
        self.versions: dict[str, str] | None = None
        self.restarts = 0
        self._requested_workers = compile_workers
        self._pool: cf.ProcessPoolExecutor | None = None
        self._pool_procs: list[Any] = []
        self._pending: dict[tuple[str, str, str], cf.Future] = {}
        # One warm-up task per pool process; the pool is warm once all are done.
        self._warming: list[cf.Future] = []
        self._bandwidth: float | None | bool = False

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "TrialRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the child and the compile pool."""
        self._stop_child()
        self._drop_pool()

    def _stop_child(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        if self._proc is not None:
            self._proc.join(timeout=2)
            kill_group(self._proc)
        self._proc = self._conn = None

    def _kill_child(self) -> None:
        if self._proc is not None:
            kill_group(self._proc)
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        self._proc = self._conn = None
        self.restarts += 1

    def start(self) -> None:
        """Start the child now (otherwise the first trial starts it) and learn its device; on a
        GPU, also start the compile-ahead pool, whose workers then initialise in the background."""
        if self._proc is not None and self._proc.is_alive():
            return
        self._stop_child()
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child_main,
                                 args=(child, self.kernel_modules, os.getpid(), self.registered_modules),
                                 name="ks-trial-runner", daemon=True)
        proc.start()
        child.close()
        if not parent.poll(self.startup_timeout_s):
            kill_group(proc)
            raise RuntimeError(f"trial runner did not start within {self.startup_timeout_s:.0f} s")
        try:
            hello = parent.recv()
        except EOFError:
            proc.join(timeout=5)
            raise RuntimeError(f"trial runner died while starting (exit code {proc.exitcode})") from None
        self._proc, self._conn = proc, parent
        self.device_info = hello["device"]
        self.versions = hello["versions"]
        if self.compile_workers:
            self._start_pool()

    @property
    def trial_timeout_s(self) -> float:
        """The given limit, or the default of the child's device (a GPU's until it started)."""
        if self._trial_timeout_s is not None:
            return self._trial_timeout_s
        if self.device_info is not None and self.device_info.get("interpreter"):
            return INTERPRETER_TRIAL_TIMEOUT_S
        return GPU_TRIAL_TIMEOUT_S

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def on_gpu(self) -> bool:
        if self.device_info is None:
            self.start()
        return not bool(self.device_info and self.device_info.get("interpreter"))

    @property
    def device_name(self) -> str:
        if self.device_info is None:
            self.start()
        info = self.device_info
        if info is None:
            raise TrialCrash("the trial runner did not report its device")
        return str(info["name"])

    # -- compile ahead ---------------------------------------------------------------------
    @property
    def compile_workers(self) -> int:
        if not self.on_gpu and not self.compile_under_interpreter:
            return 0
        if self._requested_workers is not None:
            return self._requested_workers
        return max(1, min(16, (os.cpu_count() or 2) - 1))

    @property
    def compile_pool_started(self) -> bool:
        return self._pool is not None

    def _start_pool(self) -> cf.ProcessPoolExecutor:
        if self._pool is not None:
            return self._pool
        n = self.compile_workers
        before = set(mp.active_children())
        self._pool = cf.ProcessPoolExecutor(max_workers=n, mp_context=self._ctx,
                                            initializer=_compile_init,
                                            initargs=(self.kernel_modules, self.registered_modules))
        # The pool spawns a process per submitted task while none is idle: one task per worker
        # starts them all now, not one by one as configs arrive.
        self._warming = [self._pool.submit(_warm_worker) for _ in range(n)]
        # Those processes, known through multiprocessing's public list of this process's
        # children (the pool never replaces one), so that _drop_pool can kill a stuck one.
        self._pool_procs = [p for p in mp.active_children() if p not in before]
        return self._pool

    def _pool_warming(self) -> bool:
        """True while a process of the pool is still starting (imports, CUDA context, compiler)."""
        if self._pool is None:
            return False
        if self._warming and all(f.done() for f in self._warming):
            self._warming = []
        return bool(self._warming)

    def _drop_pool(self) -> None:
        pool, self._pool = self._pool, None
        procs, self._pool_procs = self._pool_procs, []
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            # A compile is only a hint: a worker stuck in one (a hanging compiler) must not
            # outlive the runner, nor hold up this interpreter's exit, which joins the pool.
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
        self._pending.clear()
        self._warming = []

    def prefetch(self, kernel: str, axes: Mapping[str, int], configs: Sequence[Mapping[str, Any]]) -> int:
        """Compile these configs in the background pool; returns how many were submitted."""
        if self.compile_workers == 0:
            return 0
        pool = self._start_pool()
        # A finished compile is only "no need to wait": forgetting it costs nothing.
        for k in [k for k, f in self._pending.items() if f.done()]:
            del self._pending[k]
        submitted = 0
        for cfg in configs:
            k = _key(kernel, axes, cfg)
            if k in self._pending:
                continue
            try:
                self._pending[k] = pool.submit(compile_config, kernel, dict(axes), dict(cfg))
            except cf.BrokenExecutor:
                self._drop_pool()
                return submitted
            submitted += 1
        return submitted

    def _wait_compiled(self, kernel: str, axes: Mapping[str, int], config: Mapping[str, Any]) -> float:
        fut = self._pending.pop(_key(kernel, axes, config), None)
        if fut is None or fut.cancel():
            # Not prefetched, or still queued behind other compiles: the child compiling it now,
            # beside the busy pool, is sooner than waiting for a free worker and then the compile.
            return 0.0
        if not fut.done() and self._pool_warming():
            # "Running" only means handed to the pool's call queue (the executor marks up to
            # max_workers + 1 tasks so, and cancel() then refuses): behind the warm-ups, no
            # worker has started it. Waiting would spend up to trial_timeout_s on the pool's
            # start; the child compiles it (a later pool compile only rewrites the cache entry).
            return 0.0
        t0 = time.perf_counter()
        try:
            fut.result(timeout=self.trial_timeout_s)
        except cf.BrokenExecutor:
            # A compiler crash took the pool down: the child will meet the same failure, typed.
            self._drop_pool()
        except Exception:  # a compile error: the child reports it as a typed failure
            pass
        return time.perf_counter() - t0

    # -- trials ----------------------------------------------------------------------------
    def run(self, kernel: str, axes: Mapping[str, int], config: Mapping[str, Any], *,
            measure_n: int = 30, seed: int = 0, timeout_s: float | None = None,
            cancel: Callable[[], bool] | None = None) -> TrialOutcome:
        """Validate, compile, check and measure one config; never raises for a bad candidate.
        While it waits, `cancel()` is asked every 0.2 s: once true, the child is killed and
        TrialCancelled raised (a cancelled job must not compute on for minutes)."""
        if measure_n < 1:
            raise ValueError("measure_n: need at least one timed call")
        wait = self._wait_compiled(kernel, axes, config)
        self.start()
        limit = float(timeout_s) if timeout_s is not None else self.trial_timeout_s
        req = {"op": "trial", "kernel": kernel, **_origin(kernel), "axes": dict(axes),
               "config": dict(config), "measure_n": int(measure_n), "seed": int(seed)}
        try:
            self._conn.send(req)
        except (BrokenPipeError, OSError):
            self._kill_child()
            self.start()
            self._conn.send(req)
        if not self._answered_within(limit, cancel):
            self._kill_child()
            if cancel is not None and cancel():
                raise TrialCancelled(f"{kernel} {dict(axes)}: trial stopped on request")
            return TrialOutcome.failure(FailureKind.TIMEOUT,
                                        f"trial exceeded {limit:g} s; runner process killed",
                                        compile_wait_s=wait)
        try:
            res = self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.exitcode if self._proc is not None else None
            if self._proc is not None:
                self._proc.join(timeout=5)
                code = self._proc.exitcode
            self._kill_child()
            return TrialOutcome.failure(FailureKind.CRASH,
                                        f"runner process died (exit code {code})",
                                        compile_wait_s=wait)
        out = TrialOutcome.from_dict(res)
        out.compile_wait_s = wait
        if out.failure_kind == FailureKind.CRASH.value:
            self._kill_child()
        return out

    def _answered_within(self, limit: float, cancel: Callable[[], bool] | None = None) -> bool:
        """Waits for the child's answer; True when it came within `limit` s of trial time, False
        at the limit or once `cancel()` is true. The clock stops while this runner's pool warms
        up (its workers compete with the child for the CPU), for at most startup_timeout_s: a
        trial never times out because the pool is starting."""
        t0 = time.monotonic()
        deadline = t0 + limit
        while self._pool_warming() and time.monotonic() - t0 < self.startup_timeout_s:
            if self._conn.poll(0.05):
                return True
            if cancel is not None and cancel():
                return False
            deadline = time.monotonic() + limit
        if cancel is None:
            return self._conn.poll(max(0.0, deadline - time.monotonic()))
        while True:
            left = deadline - time.monotonic()
            if self._conn.poll(max(0.0, min(left, _CANCEL_POLL_S))):
                return True
            if left <= _CANCEL_POLL_S or cancel():
                return False

    def _request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        self.start()
        self._conn.send(req)
        if not self._conn.poll(timeout_s):
            self._kill_child()
            raise TimeoutError(f"{req['op']}: no answer within {timeout_s:g} s")
        try:
            res = self._conn.recv()
        except EOFError:
            self._kill_child()
            raise RuntimeError(f"{req['op']}: runner process died") from None
        if not res.get("ok"):
            raise RuntimeError(f"{req['op']}: {res.get('error')}")
        return res

    def load_kernel(self, spec: Mapping[str, Any], timeout_s: float | None = None) -> None:
        """Import a captured kernel's module in the child (`CapturedKernel.child_spec()`), the
        one place a crash costs nothing: KernelModuleUnavailable when it cannot be imported
        there, KernelCodeFailed (the child replaced) when its import ended the child, raised
        what is not an Exception, or did not finish within `timeout_s` (the trial's limit);
        CaptureError (a ValueError) when the spec does not make a kernel."""
        from kernelsearch.kernels.capture import (CaptureError, KernelCodeFailed,
                                                  KernelModuleUnavailable)

        module = str(spec["definition"]["module"])
        limit = timeout_s if timeout_s is not None else self.trial_timeout_s
        self.start()
        try:
            self._conn.send({"op": "load", "child_spec": dict(spec)})
        except (BrokenPipeError, OSError):
            self._kill_child()
            self.start()
            self._conn.send({"op": "load", "child_spec": dict(spec)})
        if not self._conn.poll(limit):
            self._kill_child()
            raise KernelCodeFailed(module, f"did not finish importing within {limit:g} s")
        try:
            res = self._conn.recv()
        except (EOFError, OSError):
            code = None
            if self._proc is not None:
                self._proc.join(timeout=5)
                code = self._proc.exitcode
            self._kill_child()
            raise KernelCodeFailed(module, f"ended the process importing it: it "
                                           f"{how_it_ended(code)}") from None
        if res.get("ok"):
            return
        if "unavailable" in res:
            raise KernelModuleUnavailable(module, res["unavailable"])
        if "fatal" in res:
            self._kill_child()
            raise KernelCodeFailed(module, f"raised {res['fatal']} on import")
        raise CaptureError(f"capture: {res.get('error')}")

    def measure_reference(self, kernel: str, axes: Mapping[str, int], *, compiled: bool = False,
                          n: int = 30, timeout_s: float = 600.0) -> dict[str, Any]:
        """Timing of the PyTorch reference (eager, or torch.compile), measured as trials are."""
        return self._request({"op": "reference", "kernel": kernel, **_origin(kernel),
                              "axes": dict(axes), "compiled": compiled, "n": n},
                             timeout_s)["timing"]

    def copy_bandwidth(self) -> float | None:
        """Device copy bandwidth in bytes/s (None under the interpreter); measured once."""
        if self._bandwidth is False:
            self._bandwidth = None
            if self.on_gpu:
                self._bandwidth = float(self._request({"op": "bandwidth"}, 120.0)["value"])
        return self._bandwidth  # type: ignore[return-value]


__all__ = ["TrialRunner", "TrialOutcome", "TrialCancelled", "GPU_TRIAL_TIMEOUT_S",
           "INTERPRETER_TRIAL_TIMEOUT_S", "compile_config", "die_with_parent", "how_it_ended"]
