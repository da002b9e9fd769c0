"""db.optuna_storage: Optuna's storage calls retried on transient database failures, by
composition over a real Optuna storage that drops its connection N times."""
from __future__ import annotations

import logging
from typing import Any

import optuna
import pytest
from optuna.storages import InMemoryStorage
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState
from sqlalchemy import exc

from kernelsearch.db.optuna_storage import RetryingStorage, open_optuna_storage


def _dropped() -> optuna.exceptions.StorageInternalError:
    """What Optuna raises when the server closed the connection: the driver's error as cause."""
    try:
        raise exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
    except exc.OperationalError as cause:
        err = optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
        err.__cause__ = cause
        return err


class Flaky(InMemoryStorage):
    """Optuna's in-memory storage whose named calls fail `fail` times (transient) before working;
    `after=True` fails them after the call took effect (a commit whose answer was lost)."""

    def __init__(self, names: set[str], fail: int, *, after: bool = False,
                 error: Exception | None = None) -> None:
        super().__init__()
        self.names, self.left, self.after, self.error = names, fail, after, error
        self.calls: dict[str, int] = {}

    def _maybe_fail(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.names and self.left > 0:
            self.left -= 1
            raise self.error or _dropped()

    def get_all_trials(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("get_all_trials")
        return super().get_all_trials(*args, **kwargs)

    def set_trial_user_attr(self, *args: Any, **kwargs: Any) -> None:
        self._maybe_fail("set_trial_user_attr")
        super().set_trial_user_attr(*args, **kwargs)

    def set_trial_state_values(self, *args: Any, **kwargs: Any) -> bool:
        if self.after:
            done = super().set_trial_state_values(*args, **kwargs)
            self._maybe_fail("set_trial_state_values")
            return done
        self._maybe_fail("set_trial_state_values")
        return super().set_trial_state_values(*args, **kwargs)


def test_a_call_that_fails_n_times_is_retried_until_it_succeeds(caplog) -> None:
    flaky = Flaky({"get_all_trials", "set_trial_user_attr"}, fail=3)
    study = optuna.create_study(storage=RetryingStorage(flaky, retry_s=30))
    with caplog.at_level(logging.WARNING, logger="kernelsearch.db.engine"):
        trial = study.ask()
        trial.set_user_attr("k", 1)
        study.tell(trial, 1.0)
        assert [t.user_attrs for t in study.get_trials()] == [{"k": 1}]
    assert flaky.left == 0 and sum(flaky.calls[n] for n in flaky.names) >= 3 + 2
    assert sum("Retrying" in r.getMessage() for r in caplog.records) == 3, "each retry is logged"


def test_a_call_fails_once_its_budget_is_spent() -> None:
    flaky = Flaky({"get_all_trials"}, fail=10**6)
    storage = RetryingStorage(flaky, retry_s=0.3)
    study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE])
    with pytest.raises(optuna.exceptions.StorageInternalError):
        storage.get_all_trials(study_id)
    assert 1 < flaky.calls["get_all_trials"] < 20


def test_a_failure_that_is_not_transient_is_raised_at_once() -> None:
    flaky = Flaky({"get_all_trials"}, fail=5, error=ValueError("bad statement"))
    storage = RetryingStorage(flaky, retry_s=30)
    study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE])
    with pytest.raises(ValueError, match="bad statement"):
        storage.get_all_trials(study_id)
    assert flaky.calls["get_all_trials"] == 1


def test_a_state_change_whose_answer_was_lost_is_not_an_error_on_its_retry(caplog) -> None:
    flaky = Flaky({"set_trial_state_values"}, fail=1, after=True)
    study = optuna.create_study(storage=RetryingStorage(flaky, retry_s=30))
    trial = study.ask()
    with caplog.at_level(logging.WARNING, logger="kernelsearch.db.engine"):
        study.tell(trial, 2.0)  # its retry finds the trial COMPLETE already
    (done,) = study.get_trials()
    assert done.state == TrialState.COMPLETE and done.value == 2.0
    assert flaky.left == 0 and sum("Retrying" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)


def test_the_opened_storage_keeps_heartbeats_and_its_rdb(tmp_path) -> None:
    storage = open_optuna_storage(f"sqlite:///{tmp_path}/o.db", heartbeat_s=7)
    assert is_heartbeat_enabled(storage) and storage.get_heartbeat_interval() == 7
    assert storage.rdb is not None and storage.rdb.engine.dialect.name == "sqlite"
    study = optuna.create_study(study_name="s", storage=storage)
    assert study._storage is storage
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    study.tell(trial, 3.0)
    assert optuna.load_study(study_name="s", storage=storage.rdb).best_value == 3.0
    assert not is_heartbeat_enabled(RetryingStorage(InMemoryStorage()))
