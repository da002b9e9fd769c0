"""The storage contract, run unchanged against SQLite and PostgreSQL (the `store` fixture)."""
from __future__ import annotations

from trusted_records import trust_check, trusted

import copy
import dataclasses
import json
import re
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from typing import Protocol, get_args, get_type_hints

import pytest
from helpers import DEVICE, KERNEL, make_record, nearest_to

from kernelsearch.db import interfaces
from kernelsearch.db.engine import redact_url_passwords, upgrade
from kernelsearch.db.errors import Conflict, ImportRejected, LeaseLost, SchemaBehind, StoreUnavailable
from kernelsearch.db.interfaces import Lease
from kernelsearch.db.models import Record
from kernelsearch.db.repos import DeviceRepo, JobRepo, RecordRepo, TransferRepo, TrialRepo
from kernelsearch.db.statuses import JobKind, JobStatus
from kernelsearch.db.store import Store
from kernelsearch.db.wire import EXPORT_SCHEMA, EXPORT_VERSION
from kernelsearch.db.views import RECORD_COLUMNS, RECORD_KEY_FIELDS, VIEW_COLUMNS, RecordFields, RecordView

CASES = [{"total_patches": 64}, {"total_patches": 128}]


# ----------------------------------------------------------------------------- jobs


def test_identical_job_while_one_is_active_is_that_job(store: Store) -> None:
    cases = [{"seq_len": 8}, {"seq_len": 16}]
    first = store.create_job("k", cases, 4, "tpe")
    assert store.create_job("k", [dict(c) for c in cases], 4, "tpe").id == first.id
    assert store.create_job("k", cases, 5, "tpe").id != first.id  # another budget
    assert store.create_job("k", cases[::-1], 4, "tpe").id != first.id  # another order of work
    assert store.create_job("k", cases, 4, "random").id != first.id
    claimed = store.claim_job("w1", lease_seconds=60)
    assert claimed is not None and claimed.id == first.id
    assert store.create_job("k", cases, 4, "tpe").id == first.id  # running: still that job
    store.finish_job(Lease.of(claimed), "succeeded")
    assert store.create_job("k", cases, 4, "tpe").id != first.id  # done: a new job adds trials


def test_queue_job_says_whether_it_is_an_existing_job(store: Store) -> None:
    first, existing = store.queue_job("k", [{"seq_len": 8}], 4, "tpe")
    assert existing is False
    again, existing = store.queue_job("k", [{"seq_len": 8}], 4, "tpe")
    assert again.id == first.id and existing is True


def test_a_job_is_given_its_kind_at_submission_and_keeps_it(store: Store) -> None:
    """The worker dispatches on the kind: what the job was submitted as, never guessed again."""
    helion = {"kind": "helion", "version": 1}
    queued = {kind: store.queue_job("k", [{"seq_len": 8}], 1, sampler, capture=capture)[0]
              for kind, sampler, capture in [("declared", "tpe", None), ("capture", "tpe", {"c": 1}),
                                             ("search", "search", {"c": 1}), ("helion", "helion", helion)]}
    assert {k: j.kind for k, j in queued.items()} == {k: JobKind(k) for k in queued}
    assert len({j.id for j in queued.values()}) == 4  # one kind's job is never another's
    assert {j.id: j.kind for j in store.list_jobs()} == {j.id: j.kind for j in queued.values()}
    assert store.get_job(queued["search"].id).as_dict()["kind"] == "search"


def test_a_recently_failed_identical_job_answers_within_the_back_off(store: Store) -> None:
    first, _ = store.queue_job("k", [{"seq_len": 8}], 1, "helion", capture={"c": 1})
    claimed = store.claim_job("w1", lease_seconds=60)
    assert claimed is not None and claimed.id == first.id
    store.finish_job(Lease.of(claimed), JobStatus.FAILED, error="no worker can tune this")
    again, existing = store.queue_job("k", [{"seq_len": 8}], 1, "helion", capture={"c": 1},
                                      failed_backoff_s=3600)
    assert (again.id, existing, again.status) == (first.id, True, JobStatus.FAILED)
    other, existing = store.queue_job("k", [{"seq_len": 9}], 1, "helion", capture={"c": 1},
                                      failed_backoff_s=3600)
    assert existing is False and other.id != first.id  # another case is not that job
    store.cancel_job(other.id)
    new, existing = store.queue_job("k", [{"seq_len": 8}], 1, "helion", capture={"c": 1})
    assert existing is False and new.id not in (first.id, other.id)  # no back-off asked


