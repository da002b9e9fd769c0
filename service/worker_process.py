"""`kernelsearch serve`'s worker as a child process: tuning (Optuna's samplers, the store's
writes, the trial runner's pipes) then never shares the API process's GIL or connection pool, so
lookups do not queue behind it. The child is a `kernelsearch worker` (a WorkerRunner, as every
worker is), given the app's settings through KS_* variables and told that `serve` checked the
schema already, restarted if it dies, and stopped with SIGTERM (it hands its job back to the
queue) when the app stops.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from pydantic import SecretStr

from .settings import Settings

log = logging.getLogger(__name__)

RESTART_DELAY_S = 2.0
# The hidden `kernelsearch worker` flag by which `serve` tells its worker child that it checked
# the schema already.
SCHEMA_CHECKED_FLAG = "--schema-checked"


def settings_env(settings: Settings) -> dict[str, str]:
    """The KS_* variables that give a child process these settings."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value: Any = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, (list, dict)):
            value = json.dumps(value)
        env[f"KS_{name.upper()}"] = str(value)
    return env


class WorkerProcess:
    """One `kernelsearch worker` child, kept running until stop()."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.command = [sys.executable, "-m", "kernelsearch.service.cli", "worker",
                        SCHEMA_CHECKED_FLAG]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch = threading.Thread(target=self._watch_loop, name="ks-worker-watch", daemon=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> "WorkerProcess":
        self._spawn()
        self._watch.start()
        return self

    def _spawn(self) -> None:
        from kernelsearch.search_space.runner import die_with_parent

        env = {**os.environ, **settings_env(self.settings)}
        with self._lock:
            if self._stop.is_set():
                return
            # Its own session: a terminal's Ctrl-C reaches the API process only, which stops the
            # child with SIGTERM (its job handed back), instead of interrupting it mid-import; and
            # SIGTERM when the API process dies, even by SIGKILL.
            self.proc = subprocess.Popen(
                self.command, env=env, start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, os.getpid()))
            self.starts += 1
        log.info("worker process %d started", self.proc.pid)

    def _watch_loop(self) -> None:
        while not self._stop.is_set():
            proc = self.proc
            if proc is None or proc.poll() is None:
                self._stop.wait(0.5)
                continue
            log.warning("worker process %d exited with %s; restarting in %g s", proc.pid,
                        proc.returncode, RESTART_DELAY_S)
            if self._stop.wait(RESTART_DELAY_S):
                return
            self._spawn()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the current trial outlasts trial_timeout_s + 10 s."""
        from kernelsearch.search_space.runner import INTERPRETER_TRIAL_TIMEOUT_S

        with self._lock:
            self._stop.set()
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait((self.settings.trial_timeout_s or INTERPRETER_TRIAL_TIMEOUT_S) + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
