"""A child process's lifetime: killed with its parent (`die_with_parent`), the processes it
started killed with it (`guard_group`, `kill_group`), and its end in words (`how_it_ended`)."""
from __future__ import annotations

import os
import signal
import sys
from typing import Any


def _load_libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc: a child outlives a parent killed by SIGKILL
        return None


# Loaded at import, not in a forked child: between fork and exec only a plain C call is safe.
_LIBC = _load_libc()
_PR_SET_PDEATHSIG = 1


def how_it_ended(exitcode: int | None) -> str:
    """A child process's end in words: its exit code, or the signal that killed it."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def die_with_parent(sig: int, parent_pid: int) -> None:
    """Have the kernel send `sig` to this process when its parent dies, even by SIGKILL (Linux's
    parent-death signal), then make sure the parent is still `parent_pid`: one that died before
    the call would never signal. Safe between fork and exec. The "parent" is the thread that
    started the process, so a child must be started from a thread that lives as long as it."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def guard_group() -> None:
    """Call first thing in a child that leads its own process group: fork a guard that kills the
    whole group once this process dies, however (a parent-death signal when the worker is killed
    with SIGKILL, a crash, a normal exit), so that what the code run here started never outlives
    it. The guard holds no descriptor of ours, so a pipe to the parent still closes with us."""
    leader = os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        return
    try:
        os.closerange(3, 1 << 16)
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGUSR1))
        if os.getppid() == leader:
            signal.sigwait({signal.SIGUSR1})
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def kill_group(proc: Any) -> None:
    """Kill a multiprocessing child that leads its own process group (it called os.setsid()),
    with every process still in that group: what the code it ran started and left behind (a
    process that left the group itself escapes). Then reap the child. A child killed before its
    setsid() has started nothing: it is killed alone."""
    if proc.pid is None:
        return
    try:
        # While a process is in the group, Linux gives no other process the group's id.
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.is_alive():
        proc.kill()
    proc.join(5)


__all__ = ["die_with_parent", "guard_group", "how_it_ended", "kill_group"]