def test_a_cancelled_job_keeps_the_best_only_from_its_worker(store: Store) -> None:
    job = store.create_job(KERNEL, CASES, n_trials=5, sampler="tpe")
    claimed = store.claim_job("w1", lease_seconds=60)
    assert claimed.id == job.id
    lease = Lease.of(claimed)
    best = {"cases": [{"axes": CASES[0], "best_latency_us": 4.2}]}
    assert store.keep_cancelled_best(lease, trials_done=3, best=best) is False  # running
    store.cancel_job(job.id)
    with pytest.raises(LeaseLost):
        store.update_job_progress(lease, trials_done=3, best=best)
    other = Lease(job_id=job.id, owner="w2", token=lease.token)
    assert store.keep_cancelled_best(other, trials_done=3, best=best) is False
    stale = Lease(job_id=job.id, owner="w1", token=lease.token - 1)
    assert store.keep_cancelled_best(stale, trials_done=3, best=best) is False
    assert store.keep_cancelled_best(lease, trials_done=3, best=best) is True
    final = store.get_job(job.id)
    assert (final.status, final.best, final.trials_done) == ("cancelled", best, 3)


def test_job_lifecycle(store: Store) -> None:
    job = store.create_job(KERNEL, CASES, n_trials=5, sampler="tpe", timeout_s=30)
    assert (job.status, job.trials_done, job.attempts, job.owner) == ("queued", 0, 0, None)
    assert job.cases == CASES and job.kernel == KERNEL and job.timeout_s == 30.0

    claimed = store.claim_job("w1", lease_seconds=60)
    assert claimed is not None and claimed.id == job.id
    assert (claimed.status, claimed.owner, claimed.attempts) == ("running", "w1", 1)
    assert claimed.started_at is not None and claimed.heartbeat_at is not None
    assert store.claim_job("w2", lease_seconds=60) is None

    lease = Lease.of(claimed)
    store.heartbeat(lease)
    with pytest.raises(LeaseLost):
        store.heartbeat(Lease(job.id, "w2", 1))
    store.update_job_progress(lease, trials_done=3, device=DEVICE, best={"latency_us": 4.2},
                              current_case=CASES[1])
    with pytest.raises(LeaseLost):
        store.update_job_progress(Lease(job.id, "w2", 1), trials_done=4)
    mid = store.get_job(job.id)
    assert (mid.trials_done, mid.device, mid.best, mid.current_case) == (3, DEVICE, {"latency_us": 4.2}, CASES[1])

    store.finish_job(lease, "succeeded")
    done = store.get_job(job.id)
    assert done.status == "succeeded" and done.finished_at is not None
    with pytest.raises(LeaseLost, match="succeeded"):
        store.finish_job(lease, "failed", error="late")
    assert store.get_job(job.id).status == "succeeded"
    d = done.as_dict()
    assert json.loads(json.dumps(d)) == d and isinstance(d["created_at"], str)


def test_a_job_whose_workers_go_silent_is_failed_at_the_claim_cap(store: Store) -> None:
    """Issue 33.1: a job that kills what runs it (each holder silent past its lease) is taken over
    at most max_claims - 1 times, then failed by the next claim, which takes the next job."""
    poison = store.create_job(KERNEL, CASES[:1], 2, "random")
    owners = [store.claim_job(f"w{i}", lease_seconds=1e-6, max_claims=3) for i in range(3)]
    assert [(j.id, j.attempts) for j in owners] == [(poison.id, 1), (poison.id, 2), (poison.id, 3)]
    good = store.create_job(KERNEL, CASES[1:], 2, "random")
    # w2 went silent as well: the third lost claim fails the job; the claim takes the good one.
    taken = store.claim_job("w3", lease_seconds=1e-6, max_claims=3)
    assert taken is not None and taken.id == good.id
    failed = store.get_job(poison.id)
    assert failed.status == JobStatus.FAILED and failed.attempts == 3 and failed.finished_at
    assert "3 claims" in failed.error and "KS_JOB_MAX_CLAIMS=3" in failed.error
    with pytest.raises(LeaseLost):
        store.heartbeat(Lease.of(owners[-1]))
    # A hand-back is no lost claim: a job released by stopping workers is claimed on.
    store.finish_job(Lease.of(taken), JobStatus.SUCCEEDED)
    handed = store.create_job(KERNEL, CASES[:1], 5, "random")
    for i in range(4):
        held = store.claim_job(f"s{i}", 60, max_claims=2)
        assert held is not None and held.id == handed.id
        store.release_job(Lease.of(held))
    assert store.get_job(handed.id).status == JobStatus.QUEUED


