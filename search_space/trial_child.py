"""The trial child's side of the runner: the process that validates, compiles, checks and
measures each config it is sent (`_child_main`), and what it and the compile pool share."""
from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from typing import Any, Mapping, Sequence

from kernelsearch.kernels.errors import FailureKind
from kernelsearch.kernels.registry import resolve
from kernelsearch.kernels.runtime import runtime_of

from .process_lifetime import die_with_parent, guard_group
from .trial_outcome import TrialOutcome

log = logging.getLogger(__name__)


def _kernel_of(req: Mapping[str, Any]) -> Any:
    """The kernel a request names, in the child (made from its spec when it carries one)."""
    spec = req.get("child_spec")
    if spec is not None:
        from kernelsearch.kernels.capture import kernel_from_spec

        return kernel_from_spec(spec)
    return resolve(req["kernel"], req.get("module"))


def _import_modules(modules: Sequence[str], optional: Sequence[str] = ()) -> None:
    """See the parent's kernels: the registry's plugins, then the modules the parent named (a
    module that fails raises a PluginLoadError naming it), then those that merely registered
    kernels there (`optional`): one this child cannot import (the parent loaded it from a path
    it no longer has) costs its own kernels here, logged, never the child and every other job."""
    from kernelsearch.kernels import registry

    registry.load_plugins()
    for m in modules:
        registry.load_module(m)
    for m in optional:
        if m in modules:
            continue
        try:
            registry.load_module(m)
        except registry.PluginLoadError as exc:
            log.warning("trial child: %s; its kernels do not run here", exc)


def _run_trial(req: Mapping[str, Any], cache: Any) -> dict[str, Any]:
    import torch

    from kernelsearch.kernels.check import check_config
    from kernelsearch.kernels.device import default_device
    from kernelsearch.kernels.errors import InvalidConfig, WrongResult, classify
    from kernelsearch.kernels.measure import measure_config

    kernel = _kernel_of(req)
    axes = req["axes"]
    device = default_device()
    seed = int(req.get("seed", 0))
    out = TrialOutcome(ok=False)
    phase = "validate"
    try:
        cfg = kernel.validate_config(req["config"])
        axes = kernel.validate_axes(axes)
        phase = "compile"
        inputs = cache.get(kernel, axes, seed, "benchmark", device).inputs
        t0 = time.perf_counter()
        kernel.launch(*inputs, config=cfg)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.compile_s = time.perf_counter() - t0
        stats = runtime_of(kernel).compiled_stats()
        out.n_regs = stats.get("n_regs")
        out.n_spills = stats.get("n_spills")
        out.shared_bytes = stats.get("shared_bytes")
        out.compiled = _compiled_ref(runtime_of(kernel).last_compiled)
        phase = "check"
        t0 = time.perf_counter()
        res = check_config(kernel, axes, cfg, device=device, seed=seed + 1, cache=cache)
        out.check_s = time.perf_counter() - t0
        out.rel_errors = dict(res.errors)
        if not res.ok:
            raise WrongResult(res.detail)
        phase = "measure"
        t0 = time.perf_counter()
        timing = measure_config(kernel, axes, cfg, n=int(req.get("measure_n", 30)),
                                seed=seed, device=device, inputs=inputs)
        out.measure_s = time.perf_counter() - t0
        out.timing = timing.as_dict()
        out.ok = True
    except InvalidConfig as exc:
        out.failure_kind, out.message = FailureKind.INVALID_CONFIG.value, str(exc)
    except Exception as exc:  # every failure of a candidate becomes a typed outcome
        typed = classify(exc)
        out.failure_kind = typed.kind.value
        out.message = f"{phase}: {typed}"
        if _out_of_memory(exc):
            out.message = (f"{phase}: out of host memory: a trial child may hold "
                           f"{memory_bound()} bytes of data ({MEMORY_ENV}): {typed}")
        log.debug("trial failed in %s: %s", phase, traceback.format_exc())
    if out.failure_kind != FailureKind.CRASH.value:
        # The next trial reuses these inputs only if this one left them as they were drawn.
        try:
            cache.verify()
        except Exception as exc:  # the device no longer answers: this child must be replaced
            cache.clear()
            out.ok, out.timing = False, {}
            out.failure_kind = FailureKind.CRASH.value
            out.message = f"after {phase}: {classify(exc)}"
    return out.as_dict()


def _load(req: Mapping[str, Any]) -> dict[str, Any]:
    """Import a captured kernel's module here (TrialRunner.load_kernel): what became of it."""
    from kernelsearch.kernels.capture import KernelModuleUnavailable, kernel_from_spec

    try:
        kernel_from_spec(req["child_spec"])
    except KernelModuleUnavailable as exc:
        return {"ok": False, "unavailable": exc.why}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a module ends the job, not us
        return {"ok": False, "fatal": f"{type(exc).__name__}: {exc}"}
    return {"ok": True}


