"""One acceptance gate for a record (search_space.acceptance): what the upload route refuses,
`records import` refuses the same way, naming the field; an upload never outranks a worker's
record; a record can be withdrawn through the API and the CLI. Both backends."""
from __future__ import annotations

from trusted_records import trusted

import copy
import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from svc_helpers import H200, KA, KB, record, settings_for
from typer.testing import CliRunner

from kernelsearch import kernels
from kernelsearch.kernels import registry
from kernelsearch.db.store import Store
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.search_space.acceptance import RecordRejected, accepted
from kernelsearch.service.api import create_app
from kernelsearch.service.cli import app as cli_app

AXES = {"total_patches": 64}
AUTH = {"Authorization": "Bearer t"}
runner = CliRunner()


def _json(rec: Any) -> dict[str, Any]:
    d = dataclasses.asdict(rec)
    d["tuned_at"] = rec.tuned_at.isoformat()
    return d


def good_body(latency_us: float = 20.0, axes: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return _json(record(KA, axes or AXES, latency_us, **kw))


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d[field] = value
    return mutate


def _latency(v: float) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d.update(latency_median_us=v, latency_min_us=v, latency_max_us=v, latency_iqr_us=0.0)
    return mutate


def _config(**kw: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        d["config"] = {**d["config"], **kw}
    return mutate


# (id, mutation of a good record, the field the refusal names). Each was stored by the upload
# route before, and served by /v1/best as exact.
BAD = [
    ("config-evil", _set("config", {"BLOCK_P": 3, "EVIL": "x"}), "config"),
    ("config-empty", _set("config", {}), "config"),
    ("config-other-kernel", _set("config", kernels.get_kernel(KB).default_config), "config"),
    ("num-warps-1000", _config(num_warps=1000), "config.num_warps"),
    ("num-stages-0", _config(num_stages=0), "config.num_stages"),
    ("latency-1e-300", _latency(1e-300), "latency_min_us"),
    ("latency-1e-6", _latency(1e-6), "latency_min_us"),
    ("min-above-median", _set("latency_min_us", 25.0), "latency_max_us"),
    ("unknown-axis", _set("axes", {"total_patches": 64, "color": 1}), "axes"),
    ("rel-error-1e300", _set("rel_error", 1e300), "rel_error"),
    ("rel-error-above-rtol", _set("rel_error", 3e-5), "rel_error"),
    ("roofline-1e6", _set("roofline_pct", 1e6), "roofline_pct"),
    ("speedup-1e9", _set("speedup_eager", 1e9), "speedup_eager"),
    ("speedup-not-the-ratio", lambda d: d.update(eager_latency_us=100.0, speedup_eager=50.0),
     "speedup_eager"),
    ("work-zero", _set("work", 0.0), "work"),
    # One `work` (KernelDef.work): a record claiming another size would rank cases differently.
    ("work-not-the-kernels", lambda d: d.update(work=d["work"] * 2), "work"),
    ("tuned-before-era", _set("tuned_at", "1999-01-01T00:00:00+00:00"), "tuned_at"),
    ("tuned-in-future", _set("tuned_at", "2999-01-01T00:00:00+00:00"), "tuned_at"),
    ("tuned-at-overflow-low", _set("tuned_at", "0001-01-01T00:00:00+23:59"), "tuned_at"),
    ("tuned-at-overflow-high", _set("tuned_at", "9999-12-31T23:59:59-23:59"), "tuned_at"),
    ("origin-unknown", _set("origin", "admin"), "origin"),
]


@pytest.fixture
def writer(store: Store) -> Iterator[TestClient]:
    """A client of a service whose writes need the token "t"."""
    with TestClient(create_app(settings_for(store.url, api_token=SecretStr("t")), store=store)) as c:
        yield c


def _best(c: TestClient) -> Any:
    return c.get("/v1/best", params={"kernel": KA, "device": H200, **AXES})


@pytest.mark.parametrize("mutate, field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_upload_route_refuses_a_bad_record_naming_the_field(writer: TestClient, store: Store,
                                                             mutate, field: str) -> None:
    body = good_body()
    mutate(body)
    res = writer.post("/v1/records", json=body, headers=AUTH)
    assert res.status_code == 422, res.text
    got = res.json()
    assert set(got) == {"detail", "errors"} and field in got["detail"], got
    assert any(field in ".".join(map(str, e["loc"])) for e in got["errors"]), got
    assert store.list_records(include_history=True) == []
    assert _best(writer).status_code == 404


def test_upload_of_an_unknown_kernel_is_404(writer: TestClient) -> None:
    res = writer.post("/v1/records", json={**good_body(), "kernel": "nope"}, headers=AUTH)
    assert res.status_code == 404 and "unknown kernel 'nope'" in res.json()["detail"]


def _import(url: str, doc: dict[str, Any], tmp_path) -> Any:
    f = tmp_path / "records.json"
    f.write_text(json.dumps(doc))
    return runner.invoke(cli_app, ["records", "import", "--url", url, str(f)])


def _doc(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"schema": "kernelsearch.records", "version": 2, "records": list(entries)}


@pytest.mark.parametrize("mutate, field", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_records_import_refuses_the_same_records(store: Store, tmp_path, mutate, field: str) -> None:
    entry = good_body()
    mutate(entry)
    res = _import(store.url, _doc(good_body(21.0, axes={"total_patches": 128}), entry), tmp_path)
    assert res.exit_code == 1, res.output
    assert f"records[1].{field}" in res.stderr and "Traceback" not in res.output, res.stderr
    # The refused entry is named; the good one goes in.
    assert [r.axes for r in store.list_records(include_history=True)] == [{"total_patches": 128}]


def test_a_good_record_is_accepted_by_the_route_and_by_import(writer: TestClient, store: Store,
                                                              tmp_path) -> None:
    res = writer.post("/v1/records", json=good_body(), headers=AUTH)
    assert res.status_code == 201, res.text
    assert _best(writer).json()["match"] == "exact"
    entry = good_body(30.0, axes={"total_patches": 128})
    del entry["origin"]  # a file that does not say where its records came from
    doc = _doc(entry)
    res = _import(store.url, doc, tmp_path)
    assert res.exit_code == 0 and "added: 1" in res.stdout, res.output
    origins = {json.dumps(r.axes): r.origin for r in store.list_records()}
    assert origins == {json.dumps(AXES): "upload", json.dumps({"total_patches": 128}): "import"}


def test_an_upload_is_marked_and_never_outranks_a_worker_record(writer: TestClient,
                                                                store: Store) -> None:
    worker, _ = store.upsert_best(trusted(record(KA, AXES, 20.0)))
    assert worker.origin == "worker"
    body = good_body(5.0)
    body.update(origin="worker", uploaded_by="root", uploaded_from="laptop-7")  # claims ignored
    res = writer.post("/v1/records", json=body, headers=AUTH)
    assert res.status_code == 201, res.text
    up = res.json()
    # The request's address names where it came from, whatever the body says.
    assert (up["origin"], up["uploaded_by"], up["uploaded_from"]) == ("upload", "api-token", "testclient")
    assert up["is_current"] is False
    assert _best(writer).json()["latency_us"] == 20.0


def test_uploads_compete_among_themselves_and_a_worker_record_replaces_them(client: TestClient,
                                                                           store: Store) -> None:
    first = client.post("/v1/records", json=good_body(10.0))
    assert first.status_code == 201 and first.json()["is_current"] is True
    assert first.json()["uploaded_by"] == "anonymous"
    faster = client.post("/v1/records", json=good_body(8.0)).json()
    assert faster["is_current"] is True
    # A worker's measurement, slower than the upload, is served in its place.
    view, improved = store.upsert_best(trusted(record(KA, AXES, 12.0)))
    assert improved and view.is_current
    assert _best(client).json()["latency_us"] == 12.0


def test_withdraw_through_the_route_serves_the_history_then_nothing(writer: TestClient,
                                                                    store: Store) -> None:
    old, _ = store.upsert_best(trusted(record(KA, AXES, 20.0)))
    new, _ = store.upsert_best(trusted(record(KA, AXES, 10.0, study_name="second")))
    assert _best(writer).json()["latency_us"] == 10.0  # cached now
    assert writer.delete(f"/v1/records/{new.id}").status_code == 401
    res = writer.delete(f"/v1/records/{new.id}", headers=AUTH)
    assert res.status_code == 200, res.text
    assert res.json()["withdrawn"]["id"] == new.id and res.json()["now_current"]["id"] == old.id
    assert _best(writer).json()["latency_us"] == 20.0
    again = writer.delete(f"/v1/records/{new.id}", headers=AUTH)
    assert again.status_code == 404 and set(again.json()) == {"detail", "errors"}
    res = writer.delete(f"/v1/records/{old.id}", headers=AUTH)
    assert res.status_code == 200 and res.json()["now_current"] is None
    assert _best(writer).status_code == 404
    assert writer.delete("/v1/records/0", headers=AUTH).status_code == 422


def test_records_delete_cli(store: Store) -> None:
    old, _ = store.upsert_best(trusted(record(KA, AXES, 20.0)))
    new, _ = store.upsert_best(trusted(record(KA, AXES, 10.0, study_name="second")))
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url, str(new.id)])
    assert res.exit_code == 0, res.output
    assert f"withdrawn: {new.id}" in res.stdout and f"now current: {old.id}" in res.stdout
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url, str(new.id)])
    assert res.exit_code == 1 and f"record {new.id}: no such record" in res.stderr
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url, "--kernel", KA,
                                  "--device", H200, "--case", "total_patches=64"])
    assert res.exit_code == 0 and "now current: none" in res.stdout, res.output
    assert store.list_records(include_history=True) == []
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url, "--kernel", KA,
                                  "--device", H200, "--case", "total_patches=64"])
    assert res.exit_code == 1 and "no current record" in res.stderr
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url])
    assert res.exit_code == 1 and "give record ids" in res.stderr
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url, "1", "--kernel", KA])
    assert res.exit_code == 1 and "not both" in res.stderr
    res = runner.invoke(cli_app, ["records", "delete", "--url", store.url, "--kernel", KA,
                                  "--device", H200, "--case", "total_patches"])
    assert res.exit_code == 1 and "--case" in res.stderr