def test_the_claim_cap_holds_under_concurrent_claimers(store: Store) -> None:
    """Many workers claiming at once a job whose holders all go silent: never more than
    max_claims claims, and the job ends failed."""
    import threading

    job = store.create_job(KERNEL, CASES[:1], 2, "random")
    got: list[int] = []

    def claimer(i: int) -> None:
        for _ in range(4):
            j = store.claim_job(f"c{i}", lease_seconds=1e-6, max_claims=2)
            if j is not None:
                got.append(j.attempts)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    final = store.get_job(job.id)
    assert sorted(got) == [1, 2] and final.status == JobStatus.FAILED and final.attempts == 2


def test_claim_takes_oldest_and_reclaims_stale_lease(store: Store) -> None:
    a = store.create_job(KERNEL, CASES[:1], 2, "random")
    b = store.create_job(KERNEL, CASES[:1], 3, "random")  # an identical job would be `a`
    old = Lease.of(store.claim_job("w1", 60))
    assert old.job_id == a.id
    assert store.claim_job("w2", 60).id == b.id
    assert store.claim_job("w3", 60) is None
    # A tiny lease makes both running jobs stale: the oldest is taken over first.
    taken = store.claim_job("w3", lease_seconds=1e-6)
    assert (taken.id, taken.owner, taken.attempts) == (a.id, "w3", 2)
    with pytest.raises(LeaseLost, match="claimed again"):
        store.heartbeat(old)
    with pytest.raises(LeaseLost):
        store.finish_job(old, "succeeded")
    store.finish_job(Lease.of(taken), "failed", error="boom")
    failed = store.get_job(a.id)
    assert (failed.status, failed.error) == ("failed", "boom")


def test_cancel(store: Store) -> None:
    queued = store.create_job(KERNEL, CASES, 2, "tpe")
    running = store.create_job(KERNEL, CASES, 3, "tpe")
    assert store.cancel_job(queued.id).status == "cancelled"
    lease = Lease.of(store.claim_job("w", 60))
    assert lease.job_id == running.id, "a cancelled job is never claimed"
    assert store.cancel_job(running.id).status == "cancelled"
    with pytest.raises(LeaseLost, match="cancelled"):
        store.heartbeat(lease)
    with pytest.raises(LeaseLost):
        store.finish_job(lease, "succeeded")
    assert store.get_job(running.id).status == "cancelled"
    assert store.cancel_job(987654) is None
    finished = store.create_job(KERNEL, CASES, 4, "tpe")
    store.finish_job(Lease.of(store.claim_job("w", 60)), "succeeded")
    assert store.cancel_job(finished.id).status == "succeeded"


def test_list_count_and_queue_limit(store: Store) -> None:
    ids = [store.create_job(KERNEL, CASES, n, "tpe", max_queued=3).id for n in (1, 2, 3)]
    with pytest.raises(Conflict, match="already queued"):
        store.create_job(KERNEL, CASES, 4, "tpe", max_queued=3)
    assert store.count_jobs() == 3 and store.count_jobs("queued") == 3
    store.claim_job("w", 60)
    assert store.count_jobs("queued") == 2 and store.count_jobs("running") == 1
    store.create_job(KERNEL, CASES, 5, "tpe", max_queued=3)
    assert [j.id for j in store.list_jobs()][1:] == ids[::-1], "newest first"
    assert [j.id for j in store.list_jobs(status="running")] == [ids[0]]
    assert len(store.list_jobs(limit=2)) == 2
    assert store.get_job(123456) is None


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"cases": []}, "cases"),
        ({"cases": [{"total_patches": 6.4}]}, "cases[0]"),
        ({"n_trials": 0}, "n_trials"),
        ({"kernel": ""}, "kernel"),
        ({"timeout_s": -1}, "timeout_s"),
    ],
)
def test_create_job_rejects_bad_input_naming_the_argument(store: Store, kwargs: dict, arg: str) -> None:
    args = {"kernel": KERNEL, "cases": CASES, "n_trials": 2, "sampler": "tpe"} | kwargs
    with pytest.raises(ValueError, match="^" + re.escape(arg)):
        store.create_job(**args)
    assert store.count_jobs() == 0


