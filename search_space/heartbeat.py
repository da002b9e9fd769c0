"""Heartbeats for the trials a tuner has in flight, so a dead worker's RUNNING trial is found
stale and failed; Optuna records them only inside `optimize()`, never for ask/tell."""
from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


class Heartbeat:
    """Records heartbeats for the trials in flight (ask/tell does not do it for us)."""

    def __init__(self, storage: Any, interval_s: float | None):
        # interval None: a storage without heartbeats (in memory); nothing to record.
        self.storage, self.interval_s = storage, interval_s
        self.trial_ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ks-heartbeat", daemon=True)
        if interval_s is not None:
            self._thread.start()

    def add(self, trial_id: int) -> None:
        with self._lock:
            self.trial_ids.add(trial_id)
        if self.interval_s is not None:
            self.storage.record_heartbeat(trial_id)

    def remove(self, trial_id: int) -> None:
        with self._lock:
            self.trial_ids.discard(trial_id)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s or 1.0):
            with self._lock:
                ids = list(self.trial_ids)
            for tid in ids:
                try:
                    self.storage.record_heartbeat(tid)
                except Exception as exc:  # a database hiccup must not kill the tuning loop
                    log.warning("heartbeat for trial %s failed: %s", tid, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
