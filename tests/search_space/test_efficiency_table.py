"""`python -m kernelsearch_tools.efficiency --table`: the search experiment over a kernelsearch_tools.explore JSON.

A tiny synthetic table for workload B (no GPU): a product grid ROWS x BLOCK_D x num_warps, one
row of it wrong, one that today's kernel rejects (a register-spill rule) and one extra row outside
the grid (HEADS=4); the two off-grid rows are the table's fastest, so a ground truth or a sampler
that strayed off the grid would show.
"""
from __future__ import annotations

import itertools
import json

from kernelsearch.kernels import get_kernel
from kernelsearch_tools.efficiency import main

B = "vision_rope3d_spatial_merge_bwd"
CASES = (2, 4)  # seq_len 211 and 128
BASE = {"HEADS": 16, "GRID": "tiles", "CACHE": "none", "STORE": "none", "TRIG": "approx_rr",
        "num_stages": 1}


def _timing(us: float) -> dict:
    return {"median_us": us, "min_us": us - 0.1, "max_us": us + 0.2, "q1_us": us - 0.05,
            "q3_us": us + 0.05, "iqr_us": 0.1, "n": 10, "method": "cupti"}


def _row(cfg: dict, us: float | None) -> dict:
    if us is None:
        return {"config": cfg, "ok": False, "errors": {"benchmark": 0.5, "realistic": 0.5}}
    return {"config": cfg, "ok": True, "errors": {"benchmark": 1e-7, "realistic": 2e-7},
            "n_regs": 40, "n_spills": 0, "shared_bytes": 0, "timing": _timing(us)}


def _table(path) -> dict[int, dict]:
    """Writes the JSON; returns, per case, the expected grid {config key: latency or None}."""
    k = get_kernel(B)
    cases, expect = [], {}
    for n in CASES:
        scale = 1.0 + n / 10
        rows, grid = [], {}
        for r, bd, w in itertools.product((1, 2), (16, 32), (1, 2)):
            if (r, bd, w) == (2, 32, 1):
                # Rejected by today's kernel (256 inputs a thread spill): as from an older kernel.
                rows.append(_row({**BASE, "ROWS": r, "BLOCK_D": bd, "num_warps": w}, 1.0))
                continue
            cfg = k.validate_config({**BASE, "ROWS": r, "BLOCK_D": bd, "num_warps": w})
            # Case 2 is fastest at (2, 16, 2), case 4 at (1, 32, 2); neither is the default.
            us = scale * (10 + abs(r - (2 if n == 2 else 1)) + abs(bd - (16 if n == 2 else 32)) / 8
                          + abs(w - 2) * 0.5)
            us = None if (r, bd, w) == (1, 16, 1) else round(us, 3)
            rows.append(_row(cfg, us))
            grid[json.dumps(cfg, sort_keys=True)] = us
        rows.append(_row(k.validate_config({**BASE, "HEADS": 4, "ROWS": 1, "BLOCK_D": 16,
                                            "num_warps": 2}), 0.5))
        cases.append({"case": n, "axes": dict(k.case(n).axes), "roofline_us": 1.0, "rows": rows})
        expect[n] = grid
    doc = {"device": {"name": "NVIDIA H200", "compute_capability": "9.0", "interpreter": False},
           "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
           "copy_bandwidth_Bps": 4.2e12,
           "kernels": {B: {"compile_s": 1.0, "compile_failures": {}, "cases": cases}}}
    path.write_text(json.dumps(doc))
    return expect


def test_table_replay_stays_on_the_grid_and_warm_starts_from_the_other_case(tmp_path):
    from kernelsearch.db.store import Store

    src = tmp_path / "explore_b.json"
    expect = _table(src)
    out = tmp_path / "out"
    url = f"sqlite:///{tmp_path / 'eff.db'}"
    assert main(["--mode", "search", "--table", str(src), "--out", str(out), "--seeds", "2",
                 "--replay-fraction", "1.0", "--db", url]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert (out / "best_so_far.png").stat().st_size > 0
    assert doc["device"]["name"] == "NVIDIA H200" and doc["search"]["source"] == "table"
    kd = doc["search"]["kernels"][B]
    space = {p["name"]: p["choices"] for p in kd["space"]["params"]}
    assert space["ROWS"] == [1, 2] and space["BLOCK_D"] == [16, 32] and space["HEADS"] == [16]
    assert space["num_warps"] == [1, 2] and space["GRID"] == ["tiles"]
    assert kd["grid_size"] == 7 and kd["rows_dropped"] == len(CASES)  # 8 in the product, 1 rejected
    k = get_kernel(B)
    assert len(kd["cases"]) == len(CASES)
    for n in CASES:
        case = kd["cases"][f"seq_len={k.case(n).axes['seq_len']}"]
        lat = [v for v in expect[n].values() if v is not None]
        # Ground truth: the table's best over the grid, not the faster off-grid rows.
        assert case["grid"]["best_us"] == min(lat)
        assert case["table_best_us"] == 0.5 and case["table_best_in_grid"] is False  # HEADS=4
        assert sorted(v for v in case["grid"]["history"] if v is not None) == sorted(lat)
        assert case["grid"]["history"].count(None) == 1
        for variant in ("tpe_warm", "tpe_cold", "random"):
            runs = case[variant]["runs"]
            assert len(runs) == 2
            for r in runs:
                # Every answer comes from the grid's rows of this case, each config at most once.
                assert set(v for v in r["history"] if v is not None) <= set(lat)
                assert len(r["history"]) <= 7 and r["trials_to_within"] is not None
                assert r["trials_to_within"] == next(
                    i for i, _ in enumerate(r["history"], 1)
                    if min(v for v in r["history"][:i] if v is not None) <= min(lat) * 1.03)
        # Warm start: the default config, then the other case's grid best (a record in the store).
        assert all(r["warm_started"] == 2 for r in case["tpe_warm"]["runs"])
        assert all(r["warm_started"] == 0 for r in case["tpe_cold"]["runs"])
    store = Store(url)
    try:
        recs = store.list_records(B, "NVIDIA H200")
    finally:
        store.close()
    assert len(recs) == len(CASES)
    for r in recs:
        n = next(c for c in CASES if dict(k.case(c).axes) == dict(r.axes))
        best = min((v, key) for key, v in expect[n].items() if v is not None)
        assert r.latency_median_us == best[0] and r.config == json.loads(best[1])
        assert r.timing_method == "cupti" and r.triton_version == "3.6.0"
        assert r.work == float(k.bytes_moved(dict(r.axes))) and r.n_trials == 7 and r.n_failed == 1