def test_status_arguments_are_checked(store: Store) -> None:
    with pytest.raises(ValueError, match="status"):
        store.list_jobs(status="done")
    store.create_job(KERNEL, CASES, 1, "tpe")
    lease = Lease.of(store.claim_job("w", 60))
    with pytest.raises(ValueError, match="status"):
        store.finish_job(lease, "running")


# ----------------------------------------------------------------------------- records


def test_better_record_supersedes_and_history_is_kept(store: Store) -> None:
    v0 = store.records_version()
    first, improved = store.upsert_best(trusted(make_record(10.0, minutes=0)))
    assert improved and first.is_current and first.superseded_at is None
    worse, improved = store.upsert_best(trusted(make_record(12.0, minutes=1, config={"BLOCK_P": 64})))
    assert not improved and not worse.is_current and worse.superseded_at is not None
    better, improved = store.upsert_best(trusted(make_record(8.0, minutes=2, config={"BLOCK_P": 16})))
    assert improved and better.is_current
    tie, improved = store.upsert_best(trusted(make_record(8.0, minutes=3, config={"BLOCK_P": 8})))
    assert not improved, "only a strictly lower median supersedes"

    history = store.record_history(KERNEL, DEVICE, {"total_patches": 64})
    assert [r.latency_median_us for r in history] == [10.0, 12.0, 8.0, 8.0]
    assert [r.is_current for r in history] == [False, False, True, False]
    assert history[0].superseded_by == better.id and history[0].superseded_at is not None
    assert store.records_version() >= v0 + 4

    current = store.list_records(kernel=KERNEL, device=DEVICE)
    assert [r.id for r in current] == [better.id]
    assert len(store.list_records(include_history=True)) == 4


def test_identical_record_twice_is_a_no_op(store: Store) -> None:
    rec = make_record(10.0)
    first, _ = store.upsert_best(trusted(rec))
    v = store.records_version()
    again, improved = store.upsert_best(trusted(rec))
    assert again.id == first.id and improved is False
    assert store.records_version() == v
    assert len(store.list_records(include_history=True)) == 1


@pytest.mark.parametrize("change", [
    {"config": {"BLOCK_P": 64, "num_warps": 4}}, {"source_hash": "def456"},
    {"torch_version": "2.12.0"}, {"triton_version": "3.7.0"}, {"timing_method": "interpreter-wallclock"},
    {"rel_error": 2e-7}, {"device": "NVIDIA A100"}, {"axes": {"total_patches": 65}},
], ids=lambda c: next(iter(c)))
def test_a_record_differing_in_one_measured_field_is_a_new_record(store: Store, change) -> None:
    """The fingerprint that makes a re-import a no-op covers each field: the same latency with
    another config (or source, versions, ...) is another record, not the first one again."""
    first, _ = store.upsert_best(trusted(make_record(10.0)))
    other, _ = store.upsert_best(trusted(dataclasses.replace(make_record(10.0), **change)))
    assert other.id != first.id
    key = next(iter(change))
    assert getattr(other, key) == change[key] != getattr(first, key)
    assert len(store.list_records(include_history=True)) == 2


def test_record_round_trips_every_field(store: Store) -> None:
    rec = make_record(
        5.5,
        roofline_pct=42.0,
        speedup_eager=30.0,
        speedup_compile=20.0,
        study_name="study-1",
        job_id=7,
        device_info={"name": DEVICE, "compute_capability": "9.0", "memory_bytes": 150_000_000_000},
    )
    view, _ = store.upsert_best(trusted(rec))
    for f in ("kernel", "axes", "work", "device", "device_info", "torch_version", "triton_version",
              "source_hash", "config", "latency_median_us", "latency_min_us", "latency_max_us",
              "latency_iqr_us", "timing_method", "roofline_pct", "speedup_eager", "speedup_compile",
              "rel_error", "n_trials", "n_failed", "study_name", "job_id", "tuned_at"):
        assert getattr(view, f) == getattr(rec, f), f
    assert view.tuned_at.tzinfo is not None
    dev = {d["name"]: d for d in store.list_devices()}[DEVICE]
    assert dev["compute_capability"] == "9.0" and dev["n_records"] == 1


