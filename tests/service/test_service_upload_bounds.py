"""Uploads that cannot mislead (issue 33, items 6 and 7): an undeclared kernel's record is held to
finite positive timings of its own configs, a launch floor on a GPU and a nanosecond anywhere,
with the winner the fastest of its timings; a declared kernel's upload to the device's real peak
under any spelling of its name; the server names where an upload came from; a definition with
records is not replaced by another module's. Both backends where the store answers."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from svc_helpers import H200, KA, KB, record, settings_for

from kernelsearch import kernels
from kernelsearch.db.store import Store
from kernelsearch.db.views import RecordIn
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.device import INTERPRETER_DEVICE, versions
from kernelsearch.search_space.acceptance import (GPU_LAUNCH_FLOOR_US, UPLOAD_PEAK_MARGIN,
                                                  RecordRejected, accepted, as_upload,
                                                  peak_bandwidth)
from kernelsearch.service.api import create_app

AUTH = {"Authorization": "Bearer t"}
NAME = "ks_upload_bounds_pkg.k"
# As the decorator sends them: canonical (every launch option Triton fills in).
CONFIGS = [canonical({"B": b, "num_warps": w}) for b, w in ((4, 1), (8, 2), (16, 4))]
DEFINITION = {"name": NAME, "module": "ks_upload_bounds_pkg", "qualname": "k",
              "arg_names": ["x", "y", "n", "B"], "key": ["n"], "dtype_args": ["x", "y"],
              "configs": CONFIGS, "source_hash": "ab"}
CASE = {"n": 8, "x.dtype": "float32", "y.dtype": "float32"}
KEYS = [canonical_key(c) for c in CONFIGS]


@pytest.fixture
def writer(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(store.url, api_token=SecretStr("t")), store=store)) as c:
        yield c


@pytest.fixture
def sqlite_writer(sqlite_store: Store) -> Iterator[TestClient]:
    """For refusals, which the gate answers before any database is asked."""
    with TestClient(create_app(settings_for(sqlite_store.url, api_token=SecretStr("t")),
                               store=sqlite_store)) as c:
        yield c


def undeclared(timings: dict[str, Any], winner: int = 0, device: str = H200,
               latency_us: float | None = None) -> dict[str, Any]:
    """An undeclared kernel's upload as the decorator sends it: its winner's median and every
    config's (`timings`, by config key)."""
    lat = timings[KEYS[winner]] if latency_us is None else latency_us
    v = versions()
    return {"kernel": NAME, "axes": CASE, "work": 8.0, "device": device, "torch_version": v["torch"],
            "triton_version": v["triton"], "source_hash": "ab", "config": canonical(CONFIGS[winner]),
            "latency_median_us": lat, "latency_min_us": lat, "latency_max_us": lat,
            "latency_iqr_us": 0.0, "timing_method": "triton-do-bench", "rel_error": 0.0,
            "n_trials": len(timings), "n_failed": 0, "tuned_at": "2026-12-01T00:00:00+00:00",
            "config_timings": timings}


def _post(c: TestClient, body: dict[str, Any]) -> Any:
    return c.post("/v1/records", json=body, headers=AUTH)


# (id, body, the field the refusal names): each was stored and served before.
def _bad_undeclared() -> list[tuple[str, dict[str, Any], str]]:
    honest = {KEYS[0]: 12.0, KEYS[1]: 15.0, KEYS[2]: 20.0}
    return [
        ("junk-config", undeclared({**honest, "junk": -5.0}), "config_timings.junk"),
        ("unlisted-config", undeclared({**honest, canonical_key({"B": 64, "num_warps": 8}): 30.0}),
         "not a config of"),
        ("negative-timing", undeclared({**honest, KEYS[1]: -5.0}), "config_timings"),
        ("zero-timing", undeclared({**honest, KEYS[1]: 0.0}), "config_timings"),
        ("slowest-forged-1e-300", undeclared({**honest, KEYS[2]: 1e-300}, winner=2), "latency_min_us"),
        ("timing-1e-300", undeclared({**honest, KEYS[1]: 1e-300}), "config_timings"),
        ("under-the-launch", undeclared({KEYS[0]: 0.1, KEYS[1]: 0.2}), "latency_min_us"),
        ("not-the-fastest", undeclared(honest, winner=2), "config"),
        ("median-not-its-timing", undeclared(honest, latency_us=6.0), "latency_median_us"),
        ("winner-untimed", undeclared({KEYS[1]: 15.0}, latency_us=12.0), "config_timings"),
        ("interpreter-1e-300", undeclared({KEYS[0]: 1e-300}, device=INTERPRETER_DEVICE), "latency_min_us"),
    ]


