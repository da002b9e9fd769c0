"""Optuna's storage on the store's database, with the store's retry policy on every call.

Optuna wraps a dropped connection in StorageInternalError and gives up; a worker tuning through
a database restart would fail its job. `RetryingStorage` wraps any Optuna `BaseStorage` by
composition (the shape of Optuna's own `_CachedStorage`) and retries each call as a whole on a
transient failure (`engine.is_transient`) with `engine.retrying`'s backoff and log lines.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import optuna
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from .engine import engine_kwargs, retrying

if TYPE_CHECKING:
    from optuna._typing import JSONSerializable
    from optuna.distributions import BaseDistribution
    from optuna.study._frozen import FrozenStudy
    from optuna.study._study_direction import StudyDirection

log = logging.getLogger(__name__)

T = TypeVar("T")


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """An Optuna storage whose calls are retried on transient database failures for up to
    `retry_s` seconds each. A state change whose commit reached the server before the connection
    dropped is not an error on its retry: the trial already has that state.

    `backend` is the wrapped storage; `rdb` the RDBStorage under it, if any (its engine and
    sessions, for SQLAlchemy event listeners such as a lease fence). Optuna uses a non-RDB storage as given, so wrap a
    `_CachedStorage` (as `open_optuna_storage` does) to keep Optuna's trial cache."""

    def __init__(self, backend: BaseStorage, *, retry_s: float = 30.0,
                 rdb: RDBStorage | None = None) -> None:
        self.backend = backend
        self.retry_s = retry_s
        self.rdb = rdb

    def _retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return retrying(self.retry_s)(fn, *args, **kwargs)

    # -- studies ---------------------------------------------------------------------------
    def create_new_study(self, directions: Sequence[StudyDirection],
                         study_name: str | None = None) -> int:
        return self._retry(self.backend.create_new_study, directions, study_name=study_name)

    def delete_study(self, study_id: int) -> None:
        self._retry(self.backend.delete_study, study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._retry(self.backend.set_study_user_attr, study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: JSONSerializable) -> None:
        self._retry(self.backend.set_study_system_attr, study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._retry(self.backend.get_study_id_from_name, study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._retry(self.backend.get_study_name_from_id, study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._retry(self.backend.get_study_directions, study_id)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._retry(self.backend.get_study_user_attrs, study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._retry(self.backend.get_study_system_attrs, study_id)

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._retry(self.backend.get_all_studies)

    # -- trials ----------------------------------------------------------------------------
    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return self._retry(self.backend.create_new_trial, study_id, template_trial)

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float,
                        distribution: BaseDistribution) -> None:
        self._retry(self.backend.set_trial_param, trial_id, param_name, param_value_internal,
                    distribution)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return self._retry(self.backend.get_trial_id_from_study_id_trial_number, study_id,
                           trial_number)

    def get_trial_number_from_id(self, trial_id: int) -> int:
        return self._retry(self.backend.get_trial_number_from_id, trial_id)

    def get_trial_param(self, trial_id: int, param_name: str) -> float:
        return self._retry(self.backend.get_trial_param, trial_id, param_name)

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Sequence[float] | None = None) -> bool:
        attempts = 0

        def once() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                return self.backend.set_trial_state_values(trial_id, state=state, values=values)
            except optuna.exceptions.UpdateFinishedTrialError:
                if attempts > 1 and self.backend.get_trial(trial_id).state == state:
                    return True
                raise

        return self._retry(once)

    def set_trial_intermediate_value(self, trial_id: int, step: int,
                                     intermediate_value: float) -> None:
        self._retry(self.backend.set_trial_intermediate_value, trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._retry(self.backend.set_trial_user_attr, trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: JSONSerializable) -> None:
        self._retry(self.backend.set_trial_system_attr, trial_id, key, value)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        return self._retry(self.backend.get_trial, trial_id)

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return self._retry(self.backend.get_all_trials, study_id, deepcopy=deepcopy, states=states)

    def get_n_trials(self, study_id: int,
                     state: tuple[TrialState, ...] | TrialState | None = None) -> int:
        return self._retry(self.backend.get_n_trials, study_id, state)

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        return self._retry(self.backend.get_best_trial, study_id)

    def get_trial_params(self, trial_id: int) -> dict[str, Any]:
        return self._retry(self.backend.get_trial_params, trial_id)

    def get_trial_user_attrs(self, trial_id: int) -> dict[str, Any]:
        return self._retry(self.backend.get_trial_user_attrs, trial_id)

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        return self._retry(self.backend.get_trial_system_attrs, trial_id)

    def remove_session(self) -> None:
        self.backend.remove_session()

    def check_trial_is_updatable(self, trial_id: int, trial_state: TrialState) -> None:
        self.backend.check_trial_is_updatable(trial_id, trial_state)

    # -- heartbeats (none when the backend keeps none) -------------------------------------
    def record_heartbeat(self, trial_id: int) -> None:
        if isinstance(self.backend, BaseHeartbeat):
            self._retry(self.backend.record_heartbeat, trial_id)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        if not isinstance(self.backend, BaseHeartbeat):
            return []
        return self._retry(self.backend._get_stale_trial_ids, study_id)

    def get_heartbeat_interval(self) -> int | None:
        return self.backend.get_heartbeat_interval() if isinstance(self.backend, BaseHeartbeat) else None

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        if not isinstance(self.backend, BaseHeartbeat):
            return None
        return self.backend.get_heartbeat_stale_trial_callback()


def open_optuna_storage(url: str, *, heartbeat_s: int = 10, grace_s: int | None = None,
                        retry_s: float = 30.0) -> RetryingStorage:
    """Optuna's RDB storage of `url` with heartbeats, so a dead worker's RUNNING trial is failed
    and retried; with the store's engine options (pre-ping, keepalives, connect timeout), Optuna's
    trial cache, and each call retried on a transient failure for up to `retry_s` seconds."""
    return retrying(retry_s)(_open, url, heartbeat_s, grace_s, retry_s)


def _open(url: str, heartbeat_s: int, grace_s: int | None, retry_s: float) -> RetryingStorage:
    from sqlalchemy import event
    from sqlalchemy.exc import DBAPIError

    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                rdb = RDBStorage(
                    url, engine_kwargs=engine_kwargs(url), heartbeat_interval=heartbeat_s,
                    grace_period=grace_s if grace_s is not None else 3 * heartbeat_s,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3))
            if rdb.engine.dialect.name == "sqlite" and rdb.engine.url.database not in (None, "", ":memory:"):
                # The store's own setting (db.engine): WAL without an fsync per commit. A trial
                # commits a dozen times (params, attributes, tell); that fsync was ~12% of the
                # tuner's per-trial bookkeeping on a SQLite file.
                event.listen(rdb.engine, "connect", _sqlite_wal_normal)
                rdb.engine.dispose()  # connections opened before the listener are dropped
            return RetryingStorage(optuna.storages._CachedStorage(rdb), retry_s=retry_s, rdb=rdb)
        except DBAPIError:
            # Two workers opening a fresh database race to create Optuna's tables ("table
            # trial_heartbeats already exists"); the loser finds them made on the next try.
            if attempt == 2:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _sqlite_wal_normal(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.close()


__all__ = ["RetryingStorage", "open_optuna_storage"]