def test_find_best_exact_and_nearest(store: Store) -> None:
    small, _ = store.upsert_best(trusted(make_record(3.0, axes={"total_patches": 64}, work=1000.0)))
    large, _ = store.upsert_best(trusted(make_record(9.0, axes={"total_patches": 1024}, work=9000.0)))
    store.upsert_best(trusted(make_record(1.0, axes={"total_patches": 64}, device="other GPU")))
    def best(axes, work, kernel=KERNEL, device=DEVICE):
        return store.find_best(kernel, device, axes, nearest_to(axes))

    hit = best({"total_patches": 64}, work=1000.0)
    assert hit[1] == "exact" and hit[0].id == small.id
    near = best({"total_patches": 900}, work=8000.0)
    assert near[1] == "nearest" and near[0].id == large.id
    near = best({"total_patches": 100}, work=2000.0)
    assert near[0].id == small.id
    assert best({"total_patches": 64}, 1000.0, device="unknown GPU") is None
    assert best({"total_patches": 64}, 1000.0, kernel="other_kernel") is None


def test_nearest_is_the_kernels_log_ratio_over_many_records(store: Store) -> None:
    # Four sizes on the device: a query between two of them goes to the nearer by the ratio of
    # bytes (the kernel's definition), which differs from the nearer by difference here.
    ids = {}
    for p in (64, 256, 1024, 4096):
        ids[p] = store.upsert_best(trusted(make_record(3.0, axes={"total_patches": p})))[0].id
    for query, want in ((150, 256), (600, 1024), (1900, 1024), (3000, 4096), (40, 64), (9000, 4096)):
        axes = {"total_patches": query}
        got = store.find_best(KERNEL, DEVICE, axes, nearest_to(axes))
        assert got is not None and got[1] == "nearest" and got[0].id == ids[want], (query, want)
    # 600 patches is nearer 256 by difference (344 against 424), nearer 1024 by ratio.
    assert abs(600 - 256) < abs(1024 - 600)
    # A distance that says "never" (another category) leaves nothing to serve.
    assert store.find_best(KERNEL, DEVICE, {"total_patches": 600},
                           lambda _ax, _w: float("inf")) is None


def test_list_records_filters(store: Store) -> None:
    store.upsert_best(trusted(make_record(3.0, axes={"total_patches": 64})))
    store.upsert_best(trusted(make_record(3.0, axes={"seq_len": 4}, kernel="vision_rope3d_spatial_merge_bwd")))
    store.upsert_best(trusted(make_record(3.0, axes={"total_patches": 64}, device="cpu (triton interpreter)")))
    assert len(store.list_records()) == 3
    assert {r.kernel for r in store.list_records(kernel=KERNEL)} == {KERNEL}
    assert {r.device for r in store.list_records(device=DEVICE)} == {DEVICE}
    assert len(store.list_records(kernel=KERNEL, device=DEVICE)) == 1


@pytest.mark.parametrize(
    "change, field",
    [
        ({"latency_median_us": -1.0}, "latency_median_us"),
        ({"latency_min_us": 100.0}, "latency"),
        ({"timing_method": "stopwatch"}, "timing_method"),
        ({"axes": {"total_patches": 1.5}}, "axes"),
        ({"kernel": " "}, "kernel"),
    ],
)
def test_upsert_rejects_bad_record_naming_the_field(store: Store, change: dict, field: str) -> None:
    rec = make_record(10.0)
    for k, v in change.items():
        setattr(rec, k, v)
    with pytest.raises(ValueError, match=field):
        store.upsert_best(trusted(rec))
    assert store.list_records(include_history=True) == []


# ----------------------------------------------------------------------------- trials, devices


# A kernel's name is its module path and qualified name, of any length up to the bound and any
# script: here 1000 characters, ~3 kB of UTF-8 that does not compress, past what PostgreSQL's
# btree indexes take (an index over the name refuses it: "index row size 3008 exceeds ... 2704").
LONG_NAME = "pkg.模块." + "".join(chr(0x4E00 + i * 7919 % 20000) for i in range(993))
WIDE_NAME = "módulo.ядро"