BAD_UNDECLARED = _bad_undeclared()


@pytest.mark.parametrize("body, field", [b[1:] for b in BAD_UNDECLARED], ids=[b[0] for b in BAD_UNDECLARED])
def test_an_undeclared_upload_without_physical_timings_is_refused(sqlite_writer: TestClient, sqlite_store: Store,
                                                                   body: dict[str, Any], field: str) -> None:
    assert sqlite_writer.post("/v1/kernels", json=DEFINITION, headers=AUTH).status_code == 201
    res = _post(sqlite_writer, body)
    assert res.status_code == 422, res.text
    assert field in res.json()["detail"], res.json()
    assert sqlite_store.list_records(include_history=True) == []


def test_the_gate_refuses_nonfinite_timings_the_api_never_sees() -> None:
    """NaN and infinity cannot cross the API as JSON; the gate refuses them all the same (the
    decorator's local store and `records import` reach it without the API)."""
    from kernelsearch.service.definitions import register_definition

    register_definition(DEFINITION)
    for bad in (math.nan, math.inf):
        body = undeclared({KEYS[0]: 12.0, KEYS[1]: bad})
        rec = RecordIn(**{**body, "tuned_at": record(KA, {"total_patches": 64}, 20.0).tuned_at})
        with pytest.raises(RecordRejected) as e:
            accepted(rec)
        assert e.value.field.startswith("config_timings"), e.value


def test_an_undeclared_upload_within_the_bounds_is_served_on_gpu_and_interpreter(writer: TestClient) -> None:
    assert writer.post("/v1/kernels", json=DEFINITION, headers=AUTH).status_code == 201
    ok = _post(writer, undeclared({KEYS[0]: 12.0, KEYS[1]: 15.0, KEYS[2]: None}))
    assert ok.status_code == 201, ok.text  # a failed config (null) is a timing too
    # The interpreter's wall clock has no launch floor: under a GPU's, above a nanosecond.
    interp = _post(writer, undeclared({KEYS[0]: GPU_LAUNCH_FLOOR_US / 2}, device=INTERPRETER_DEVICE))
    assert interp.status_code == 201, interp.text
    assert _post(writer, undeclared({KEYS[0]: GPU_LAUNCH_FLOOR_US / 2})).status_code == 422


def test_an_undeclared_upload_never_displaces_a_worker_record(writer: TestClient, store: Store) -> None:
    assert writer.post("/v1/kernels", json=DEFINITION, headers=AUTH).status_code == 201
    body = undeclared({KEYS[0]: 30.0, KEYS[1]: 40.0})
    worker = RecordIn(**{**body, "tuned_at": record(KA, {"total_patches": 64}, 20.0).tuned_at})
    view, _ = store.upsert_best(accepted(worker))
    assert view.origin == "worker" and view.is_current
    up = _post(writer, undeclared({KEYS[0]: 50.0, KEYS[1]: 1.0}, winner=1))
    assert up.status_code == 201 and up.json()["is_current"] is False
    served = writer.get("/v1/best", params={"kernel": NAME, "device": H200, **CASE}).json()
    assert served["config"] == canonical(CONFIGS[0]) and served["latency_us"] == 30.0