def _run_reference(req: Mapping[str, Any]) -> dict[str, Any]:
    from kernelsearch.kernels.measure import measure_reference

    kernel = _kernel_of(req)
    t = measure_reference(kernel, req["axes"], compiled=bool(req.get("compiled")),
                          n=int(req.get("n", 30)))
    return t.as_dict()


def _tiny_launch() -> None:
    """One launch of the flush kernel on one element, as measure._flush launches it: creates the
    CUDA context and loads Triton's driver and compiler (a disk-cache load after the first time)."""
    import torch

    from kernelsearch.kernels.device import default_device
    from kernelsearch.kernels.measure import _ks_l2_flush

    device = default_device()
    buf = torch.empty(1, dtype=torch.float32, device=device)
    _ks_l2_flush[(1,)](buf, 1, 0.0, BLOCK=4096, num_warps=8)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _warm_child() -> None:
    """So that the first trial's timeout is spent on its config. A failure here is left to the
    trials, which report it typed."""
    try:
        _tiny_launch()
    except Exception as exc:
        log.warning("trial runner warm-up failed: %s", exc)


# The trial child's data bound in bytes (a field of the server's Settings; read from the
# environment here, which the child inherits from its worker: search_space imports no service).
MEMORY_ENV = "KS_TRIAL_MAX_MEMORY_BYTES"


def memory_bound() -> int:
    """KS_TRIAL_MAX_MEMORY_BYTES, else 3/4 of the host's physical memory: a candidate that
    allocates more fails its trial instead of taking the host's memory from the worker and
    every other process on it."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text:
        try:
            if int(text) > 0:
                return int(text)
        except ValueError:
            pass
        log.warning("%s=%r is not a positive integer; using 3/4 of physical memory", MEMORY_ENV, text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4


def limit_memory(limit: int | None = None) -> int | None:
    """Bound this process's data with RLIMIT_DATA (`memory_bound()` by default): the limit set,
    or None where the platform has none.

    RLIMIT_DATA, not RLIMIT_AS: CUDA reserves virtual address space far beyond the host's
    memory (the unified address range, per device; inaccessible PROT_NONE mappings) and fails
    to initialise under an address-space bound a few times physical memory, while RLIMIT_DATA
    (Linux >= 4.7) counts only private writable memory: the heap and anonymous mappings a
    candidate's host allocations are made of (torch's CPU tensors, numpy, Python objects),
    never those reservations nor device memory. No cgroup is needed, so it holds for a worker
    run without privileges in a container. An allocation past it fails (MemoryError, torch's
    "can't allocate memory"), which fails the trial, not the worker."""
    import resource

    bound = memory_bound() if limit is None else limit
    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            bound = min(bound, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (bound, hard))
    except (ValueError, OSError, AttributeError) as exc:
        log.warning("trial child: memory not bounded: %s", exc)
        return None
    return bound


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "can't allocate memory" in str(exc) \
        or "Cannot allocate memory" in str(exc)


def _child_main(conn: Any, modules: Sequence[str], parent_pid: int | None = None,
                optional: Sequence[str] = ()) -> None:
    """Serve requests until the pipe closes; a crash-kind failure ends the process (poisoned GPU).
    Killed with its parent: a worker killed mid-trial takes its trial (and a hung kernel's
    process and device memory) with it, instead of leaving it to run with nobody to end it.
    Leads its own session, so the runner kills what a kernel's code started with it. Its memory
    is bounded (`limit_memory`) before any kernel module is imported."""
    os.setsid()
    guard_group()
    if parent_pid is not None:
        die_with_parent(signal.SIGKILL, parent_pid)
    limit_memory()
    _import_modules(modules, optional)
    from kernelsearch.kernels.check import InputCache
    from kernelsearch.kernels.device import device_info, versions

    _warm_child()
    cache = InputCache()
    conn.send({"op": "ready", "pid": os.getpid(), "device": device_info(),
               "versions": versions()})
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        op = req.get("op")
        try:
            if op == "trial":
                res = _run_trial(req, cache)
                conn.send(res)
                if res.get("failure_kind") == FailureKind.CRASH.value:
                    return  # the CUDA context may be poisoned: let the parent start a fresh one
            elif op == "load":
                answer = _load(req)
                conn.send(answer)
                if "fatal" in answer:
                    return  # a module that raised SystemExit may have left anything behind
            elif op == "reference":
                conn.send({"ok": True, "timing": _run_reference(req)})
            elif op == "bandwidth":
                from kernelsearch.kernels.measure import copy_bandwidth

                conn.send({"ok": True, "value": copy_bandwidth()})
            else:
                conn.send({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:
            conn.send({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def _compiled_ref(handle: Any) -> dict[str, Any] | None:
    """kernels.compiled.compiled_ref, never failing the trial (its group is an extra)."""
    from kernelsearch.kernels.compiled import compiled_ref

    try:
        return compiled_ref(handle)
    except Exception as exc:
        log.debug("compiled kernel not kept: %s", exc)
        return None