def test_the_gate_skips_what_the_declaration_cannot_answer() -> None:
    """A kernel without bytes_moved (an undeclared one) has no memory bound, only the launch
    floor on a GPU (none under the interpreter's wall clock); an unknown device only the
    universal bound; the other checks still apply."""
    k = kernels.get_kernel(KB)
    rec = record(KB, {"seq_len": 2851}, 0.05, device=INTERPRETER_DEVICE)  # 143 MB at 1000 TB/s: 0.14 us
    with pytest.raises(RecordRejected) as e:
        accepted(rec)
    assert e.value.field == "latency_min_us" and "bytes" in e.value.reason
    nobytes = dataclasses.replace(k, name="ks_test_no_bytes", bytes_moved=None)  # type: ignore[arg-type]
    kernels.register(nobytes)
    try:
        assert accepted(dataclasses.replace(rec, kernel=nobytes.name)).value.latency_min_us == rec.latency_min_us
        with pytest.raises(RecordRejected) as e:
            accepted(dataclasses.replace(rec, kernel=nobytes.name, device=H200))
        assert e.value.field == "latency_min_us" and "launch" in e.value.reason
        with pytest.raises(RecordRejected) as e:
            accepted(dataclasses.replace(rec, kernel=nobytes.name, config={}))
        assert e.value.field == "config"
    finally:
        registry.unregister(nobytes.name)
    # 0.5 us for this case is within any device's reach but past 10 x an H200's HBM.
    fast = record(KB, {"seq_len": 2851}, 0.5)
    with pytest.raises(RecordRejected):
        accepted(fast)
    assert accepted(dataclasses.replace(fast, device="Some Future GPU")).value.device == "Some Future GPU"


