"""A job's code run in a disposable child process, never in the worker's own.

A job that runs user code outside the trial child (a Helion job: the kernel's module imported,
Helion's autotuner run) runs it here: one child per job, forked from a fork server that has
torch (and Helion, where installed) imported already, so a job starts in about a second. Whatever
the code does (SystemExit or KeyboardInterrupt from a module, os._exit, a segfault, a signal, a
hang) ends the child, never the worker: the caller gets `JobChildFailed` saying how it ended. A
stop request or the wall-clock limit kills the child.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from typing import Any, Callable

from kernelsearch.search_space.runner import die_with_parent, how_it_ended

_POLL_S = 0.2
_PRELOAD = ["torch", "helion"]  # a module that is not installed is skipped by the fork server


class JobChildFailed(Exception):
    """The child ended without an answer, or its code raised what is not an Exception; the
    message says how (exit code, signal, the exception)."""


class JobChildStopped(Exception):
    """The child was killed: the caller asked to stop, or the wall-clock limit passed."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _child(conn: Any, env: dict[str, str], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    die_with_parent(signal.SIGKILL, os.getppid())
    # The fork server's environment is the one it started with: the caller's, as it is now.
    os.environ.clear()
    os.environ.update(env)
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
    ctx = _context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, dict(os.environ), fn, args), name="ks-job-child")
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
        if proc.is_alive():
            proc.kill()
        proc.join(5)


__all__ = ["JobChildFailed", "JobChildStopped", "run_in_child"]
