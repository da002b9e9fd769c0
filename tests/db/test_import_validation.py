"""Imports refuse, whole and naming the entry, what either backend would not store as given or
what the kernel does not declare; any valid SQLite export loads into PostgreSQL."""
from __future__ import annotations

from trusted_records import trust_check, trusted

import copy
import dataclasses
import json
import re
from typing import Any, Callable

import pytest
from helpers import make_record
from typer.testing import CliRunner

from kernelsearch import kernels
from kernelsearch.db.engine import upgrade
from kernelsearch.db.errors import ImportRejected
from kernelsearch.db.store import Store
from kernelsearch.service.cli import app

KB = "vision_rope3d_spatial_merge_bwd"
KA = "vision_rope_generation_bwd"
runner = CliRunner()


def _doc(tmp_path, **kw: Any) -> dict[str, Any]:
    """A valid two-entry export of kernel B (its default config) from a SQLite store, as JSON
    reads it back."""
    k = kernels.get_kernel(KB)
    url = f"sqlite:///{tmp_path / 'src.db'}"
    upgrade(url)
    with Store(url) as src:
        for n, axes in enumerate(({"seq_len": 128}, {"seq_len": 2851})):
            src.upsert_best(trusted(make_record(20.0 + n, kernel=KB, axes=axes, work=k.bytes_moved(axes),
                                        config=k.default_config, minutes=n,
                                        device_info={"name": "NVIDIA H200"}, **kw)))
        return json.loads(json.dumps(src.export_records(include_history=True)))


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A mutation of entry 1 (entry 0 stays valid, so a half import would show)."""
    def mutate(doc: dict) -> None:
        target = doc["records"][1]
        *parents, last = path.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[last] = value
    return mutate


# Each is refused on both backends; before, PostgreSQL raised a driver traceback for the widths,
# NUL, surrogates and NaN in JSON, and SQLite stored them.
STORE_LEVEL = [
    (lambda d: d.update(version=True), "version"),
    (_set("n_trials", True), r"records\[1\]\.n_trials"),
    (_set("n_failed", 1.0), r"records\[1\]\.n_failed"),
    (_set("latency_median_us", True), r"records\[1\]\.latency_median_us"),
    (_set("work", "1024"), r"records\[1\]\.work"),
    (_set("latency_median_us", float("nan")), r"records\[1\]\.latency_median_us: not a finite"),
    (_set("latency_max_us", float("inf")), r"records\[1\]\.latency_max_us"),
    (_set("latency_min_us", -1.0), r"records\[1\]\.latency_min_us"),
    (_set("tuned_at", 0), r"records\[1\]\.tuned_at"),
    (_set("device", "G" * 201), r"records\[1\]\.device"),
    (_set("kernel", "k" * 1001), r"records\[1\]\.kernel"),
    (_set("torch_version", "2" * 65), r"records\[1\]\.torch_version"),
    (_set("source_hash", "a" * 129), r"records\[1\]\.source_hash"),
    (_set("study_name", "s" * 301), r"records\[1\]\.study_name"),
    (_set("axes", {"x" * 600: 1}), r"records\[1\]\.axes"),
    (_set("n_trials", 2**31), r"records\[1\]\.n_trials"),
    (_set("job_id", 2**31), r"records\[1\]\.job_id"),
    (_set("device_info.cuda_version", "1" * 33), r"records\[1\]\.device_info\.cuda_version"),
    (_set("device_info.memory_bytes", 2**63), r"records\[1\]\.device_info\.memory_bytes"),
    (_set("device_info.multiprocessors", "132"), r"records\[1\]\.device_info\.multiprocessors"),
    (_set("device_info.note", float("nan")), r"records\[1\]\.device_info\.note"),
    (_set("device", "NVIDIA\x00H200"), r"records\[1\]\.device: text holds a NUL"),
    (_set("config", {"ROWS": "\ud800"}), r"records\[1\]\.config\.ROWS: text holds a lone surrogate"),
    (_set("config", {"\ud800": 1}), r"records\[1\]\.config: a field name"),
]


@pytest.mark.parametrize("mutate, expected", STORE_LEVEL)
def test_import_refuses_what_a_backend_would_not_store(store: Store, tmp_path, mutate,
                                                      expected: str) -> None:
    doc = _doc(tmp_path)
    mutate(doc)
    with pytest.raises(ImportRejected, match=expected):
        store.import_records(doc, check=trust_check)
    assert store.list_records(include_history=True) == []


def test_upsert_refuses_an_over_long_device_on_both_backends(store: Store) -> None:
    with pytest.raises(ValueError, match=r"rec\.device"):
        store.upsert_best(trusted(make_record(3.0, device="G" * 201)))
    assert store.list_records(include_history=True) == []


def test_a_sqlite_export_at_the_widths_loads_into_either_backend(tmp_path, store: Store) -> None:
    src_url = f"sqlite:///{tmp_path / 'wide.db'}"
    upgrade(src_url)
    wide: dict[str, Any] = dict(device="é" * 200, torch_version="t" * 64, triton_version="3" * 64,
                source_hash="h" * 128, study_name="ß" * 300, job_id=2**31 - 1,
                device_info={"name": "é" * 200, "compute_capability": "9" * 16,
                             "memory_bytes": 2**63 - 1, "multiprocessors": 2**31 - 1,
                             "cuda_version": "c" * 32, "driver_version": "d" * 32,
                             "interpreter": False, "l2_bytes": 62914560, "note": "κ"})
    with Store(src_url) as src:
        src.upsert_best(trusted(dataclasses.replace(make_record(5.0, kernel=KA), **wide)))
        doc = json.loads(json.dumps(src.export_records(include_history=True)))
    rep = store.import_records(doc, check=trust_check)
    assert (rep.added, rep.unchanged) == (1, 0)
    (got,) = store.list_records()
    assert (got.device, got.study_name, got.job_id) == (wide["device"], wide["study_name"], 2**31 - 1)
    assert got.device_info == wide["device_info"], "device_info is kept as given"


# -- the kernel's declaration, through `records import` ------------------------------------------
KERNEL_LEVEL = [
    (_set("kernel", "nope"), r"records\[1\]\.kernel: unknown kernel 'nope'"),
    (_set("axes", {"seq_len": -3}), r"records\[1\]\.axes: .*outside"),
    (_set("axes", {"seq_len": 0}), r"records\[1\]\.axes: .*outside"),
    (_set("axes", {"rows": 8}), r"records\[1\]\.axes: .*unknown axis 'rows'"),
    (_set("axes", {"seq_len": 8, "color": 1}), r"records\[1\]\.axes: .*unknown axis 'color'"),
    (_set("config", {"ROWS": 3}), r"records\[1\]\.config: .*'ROWS' does not accept 3"),
    (_set("config", {"BLOCK_P": 32}), r"records\[1\]\.config: .*unknown parameter 'BLOCK_P'"),
    (_set("config", {"ROWS": 8}), r"records\[1\]\.config: .*per thread"),
    (_set("config", {"ROWS": True}), r"records\[1\]\.config"),
]


def _import(url: str, doc: dict, tmp_path, *flags: str) -> Any:
    f = tmp_path / "records.json"
    f.write_text(json.dumps(doc))
    return runner.invoke(app, ["records", "import", "--url", url, *flags, str(f)])


@pytest.mark.parametrize("mutate, expected", KERNEL_LEVEL)
def test_cli_import_checks_entries_against_the_kernel(store: Store, tmp_path, mutate,
                                                     expected: str) -> None:
    """A refused entry is named while the others go in (exit 1); --all-or-nothing stores none."""
    doc = _doc(tmp_path)
    mutate(doc)
    res = _import(store.url, doc, tmp_path, "--all-or-nothing")
    assert res.exit_code == 1, res.output
    assert re.search(expected, res.stderr), res.stderr
    assert store.list_records(include_history=True) == []
    res = _import(store.url, doc, tmp_path)
    assert res.exit_code == 1 and re.search(expected, res.stderr), res.output
    assert "added: 1" in res.stdout and "rejected: 1" in res.stdout
    assert [r.axes for r in store.list_records(include_history=True)] == [doc["records"][0]["axes"]]


def test_cli_import_refuses_an_impossible_latency(store: Store, tmp_path) -> None:
    # The harm reported: a config "measured" at 1e-6 us replaced the real seq_len 2851 record.
    doc = _doc(tmp_path)
    good = copy.deepcopy(doc)
    assert _import(store.url, good, tmp_path).exit_code == 0
    doc["records"][1].update(latency_median_us=1e-6, latency_min_us=1e-6, latency_max_us=1e-6,
                             latency_iqr_us=0.0, tuned_at="2027-01-01T00:00:00+00:00")
    res = _import(store.url, doc, tmp_path)
    assert res.exit_code == 1 and "records[1].latency_min_us" in res.stderr, res.stderr
    assert "not a measurement" in res.stderr
    assert sorted(r.latency_median_us for r in store.list_records()) == [20.0, 21.0]


def test_cli_import_refuses_axes_that_do_not_key_a_case(store: Store, tmp_path) -> None:
    k = kernels.get_kernel(KA)
    axes = {"total_patches": 64}
    store.upsert_best(trusted(make_record(3.0, kernel=KA, axes=axes, work=k.bytes_moved(axes),
                                  config=k.default_config)))
    doc = json.loads(json.dumps(store.export_records()))
    doc["records"][0]["axes"] = {"total_patches": 64, "num_images": 2}
    res = _import(store.url, doc, tmp_path)
    assert res.exit_code == 1 and "records[0].axes" in res.stderr and "num_images" in res.stderr


def test_cli_import_of_a_valid_file_still_works(store: Store, tmp_path) -> None:
    doc = _doc(tmp_path)
    res = _import(store.url, doc, tmp_path)
    assert res.exit_code == 0, res.output
    assert "added: 2" in res.stdout


# -- item 10: export of an unknown selection, `db current` on a missing file ----------------------
def test_export_of_an_unknown_kernel_or_device_fails(store: Store, tmp_path) -> None:
    store.upsert_best(trusted(make_record(3.0)))
    out = tmp_path / "out.json"
    res = runner.invoke(app, ["records", "export", "--url", store.url, "--kernel", "foo", str(out)])
    assert res.exit_code == 1 and "unknown kernel 'foo'" in res.stderr and KA in res.stderr
    assert not out.exists()
    res = runner.invoke(app, ["records", "export", "--url", store.url, "--device", "B200", str(out)])
    assert res.exit_code == 1 and "no device 'B200'" in res.stderr and "NVIDIA H200" in res.stderr
    assert not out.exists()


def test_export_of_a_valid_empty_selection_says_so(store: Store, tmp_path) -> None:
    store.upsert_best(trusted(make_record(3.0)))  # kernel A only
    out = tmp_path / "out.json"
    res = runner.invoke(app, ["records", "export", "--url", store.url, "--kernel", KB, str(out)])
    assert res.exit_code == 0, res.output
    assert "exported: 0 records" in res.stderr and f"no current records of kernel {KB!r}" in res.stderr
    assert json.loads(out.read_text())["records"] == []


@pytest.mark.parametrize("args", [["db", "current"], ["db", "current", "--check"],
                                  ["records", "list"], ["records", "export", "-"]])
def test_commands_on_a_missing_sqlite_file_create_nothing(tmp_path, args: list[str]) -> None:
    path = tmp_path / "no" / "such" / "ks.db"
    res = runner.invoke(app, [*args, "--url", f"sqlite:///{path}"])
    assert res.exit_code == 1, res.output
    assert f"no database at {path}" in res.stderr and "kernelsearch db upgrade" in res.stderr
    assert not path.exists() and not (tmp_path / "no").exists()
