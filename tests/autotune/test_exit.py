"""A user's program ends cleanly: `drain` (run at exit) waits for background work and for its
threads to end, so no daemon thread is still freeing what the work held (a share check's
tensors, in torch's C++) while the interpreter finalises. One that was aborted the process
("terminate called without an active exception", exit code 134) in 3 of 10 runs of a small
script that tuned two keys against a service."""
from __future__ import annotations

import threading
import time

from kernelsearch.backends import Backends


class _SlowToFree:
    """Stands for what a background task holds: freeing it takes a while, as a tensor's may."""

    def __init__(self, freed: threading.Event) -> None:
        self.freed = freed

    def __del__(self) -> None:
        time.sleep(0.3)
        self.freed.set()


def test_drain_returns_once_background_threads_have_freed_what_they_held() -> None:
    b = Backends()
    freed = threading.Event()
    b.in_background(lambda held=_SlowToFree(freed): time.sleep(0.1))  # only the work holds it
    b.drain(10.0)
    assert freed.is_set()
    assert b.idle()


def test_drain_inside_background_work_does_not_wait_for_itself() -> None:
    b = Backends()
    done = threading.Event()

    def work() -> None:
        b.drain(0.5)
        done.set()

    b.in_background(work)
    b.drain(10.0)
    assert done.is_set()
