"""The one way a worker runs, wherever it runs.

`WorkerRunner` owns a Worker and its store and runs it until told to stop. Three places start
one and differ only in where it runs: the API's embedded worker (`WorkerThread`, a thread in the
API process, which also gets the API's answer-cache invalidation, since it shares that
process), `kernelsearch serve`'s default worker (worker_process.WorkerProcess, a child process
running `kernelsearch worker`) and `kernelsearch worker` itself (the runner in the command's own
process). Trials run in the runner's TrialRunner child whichever it is.
"""
from __future__ import annotations

import threading
from typing import Callable

from kernelsearch.db.interfaces import WorkerStore

from .metrics import Metrics
from .settings import Settings
from .worker import Worker, worker_store


class WorkerRunner:
    """A Worker over its store (its own pool unless given one), run until a stop event is set;
    closes the trial runner, and the store it opened, when it returns."""

    def __init__(self, settings: Settings, *, store: WorkerStore | None = None,
                 metrics: Metrics | None = None,
                 on_records_changed: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self._own_store = store is None
        self.store = worker_store(settings) if store is None else store
        self.worker = Worker(settings, self.store, metrics=metrics,
                             on_records_changed=on_records_changed)

    @property
    def owner(self) -> str:
        return self.worker.owner

    def run_forever(self, stop: threading.Event) -> None:
        """Claim and run jobs until `stop` is set; a running job stops after its trial and goes
        back to the queue."""
        try:
            self.worker.run_forever(stop)
        finally:
            self.close()

    def run_one(self, stop: threading.Event) -> bool:
        """Run at most one job (False when none was queued); `stop` ends it early."""
        self.worker.stop_event = stop
        try:
            return self.worker.run_one()
        finally:
            self.close()

    def close(self) -> None:
        self.worker.close()
        if self._own_store:
            self.store.close()


class WorkerThread:
    """Runs a WorkerRunner in a thread of this process until stop()."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=runner.run_forever, args=(self._stop,),
                                        name="ks-worker", daemon=True)

    def start(self) -> "WorkerThread":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the current trial, waiting for it up to trial_timeout_s + 10 s (no limit
        set: the longest default)."""
        from kernelsearch.search_space.runner import INTERPRETER_TRIAL_TIMEOUT_S

        self._stop.set()
        limit = self.runner.settings.trial_timeout_s or INTERPRETER_TRIAL_TIMEOUT_S
        self._thread.join(limit + 10)
