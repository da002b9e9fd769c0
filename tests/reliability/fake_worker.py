"""A worker process whose jobs may use the test-only misbehaving kernel (ks_fake_kernels).

`kernelsearch worker` knows only the shipped kernels; this runs the same `service.worker.Worker`
loop with the fake kernel registered here and in its trial child, and a search space for it whose
MODE choices come from KS_FAKE_MODES (e.g. "crash,hang,ok"). SIGTERM stops it like the CLI.
KS_FAKE_KILL_AT_SUMMARY=N makes it SIGKILL itself (and its trial child) when it is about to
store its N-th trial summary: after Optuna recorded that trial, before the history row.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "search_space"))

import ks_fake_kernels  # noqa: E402  (registers the kernel in this process)

import kernelsearch.search_space.tuner as tuner  # noqa: E402
from kernelsearch.db.store import Store  # noqa: E402
from kernelsearch.search_space.space import SearchSpace  # noqa: E402
from kernelsearch.service.settings import Settings  # noqa: E402
from kernelsearch.service.worker import Worker, worker_store  # noqa: E402


def _kill_at_summary(n: int) -> None:
    real = Store.add_trial_summary
    calls = 0

    def add_trial_summary(self: Store, *args, **kwargs) -> None:
        nonlocal calls
        calls += 1
        if calls == n:
            print(f"fake worker: SIGKILL before trial summary {n}", flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        real(self, *args, **kwargs)

    Store.add_trial_summary = add_trial_summary


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    modes = os.environ.get("KS_FAKE_MODES", "ok").split(",")
    space = SearchSpace.from_dict({
        "kernel": ks_fake_kernels.NAME,
        "param": [{"name": "MODE", "choices": modes},
                  {"name": "BLOCK", "choices": [16], "ordinal": True}],
    }, ks_fake_kernels.KERNEL)
    real_get_space = tuner.get_space
    tuner.get_space = lambda k: space if k == ks_fake_kernels.NAME else real_get_space(k)

    if os.environ.get("KS_FAKE_KILL_AT_SUMMARY"):
        _kill_at_summary(int(os.environ["KS_FAKE_KILL_AT_SUMMARY"]))
    settings = Settings()
    store = worker_store(settings)
    worker = Worker(settings, store, kernel_modules=("ks_fake_kernels",))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"fake worker {worker.owner} runner pid follows", flush=True)
    try:
        worker.run_forever(stop)
    finally:
        store.close()


if __name__ == "__main__":
    main()
