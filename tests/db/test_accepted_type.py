"""The store takes only what the acceptance gate passed (`db.views.Accepted`), identifies a record
by its canonical config, and picks "nearest" by the one rule the service uses."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import KERNEL, make_record
from trusted_records import trust_check, trusted

from kernelsearch.db.store import Store
from kernelsearch.db.wire import EXPORT_SCHEMA, EXPORT_VERSION
from kernelsearch.db.views import Accepted
from kernelsearch.kernels.resolve import Key, nearest_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_store_refuses_a_record_the_gate_has_not_seen(sqlite_store: Store) -> None:
    rec = make_record(10.0)
    with pytest.raises(TypeError, match="rec: expected Accepted"):
        sqlite_store.upsert_best(rec)  # type: ignore[arg-type]
    doc = {"schema": EXPORT_SCHEMA, "version": EXPORT_VERSION, "records": [
        {**dataclasses.asdict(rec), "tuned_at": rec.tuned_at.isoformat()}]}
    with pytest.raises(TypeError, match="check: expected Accepted"):
        sqlite_store.import_records(doc, check=lambda r: r)  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError):
        sqlite_store.import_records(doc)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="entry: expected Accepted"):
        sqlite_store.put_helion_entry(object())  # type: ignore[arg-type]
    assert not sqlite_store.has_records()
    assert sqlite_store.import_records(doc, check=trust_check).added == 1


def test_only_the_gate_makes_an_accepted_record() -> None:
    with pytest.raises(TypeError, match="only the acceptance gate"):
        Accepted(make_record(10.0), object())
    got = trusted(make_record(10.0))
    with pytest.raises(AttributeError):
        got._value = make_record(1.0)  # type: ignore[misc]
    # The gate's copy: changing the record afterwards changes nothing the store would write.
    got.value.config["BLOCK_P"] = 4096
    assert got.value.config["BLOCK_P"] == 32


def test_no_module_but_the_gate_names_the_token() -> None:
    holders = sorted(str(p.relative_to(ROOT)) for folder in ("kernels", "db", "search_space", "service", "docs")
                     for p in (ROOT / folder).rglob("*.py") if "_GATE_TOKEN" in p.read_text(errors="replace"))
    assert holders == ["db/views.py", "search_space/acceptance.py"]


def test_one_config_spelt_two_ways_is_one_record(store: Store) -> None:
    first, new = store.upsert_best(trusted(make_record(10.0, config={"BLOCK_P": 32, "num_warps": 4})))
    again, improved = store.upsert_best(trusted(make_record(
        10.0, config={"num_ctas": 1, "num_stages": 3, "num_warps": 4, "BLOCK_P": 32})))
    assert new and not improved and again.id == first.id
    assert len(store.record_history(KERNEL, first.device, first.axes)) == 1


def test_a_tie_is_served_as_the_service_serves_it(store: Store) -> None:
    """Two cases at the same distance: the store's pick is the one `nearest_of` (the service's
    snapshot) makes, whichever was stored first."""
    for n in (96, 32):  # the later case first: a tie-break by row id would pick it
        store.upsert_best(trusted(make_record(10.0, axes={"total_patches": n})))
    query = {"total_patches": 64}

    def near(other: dict) -> float:
        return float(abs(other["total_patches"] - query["total_patches"]))

    got = store.find_best(KERNEL, "NVIDIA H200", query, lambda ax, _w: near(ax))
    assert got is not None and got[1] == "nearest"
    snap = {tuple(sorted(r.axes.items())): r for r in store.list_records()}
    pick = nearest_of(Key.of(KERNEL, query, "NVIDIA H200"), near, snap)
    assert pick is not None and dict(pick[0]) == got[0].axes
    # '{"total_patches":32}' sorts before '{"total_patches":96}'.
    assert got[0].axes == {"total_patches": 32}
