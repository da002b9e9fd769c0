"""Export version 2: records ship with their trials and their references' latencies; version 1
files still import. Run against SQLite and PostgreSQL (the `store` fixture)."""
from __future__ import annotations

from trusted_records import trust_check, trusted

import copy
import json

import pytest
from helpers import DEVICE, KERNEL, make_record

from kernelsearch.db.engine import upgrade
from kernelsearch.db.errors import ImportRejected
from kernelsearch.db.store import Store
from kernelsearch.db.views import TrialIn
from kernelsearch.db.wire import EXPORT_VERSION

AXES = {"total_patches": 64}
STUDY = "ks/test/total_patches=64/H200"


def _tuned(store: Store) -> None:
    """A database as a tuning run leaves it: trial summaries, then the record of the study."""
    outcomes = [("complete", 9.0, None, None), ("fail", None, "compile_error", "ptxas: " + "x" * 5000),
                ("complete", 5.0, None, None), ("fail", None, "wrong_result", "max rel error 0.3")]
    for n, (state, lat, kind, msg) in enumerate(outcomes):
        store.add_trial_summary(STUDY, KERNEL, DEVICE, AXES, n, state, {"BLOCK_P": 16 * (n + 1)},
                                lat, kind, msg, {"compile_s": 1.0}, job_id=7)
    # Another study of another case: not this record's trials.
    store.add_trial_summary("other", KERNEL, DEVICE, {"total_patches": 128}, 0, "complete",
                            {"BLOCK_P": 8}, 3.0, None, None)
    store.upsert_best(trusted(make_record(5.0, axes=AXES, study_name=STUDY, job_id=7,
                                  eager_latency_us=50.0, compile_latency_us=20.0)))


def test_export_carries_trials_and_references(store: Store) -> None:
    _tuned(store)
    doc = json.loads(json.dumps(store.export_records()))
    assert doc["version"] == EXPORT_VERSION == 3
    (entry,) = doc["records"]
    assert [t["number"] for t in entry["trials"]] == [0, 1, 2, 3]
    assert entry["trials"][1]["failure_kind"] == "compile_error"
    assert entry["trials"][1]["latency_median_us"] is None
    assert len(entry["trials"][1]["message"]) == 2000  # cut, the file stays small
    assert entry["trials"][2] == {"number": 2, "state": "complete", "config": {"BLOCK_P": 48},
                                  "latency_median_us": 5.0, "failure_kind": None, "message": None}
    assert (entry["eager_latency_us"], entry["compile_latency_us"]) == (50.0, 20.0)
    # The speedups are computed from the references when the tuner stored only those.
    assert (entry["speedup_eager"], entry["speedup_compile"]) == (10.0, 4.0)


def test_import_restores_trials_and_speedups(store: Store, tmp_path) -> None:
    _tuned(store)
    doc = json.loads(json.dumps(store.export_records()))
    url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(url)
    with Store(url) as other:
        rep = other.import_records(doc, check=trust_check)
        assert (rep.added, rep.trials_added) == (1, 4)
        (rec,) = other.list_records()
        assert (rec.speedup_eager, rec.speedup_compile) == (10.0, 4.0)
        assert (rec.eager_latency_us, rec.compile_latency_us) == (50.0, 20.0)
        trials = other.trial_summaries(KERNEL, DEVICE, AXES)
        assert [(t["trial_number"], t["state"], t["latency_median_us"], t["failure_kind"])
                for t in trials] == [(0, "complete", 9.0, None), (1, "fail", None, "compile_error"),
                                     (2, "complete", 5.0, None), (3, "fail", None, "wrong_result")]
        assert trials[3]["message"] == "max rel error 0.3"
        assert other.job_trials(7) == []  # job 7 is the tuning database's, not this one's
        again = other.import_records(doc, check=trust_check)
        assert (again.added, again.unchanged, again.trials_added) == (0, 1, 0)
        assert len(other.trial_summaries(KERNEL, DEVICE, AXES)) == 4


