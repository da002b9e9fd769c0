"""A job's code run in a disposable child process, never in the worker's own.

A job that runs user code outside the trial child (a Helion job: the kernel's module imported,
Helion's autotuner run; a search job) runs it here: one child per job, started with `spawn`, a
fresh interpreter. Not forked: torch marks every child forked after a CUDA probe in its parent
(`torch.cuda.is_available()`, `device_count()`, which importing Helion or Triton may call) as a
"bad fork" that cannot use CUDA, so a fork server that preloads them gives GPU jobs children that
all fail. Whatever the code does (SystemExit or KeyboardInterrupt from a module, os._exit, a
segfault, a signal, a hang) ends the child, never the worker: the caller gets `JobChildFailed`
saying how it ended. The child leads its own session and process group, so a terminal's or
group's signal never reaches the worker through it, and the processes its code started are
killed with it: when it answers, fails, is stopped or runs past the wall-clock limit, and when
the worker is killed (the child dies with it, and its group with the child).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any, Callable, Final

from kernelsearch.search_space.process_lifetime import die_with_parent, guard_group, how_it_ended, kill_group

_POLL_S = 0.2
START_METHOD: Final = "spawn"


class JobChildFailed(Exception):
    """The child ended without an answer, or its code raised what is not an Exception; the
    message says how (exit code, signal, the exception)."""


class JobChildStopped(Exception):
    """The child was killed: the caller asked to stop, or the wall-clock limit passed."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _child(conn: Any, parent_pid: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.setsid()
    guard_group()
    die_with_parent(signal.SIGKILL, parent_pid)
    try:
        out: tuple[str, Any] = ("ok", fn(*args))
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a module ends the job, not us
        out = ("raised", f"{type(exc).__name__}: {exc}")
    try:
        conn.send(out)
    finally:
        conn.close()


def run_in_child(fn: Callable[..., Any], *args: Any, stop: Callable[[], bool] | None = None,
                 limit_s: float | None = None) -> Any:
    """`fn(*args)` in a fresh child process (`fn` a module-level function, its arguments and
    answer picklable); what it returns, or JobChildFailed / JobChildStopped. An Exception `fn`
    raises is its answer's business: catch it there and return it as data."""
    ctx = mp.get_context(START_METHOD)
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, os.getpid(), fn, args), name="ks-job-child")
    proc.start()
    child.close()
    deadline = None if limit_s is None else time.monotonic() + limit_s
    try:
        while not parent.poll(_POLL_S):
            if not proc.is_alive() and not parent.poll(0):
                break
            if stop is not None and stop():
                raise JobChildStopped("stopped on request; its child process was killed",
                                      timed_out=False)
            if deadline is not None and time.monotonic() >= deadline:
                raise JobChildStopped(f"ran past {limit_s:g} s; its child process was killed",
                                      timed_out=True)
        else:
            try:
                kind, value = parent.recv()
            except (EOFError, OSError):
                pass
            else:
                if kind == "ok":
                    return value
                raise JobChildFailed(f"raised {value}")
        proc.join(5)
        raise JobChildFailed(f"{how_it_ended(proc.exitcode)} before answering")
    finally:
        parent.close()
        kill_group(proc)


__all__ = ["JobChildFailed", "JobChildStopped", "START_METHOD", "run_in_child"]