def test_upload_of_the_shared_record_goes_through_the_gate(monkeypatch) -> None:
    """The decorator's sharing (BACKENDS.upload) refuses what the gate refuses, before any
    backend sees it."""
    from kernelsearch import backends

    monkeypatch.setattr(backends.BACKENDS, "ensure", lambda: pytest.fail("a refused record reached a backend"))
    bad = copy.deepcopy(record(KA, AXES, 20.0, rel_error=1.0))
    assert backends.BACKENDS.upload(bad) is False


def test_the_tuner_record_goes_through_the_gate() -> None:
    """search_space.records.best_record gives only what the gate accepts: a best trial whose
    error is above the kernel's tolerance never becomes a record."""
    from types import SimpleNamespace

    from kernelsearch.search_space.records import BestTrial, best_record

    runner_ = SimpleNamespace(versions={"torch": "2", "triton": "3"}, device_info=None, on_gpu=False)
    cfg = kernels.get_kernel(KA).default_config

    def best(rel_error: float) -> BestTrial:
        return BestTrial(kernel=KA, axes=dict(AXES), device=H200, study_name="s", latency_us=20.0,
                         config=cfg, outcome={"timing": {"method": "interpreter-wallclock"},
                                              "rel_errors": {"benchmark": rel_error}},
                         n_trials=3, n_failed=0)

    ok = best_record(best(1e-7), runner_, job_id=None, reference="none",  # type: ignore[arg-type]
                     copy_bandwidth=None, measure_n=1)
    assert ok.value.config == cfg and ok.value.origin == "worker"
    with pytest.raises(RecordRejected) as e:
        best_record(best(0.5), runner_, job_id=None, reference="none",  # type: ignore[arg-type]
                    copy_bandwidth=None, measure_n=1)
    assert e.value.field == "rel_error"