def test_trials_of_a_record_already_present_are_added(store: Store, tmp_path) -> None:
    """A database that imported the version-1 file gets the trials from the version-2 export of
    the same records, though the records themselves are unchanged."""
    _tuned(store)
    doc = json.loads(json.dumps(store.export_records()))
    v1 = copy.deepcopy(doc)
    v1["version"] = 1
    for e in v1["records"]:
        for k in ("trials", "eager_latency_us", "compile_latency_us"):
            e.pop(k)
        e.update(speedup_eager=None, speedup_compile=None)
    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url)
    with Store(url) as old:
        assert old.import_records(v1, check=trust_check).trials_added == 0
        assert old.trial_summaries(KERNEL, DEVICE, AXES) == []
        v = old.records_version()
        rep = old.import_records(doc, check=trust_check)
        assert (rep.added, rep.unchanged, rep.trials_added) == (0, 1, 4)
        assert len(old.trial_summaries(KERNEL, DEVICE, AXES)) == 4
        (rec,) = old.list_records()  # and the references the old file lacked
        assert (rec.eager_latency_us, rec.speedup_compile) == (50.0, 4.0)
        assert old.records_version() > v


def test_version_1_file_imports(store: Store) -> None:
    v1 = {"schema": "kernelsearch.records", "version": 1, "records": [
        {k: v for k, v in make_record(4.0).__dict__.items() if k not in ("trials", "eager_latency_us",
                                                                         "compile_latency_us")}]}
    v1 = json.loads(json.dumps(v1, default=str))
    rep = store.import_records(v1, check=trust_check)
    assert rep.added == 1 and rep.trials_added == 0
    (rec,) = store.list_records()
    assert rec.speedup_eager is None and rec.eager_latency_us is None


@pytest.mark.parametrize("mutate, expected", [
    (lambda e: e["trials"][0].update(latency_median_us=None), r"records\[0\]\.trials\.0"),
    (lambda e: e["trials"][1].update(latency_median_us=3.0), r"records\[0\]\.trials\.1"),
    (lambda e: e["trials"][0].update(number=-1), r"records\[0\]\.trials\.0\.number"),
    (lambda e: e["trials"][0].update(state="running"), r"records\[0\]\.trials\.0\.state"),
    (lambda e: e["trials"][0].update(number=True), r"records\[0\]\.trials\.0\.number"),
    (lambda e: e["trials"].append(dict(e["trials"][0])), r"records\[0\]"),
    (lambda e: e.update(study_name=None), r"records\[0\]"),
    (lambda e: e.update(eager_latency_us=float("nan")), r"records\[0\]\.eager_latency_us"),
    (lambda e: e.update(compile_latency_us=-1.0), r"records\[0\]\.compile_latency_us"),
])
def test_bad_trials_or_references_reject_the_file(store: Store, mutate, expected: str) -> None:
    _tuned(store)
    doc = json.loads(json.dumps(store.export_records()))
    doc["records"][0].update(latency_median_us=1.0, latency_min_us=0.5, config={"NEW": 1})
    mutate(doc["records"][0])
    with pytest.raises(ImportRejected, match=expected):
        store.import_records(doc, check=trust_check)
    assert len(store.list_records(include_history=True)) == 1


def test_upsert_with_trials_stores_them(store: Store) -> None:
    rec = make_record(3.0, study_name="s", trials=[
        TrialIn(number=0, state="complete", config={"BLOCK_P": 8}, latency_median_us=3.0)])
    store.upsert_best(trusted(rec))
    assert [t["trial_number"] for t in store.trial_summaries(KERNEL, DEVICE, {"total_patches": 64})] == [0]


def test_trial_summary_rejects_a_bad_job_id(store: Store) -> None:
    with pytest.raises(ValueError, match="job_id"):
        store.add_trial_summary(STUDY, KERNEL, DEVICE, AXES, 0, "complete", {}, 1.0, None, None,
                                job_id="7")


def test_job_trials_are_the_trials_its_job_ran(store: Store) -> None:
    _tuned(store)
    store.add_trial_summary("s2", KERNEL, DEVICE, {"total_patches": 32}, 0, "fail", {"BLOCK_P": 8},
                            None, "timeout", "killed after 120 s", job_id=7)
    store.add_trial_summary("s3", KERNEL, DEVICE, AXES, 0, "fail", {}, None, "crash", "x", job_id=8)
    rows = store.job_trials(7)
    # By the work the case moves; a case of unknown work last.
    assert [(r["axes"], r["trial_number"]) for r in rows] == [(AXES, n) for n in range(4)] + [
        ({"total_patches": 32}, 0)]
    assert rows[-1]["failure_kind"] == "timeout" and rows[-1]["device"] == DEVICE
    assert store.job_trials(99) == []
    with pytest.raises(ValueError, match="job_id"):
        store.job_trials("7")