@pytest.mark.parametrize("name", [LONG_NAME, WIDE_NAME], ids=["long", "non-ascii"])
def test_a_kernel_of_any_python_name_is_stored_like_any_other(store: Store, name: str) -> None:
    """Records, lookups, jobs, trials, definitions and exports of a kernel named by a long or
    non-ASCII `module.qualname`; a near twin (one character less) is another kernel."""
    assert len(LONG_NAME) == 1000
    twin = name[:-1]
    store.upsert_best(trusted(make_record(10.0, kernel=name, study_name="s1")))
    store.upsert_best(trusted(make_record(20.0, kernel=twin)))
    assert [r.kernel for r in store.list_records(kernel=name)] == [name]
    got = store.find_best(name, DEVICE, {"total_patches": 64}, nearest_to({"total_patches": 64}, KERNEL))
    assert got is not None and got[0].latency_median_us == 10.0 and got[1] == "exact"
    assert [r.latency_median_us for r in store.record_history(name, DEVICE, {"total_patches": 64})] == [10.0]
    store.add_trial_summary("s1", name, DEVICE, {"total_patches": 64}, 0, "complete", {"B": 1}, 9.0,
                            None, None)
    assert len(store.trial_summaries(name, DEVICE, {"total_patches": 64})) == 1
    job = store.create_job(name, CASES, 2, "tpe")
    assert store.get_job(job.id).kernel == name and store.page_jobs(kernel=name)[1] == 1
    assert store.save_definition(name, {"name": name}) is True
    assert store.kernel_definitions() == {name: {"name": name}}
    doc = json.loads(json.dumps(store.export_records(kernel=name)))
    assert [r["kernel"] for r in doc["records"]] == [name] and list(doc["kernels"]) == [name]
    assert store.import_records(doc, check=trust_check).unchanged == 1
    with pytest.raises(ValueError, match="kernel"):
        store.create_job(name + "x" * (1001 - len(name)), CASES, 2, "tpe")


def test_trial_summaries_are_idempotent_and_ordered(store: Store) -> None:
    axes = {"total_patches": 64}
    for n in (2, 0, 1):
        store.add_trial_summary("s1", KERNEL, DEVICE, axes, n, "RUNNING", {"B": n}, None, None, None)
    store.add_trial_summary("s1", KERNEL, DEVICE, axes, 1, "COMPLETE", {"B": 1}, 4.5, None, None, {"n_regs": 32})
    store.add_trial_summary("s1", KERNEL, DEVICE, axes, 2, "FAIL", {"B": 2}, None, "compile_error", "ptxas")
    rows = store.trial_summaries(KERNEL, DEVICE, axes)
    assert [r["trial_number"] for r in rows] == [0, 1, 2]
    assert rows[1]["state"] == "COMPLETE" and rows[1]["latency_median_us"] == 4.5 and rows[1]["extra"] == {"n_regs": 32}
    assert (rows[2]["failure_kind"], rows[2]["message"]) == ("compile_error", "ptxas")
    assert store.trial_summaries(KERNEL, DEVICE, {"total_patches": 65}) == []


def test_ensure_device_is_idempotent_and_refreshes(store: Store) -> None:
    info = {"name": DEVICE, "compute_capability": "9.0", "memory_bytes": 1, "multiprocessors": 132,
            "cuda_version": "12.8", "driver_version": "570.1", "interpreter": False}
    a = store.ensure_device(info)
    b = store.ensure_device(info | {"driver_version": "575.0"})
    assert a == b
    (dev,) = store.list_devices()
    assert dev["driver_version"] == "575.0" and dev["multiprocessors"] == 132
    with pytest.raises(ValueError, match=r"info\['name'\]"):
        store.ensure_device({"compute_capability": "9.0"})


# ----------------------------------------------------------------------------- export / import


def _seed(store: Store) -> None:
    store.upsert_best(trusted(make_record(10.0, minutes=0)))
    store.upsert_best(trusted(make_record(7.0, minutes=1, config={"BLOCK_P": 16})))
    store.upsert_best(trusted(make_record(3.0, axes={"total_patches": 1024}, minutes=2)))


