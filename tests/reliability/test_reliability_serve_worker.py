"""`kernelsearch serve`'s worker is a child process by default (so lookups never queue behind
tuning): a child that dies is started again, and the child goes when the API process is
SIGKILLed (it never outlives it as an orphan tuning jobs)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ks_stack import free_port, kernelsearch_exe, wait_healthy
from rel_faults import Procs, print_figures, wait_for

pytestmark = [pytest.mark.slow]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _workers(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in cmd and b"kernelsearch.service.cli" in cmd:
            found.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(240)
def test_serve_restarts_its_worker_process_and_takes_it_down_with_it(sqlite_url, tmp_path):
    from kernelsearch.db.engine import upgrade

    upgrade(sqlite_url)
    procs = Procs(tmp_path, {"KS_DATABASE_URL": sqlite_url})
    try:
        port = free_port()
        serve = procs.start("serve", [kernelsearch_exe(), "serve", "--port", str(port)])
        wait_healthy(f"http://127.0.0.1:{port}", serve)
        (first,) = wait_for(lambda: _workers(serve.popen.pid), 60, "the worker child", procs)
        os.kill(first, signal.SIGKILL)
        t0 = time.monotonic()
        (second,) = wait_for(lambda: [p for p in _workers(serve.popen.pid) if p != first], 60,
                             "a new worker child", procs)
        restarted_s = time.monotonic() - t0
        os.kill(serve.popen.pid, signal.SIGKILL)
        serve.popen.wait(30)
        t1 = time.monotonic()
        wait_for(lambda: not _alive(second), 60, "the worker child to follow its parent", procs)
        print_figures("serve's worker process", {
            "first child": first, "restarted as": second, "restart (s)": round(restarted_s, 1),
            "child gone after the parent's SIGKILL (s)": round(time.monotonic() - t1, 1),
        })
    finally:
        procs.close()