def _kb_upload(device: str, times_peak: float) -> dict[str, Any]:
    """A KB record whose latency claims `times_peak` x the H200's peak bandwidth."""
    axes = {"seq_len": 2851}
    lat = kernels.get_kernel(KB).bytes_moved(axes) / (times_peak * 4.8e12) * 1e6
    d = dataclasses.asdict(record(KB, axes, lat, device=device, roofline_pct=None,
                                  speedup_eager=None, speedup_compile=None))
    d["tuned_at"] = d["tuned_at"].isoformat()
    return d


@pytest.mark.parametrize("device", [H200, "NVIDIA H200 ", "NVIDIA  H200", "nvidia h200x",
                                    "NVIDIA-H200", "NVIDIA H2O0", "ＮＶＩＤＩＡ Ｈ２００"])
def test_a_declared_upload_past_the_devices_peak_is_refused_under_any_spelling(
        sqlite_writer: TestClient, sqlite_store: Store, device: str) -> None:
    for times in (9.9, 200.0, UPLOAD_PEAK_MARGIN * 1.05):
        res = _post(sqlite_writer, _kb_upload(device, times))
        assert res.status_code == 422 and "latency_min_us" in res.json()["detail"], (times, res.text)
    assert sqlite_store.list_records(include_history=True) == []
    ok = _post(sqlite_writer, _kb_upload(device, 0.8))  # what a copy reaches on the H200
    assert ok.status_code == 201, ok.text


def test_look_alike_names_are_bounded_as_the_device_they_resemble() -> None:
    assert peak_bandwidth("nvidia h200x") == peak_bandwidth("NVIDIA H200") == 4.8e12
    assert peak_bandwidth("NVIDIA H200 NVL") == 4.8e12
    assert peak_bandwidth("Some Future GPU") is None and peak_bandwidth(INTERPRETER_DEVICE) is None
    # A worker's measurement keeps the cache margin; an upload of the same does not.
    worker = record(KB, {"seq_len": 2851}, 15.0, device="nvidia  h200", roofline_pct=None,
                    speedup_eager=None, speedup_compile=None)
    assert accepted(worker).value.latency_min_us == worker.latency_min_us
    with pytest.raises(RecordRejected) as e:
        accepted(as_upload(worker, by=None, host=None))
    assert e.value.field == "latency_min_us"


def test_uploaded_from_is_the_requests_address_never_the_clients_claim(writer: TestClient) -> None:
    body = dataclasses.asdict(record(KA, {"total_patches": 64}, 20.0))
    body.update(tuned_at=body["tuned_at"].isoformat(), origin="worker", uploaded_by="root",
                uploaded_from="build-farm-1")
    got = _post(writer, body).json()
    assert (got["origin"], got["uploaded_by"], got["uploaded_from"]) == ("upload", "api-token", "testclient")


def test_a_definition_with_records_is_not_replaced_by_another_module(writer: TestClient, store: Store) -> None:
    assert writer.post("/v1/kernels", json=DEFINITION, headers=AUTH).status_code == 201
    assert writer.post("/v1/kernels", json=DEFINITION, headers=AUTH).status_code == 201  # idempotent
    other = {**DEFINITION, "module": "evil_pkg"}
    # Without records a definition may still move (a renamed module).
    assert writer.post("/v1/kernels", json=other, headers=AUTH).status_code == 201
    assert writer.post("/v1/kernels", json=DEFINITION, headers=AUTH).status_code == 201
    assert _post(writer, undeclared({KEYS[0]: 12.0})).status_code == 201
    for doc in (other, {**DEFINITION, "qualname": "k2"}):
        res = writer.post("/v1/kernels", json=doc, headers=AUTH)
        assert res.status_code == 409 and "has records" in res.json()["detail"], res.text
    assert store.kernel_definitions()[NAME]["module"] == "ks_upload_bounds_pkg"
    # The same module's kernel, edited (its source and configs), still updates its definition.
    edited = {**DEFINITION, "source_hash": "cd", "configs": CONFIGS + [canonical({"B": 32, "num_warps": 4})]}
    assert writer.post("/v1/kernels", json=edited, headers=AUTH).status_code == 201
    assert store.kernel_definitions()[NAME]["source_hash"] == "cd"