def test_export_import_round_trip_is_idempotent(store: Store, tmp_path) -> None:
    _seed(store)
    doc = store.export_records(include_history=True)
    assert doc["schema"] == EXPORT_SCHEMA and doc["version"] == EXPORT_VERSION and len(doc["records"]) == 3
    doc = json.loads(json.dumps(doc))

    # Into itself: nothing changes.
    v = store.records_version()
    rep = store.import_records(doc, check=trust_check)
    assert (rep.added, rep.superseded, rep.unchanged) == (0, 0, 3)
    assert store.records_version() == v

    # Into a second, empty store (SQLite): same current records and history, twice over.
    from kernelsearch.db.engine import upgrade

    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(other_url)
    with Store(other_url) as other:
        rep = other.import_records(doc, check=trust_check)
        assert (rep.added, rep.superseded, rep.unchanged) == (3, 1, 0)
        again = other.import_records(doc, check=trust_check)
        assert (again.added, again.superseded, again.unchanged) == (0, 0, 3)
        src = [(r.axes, r.latency_median_us, r.is_current, r.config) for r in store.list_records(include_history=True)]
        dst = [(r.axes, r.latency_median_us, r.is_current, r.config) for r in other.list_records(include_history=True)]
        assert sorted(map(repr, src)) == sorted(map(repr, dst))


def test_import_goes_through_the_supersede_rule(store: Store) -> None:
    store.upsert_best(trusted(make_record(5.0, minutes=0)))
    doc = store.export_records()
    doc["records"][0].update(latency_median_us=9.0, latency_min_us=8.0, latency_max_us=10.0, config={"X": 1})
    rep = store.import_records(doc, check=trust_check)
    assert (rep.added, rep.superseded) == (1, 0)
    (cur,) = store.list_records()
    assert cur.latency_median_us == 5.0, "a slower imported record is history only"
    doc["records"][0].update(latency_median_us=2.0, latency_min_us=1.0, config={"X": 2})
    rep = store.import_records(doc, check=trust_check)
    assert (rep.added, rep.superseded) == (1, 1)
    assert store.list_records()[0].latency_median_us == 2.0


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["records"][1].pop("latency_median_us"), r"records\[1\]\.latency_median_us"),
        (lambda d: d["records"][2].update(axes={"total_patches": 2.5}), r"records\[2\]\.axes"),
        (lambda d: d["records"][1].update(bogus=1), r"records\[1\]\.bogus"),
        (lambda d: d["records"].insert(1, "not an object"), r"records\[1\]"),
        (lambda d: d.update(version=99), "version"),
        (lambda d: d.update(schema="other"), "schema"),
    ],
)
def test_malformed_import_is_rejected_whole(store: Store, mutate, expected: str) -> None:
    _seed(store)
    doc = store.export_records(include_history=True)
    fresh = copy.deepcopy(doc)
    # Make entry 0 new, so a half-import would be visible.
    fresh["records"][0].update(latency_median_us=1.0, latency_min_us=0.5, config={"NEW": 1})
    mutate(fresh)
    before = [r.id for r in store.list_records(include_history=True)]
    v = store.records_version()
    with pytest.raises(ImportRejected, match=expected):
        store.import_records(fresh, check=trust_check)
    assert [r.id for r in store.list_records(include_history=True)] == before
    assert store.records_version() == v


# ----------------------------------------------------------------------------- failures


def test_schema_behind_on_unmigrated_database(db_url: str) -> None:
    with Store(db_url) as s:
        with pytest.raises(SchemaBehind, match="kernelsearch db upgrade"):
            s.list_records()


def test_unreachable_database_raises_store_unavailable(db_url: str, tmp_path) -> None:
    url = (
        f"sqlite:///{tmp_path}/is_a_dir/"  # a directory, not a file: SQLite cannot open it
        if db_url.startswith("sqlite")
        else "postgresql+psycopg://postgres@127.0.0.1:1/nothing?connect_timeout=2"
    )
    (tmp_path / "is_a_dir").mkdir()
    with Store(url) as s:
        with pytest.raises(StoreUnavailable, match="database unavailable"):
            s.ping()
        with pytest.raises(StoreUnavailable):
            s.count_jobs()


def test_views_are_plain_data(store: Store) -> None:
    view, _ = store.upsert_best(trusted(make_record(4.0)))
    d = view.as_dict()
    assert json.loads(json.dumps(d)) == d
    assert datetime.fromisoformat(d["tuned_at"]) == make_record(4.0).tuned_at
    assert datetime.now(timezone.utc) - store.create_job(KERNEL, CASES, 1, "tpe").created_at < timedelta(minutes=5)


# ----------------------------------------------------------------------------- seams


def test_the_store_implements_every_storage_protocol(store: Store) -> None:
    protocols = [v for v in vars(interfaces).values()
                 if isinstance(v, type) and issubclass(v, Protocol) and v is not Protocol]
    assert len(protocols) >= 10
    for proto in protocols:
        assert isinstance(store, proto), proto.__name__


def test_each_repository_stands_alone(db_url: str) -> None:
    # Each concern's repository runs over the shared base without the others mixed in.
    upgrade(db_url)
    with RecordRepo(db_url) as records:
        assert isinstance(records, interfaces.RecordRepository)
        assert not isinstance(records, interfaces.JobQueue)
        view, improved = records.upsert_best(trusted(make_record(10.0)))
        assert improved and records.find_best(KERNEL, DEVICE, view.axes,
                                              nearest_to(view.axes))[0].id == view.id
        assert records.has_records() and records.records_version() == 1
    with JobRepo(db_url) as jobs:
        assert isinstance(jobs, interfaces.JobQueue) and isinstance(jobs, interfaces.StudyClaims)
        job = jobs.create_job(KERNEL, CASES, 2, "tpe")
        claimed = jobs.claim_job("w1", lease_seconds=60)
        assert claimed.id == job.id
        assert jobs.claim_study("ks/s", Lease.of(claimed), lease_seconds=60) is None
    with TrialRepo(db_url) as trials, DeviceRepo(db_url) as devices, TransferRepo(db_url) as io:
        trials.add_trial_summary("ks/s", KERNEL, DEVICE, CASES[0], 0, "complete", {}, 1.0, None, None)
        assert trials.trial_numbers("ks/s") == {0}
        assert [d["name"] for d in devices.list_devices()] == [DEVICE]
        assert len(io.export_records()["records"]) == 1


def test_the_record_definition_matches_the_records_table() -> None:
    # A record field added in views.RecordFields must get its column in models.Record (and a
    # migration), and the reverse; the key fields live in the kernel, case and device rows.
    table = {c.key: c for c in Record.__table__.columns}
    own = {"kernel_id", "case_id", "device_id", "created_at", "fingerprint"}
    assert set(table) - own == set(VIEW_COLUMNS)
    assert set(RECORD_KEY_FIELDS) | set(RECORD_COLUMNS) == {f.name for f in fields(RecordFields)}
    hints = get_type_hints(RecordView)
    for name in VIEW_COLUMNS:
        optional = type(None) in get_args(hints[name])
        assert table[name].nullable == optional, f"{name}: nullable column vs field type"


@pytest.mark.parametrize("text, shown", [
    ("postgresql+psycopg://ks:s3cret@db:5432/ks", "postgresql+psycopg://ks:***@db:5432/ks"),
    ("failed: postgresql://u:p@ss@db/ks?opt=a@b (x)", "failed: postgresql://u:***@db/ks?opt=a@b (x)"),
    ("postgresql://ks@db/ks", "postgresql://ks@db/ks"),
    ("sqlite:///var/a@b.db", "sqlite:///var/a@b.db"),
    ("a postgresql://a:1@h and mysql://b:2@k", "a postgresql://a:***@h and mysql://b:***@k"),
])
def test_url_passwords_are_redacted(text: str, shown: str) -> None:
    assert redact_url_passwords(text) == shown


def test_calls_kept_without_a_job_are_kept_once_and_read_after_the_jobs(store: Store) -> None:
    """`save_capture` keeps a call once per kernel (by its digest); `kernel_captures` answers a
    case's newest call, a job's before a kept one, and `key_captures` every distinct call of
    the case; a call of another case or kernel is not among them."""
    a, b = {"n": 8}, {"n": 16}
    cap = {"args": [{"name": "n", "kind": "scalar", "value": 8}], "grids": [[1, 1, 1]]}
    other = {**cap, "grids": [[2, 1, 1]]}
    assert store.save_capture("k.kept", a, cap, "d1") is True
    assert store.save_capture("k.kept", a, cap, "d1") is False
    assert store.save_capture("k.kept", b, other, "d2") is True
    assert store.save_capture("k.other", a, other, "d1") is True
    assert sorted(store.kernel_captures("k.kept"), key=lambda t: t[0]["n"]) == [(a, cap), (b, other)]
    store.queue_job("k.kept", [a], 1, "grid", capture=other)
    assert dict((axes["n"], c) for axes, c in store.kernel_captures("k.kept"))[8] == other
    assert store.key_captures("k.kept", a) == [other, cap]
