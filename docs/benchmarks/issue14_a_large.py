"""Issue 14 on the H200: workload A from 65,536 to 4,194,304 patches against the copy roofline,
the suite means, and the error of given configs over the input domain (magnitudes, angles).

    python3 docs/benchmarks/issue14_a_large.py --out DIR [--n 30] [--configs FILE.json]
        [--records FILE.json] [--suite] [--check domain|base|none] [--max-configs N]

Timing is kernelsearch's (kernels.measure: L2 flushed before every call, CUPTI span of the
call's kernels, median of n), the roofline bytes over the device-to-device copy bandwidth
measured in the same run. `--configs` is a JSON list of A configs (the built-in candidates
otherwise); `--records` an exported records file (`kernelsearch records export`) whose configs
get the error table, on this checkout's code. Writes DIR/large.json, DIR/suite.json,
DIR/errors.json and prints the tables.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

try:
    from kernelsearch import kernels
    from kernelsearch.kernels.check import InputCache, check_config, rel_error
    from kernelsearch.kernels.errors import KernelSearchError, classify
    from kernelsearch.kernels.measure import copy_bandwidth, time_calls
    from kernelsearch.kernels.runtime import runtime_of
except ImportError as exc:  # pragma: no cover - a message instead of a traceback
    sys.exit(f"issue14_a_large: install kernelsearch first (pip install -e .): {exc}")

A_NAME = "vision_rope_generation_bwd"
B_NAME = "vision_rope3d_spatial_merge_bwd"
SIZES = (65536, 262144, 1048576, 4194304)
SCALES = (1e-30, 1e-20, 1e-14, 1e-10, 1e-5, 1e5, 1e10, 1e12, 1e20, 1e30)
ANGLE_POSITIONS = (1000, 10000, 100000, 131072)
DEV = torch.device("cuda")


def candidates() -> list[dict[str, Any]]:
    """The kernel default, the space's seeds (the suite cases' winners), the widest
    non-persistent tilings, and a persistent sweep (on the default REDUCE=hybrid), with fixed and
    hybrid twins of the best persistent and SLOTS=spread candidates."""
    from kernelsearch.search_space.space import get_space

    out: list[dict[str, Any]] = [{}] + [dict(cfg) for cfg, _ in get_space(A_NAME).seeds]
    for bp, tiles, nw in ((64, 4, 4), (64, 16, 4), (128, 4, 8), (128, 16, 8)):
        out.append({"BLOCK_P": bp, "TILES": tiles, "COLS": "split64", "num_warps": nw})
    for bp, cols, pps, nw, pipe in itertools.product((64, 128, 256), ("split64", "quarters"),
                                                     (1, 2, 4, 8), (4, 8), ("none", "prefetch")):
        out.append({"BLOCK_P": bp, "COLS": cols, "GRID": "persistent", "PROGRAMS_PER_SM": pps,
                    "num_warps": nw, "PIPELINE": pipe})
    for reduce in ("fixed", "hybrid"):
        for pps in (1, 2, 4):
            for slots in ("line", "spread"):
                out.append({"BLOCK_P": 128, "COLS": "split64", "GRID": "persistent",
                            "PROGRAMS_PER_SM": pps, "num_warps": 8, "SLOTS": slots,
                            "REDUCE": reduce})
        for bp in (8, 16):
            for slots in ("line", "spread"):
                out.append({"BLOCK_P": bp, "SLOTS": slots, "REDUCE": reduce})
    for reduce in ("ticket", "ticket2"):
        out.append({"BLOCK_P": 128, "COLS": "split64", "GRID": "persistent",
                    "PROGRAMS_PER_SM": 2, "num_warps": 8, "REDUCE": reduce})
    out.append({"BLOCK_P": 128, "COLS": "split64", "GRID": "persistent", "PROGRAMS_PER_SM": 2,
                "num_warps": 8, "TRIG": "precise"})
    return out


def valid(kdef: Any, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen, out, skipped = set(), [], 0
    for c in configs:
        try:
            full = kdef.validate_config(c)
        except KernelSearchError:
            skipped += 1  # the kernel's register rules refuse it
            continue
        key = json.dumps(full, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(full)
    if skipped:
        print(f"{skipped} candidates refused by the kernel's rules")
    return out


def label(kdef: Any, cfg: dict[str, Any]) -> str:
    d = kdef.default_config
    return " ".join(f"{k}={v}" for k, v in cfg.items() if d.get(k) != v) or "default"


def time_configs(kdef: Any, axes: dict[str, int], configs: list[dict[str, Any]], n: int,
                 check: str, bw: float) -> list[dict[str, Any]]:
    dev = DEV
    inputs = kdef.make_inputs(axes, seed=0, distribution="benchmark", device=dev)
    cache = InputCache()
    rows, fns = [], []
    for cfg in configs:
        row: dict[str, Any] = {"axes": axes, "config": cfg, "label": label(kdef, cfg)}
        try:
            kdef.launch(*inputs, config=cfg)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            row.update(runtime_of(kdef).compiled_stats())
            if check != "none":
                res = check_config(kdef, axes, cfg, device=dev, seed=1, cache=cache,
                                   distributions=("benchmark", "realistic") if check == "base" else None)
                row["correct"], row["max_error"] = res.ok, res.max_error
                if not res.ok:
                    row["detail"] = res.detail[:300]
        except Exception as exc:  # a config that does not build or run is reported, not fatal
            row["failure"] = str(classify(exc))[:300]
            rows.append(row)
            continue
        rows.append(row)
        fns.append((row, lambda cfg=cfg: kdef.launch(*inputs, config=cfg)))
    del cache
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if fns:
        timings = time_calls([f for _, f in fns], n=n, device=dev)
        roof = kdef.bytes_moved(axes) / bw * 1e6
        for (row, _), t in zip(fns, timings):
            row["median_us"], row["iqr_us"] = t.median_us, t.iqr_us
            row["roofline_us"] = roof
            row["pct_roofline"] = 100.0 * roof / t.median_us
    return rows


def large(kdef: Any, configs: list[dict[str, Any]], n: int, check: str, bw: float,
          sizes: tuple[int, ...] = SIZES) -> list[dict]:
    out = []
    for P in sizes:
        t0 = time.time()
        rows = time_configs(kdef, {"total_patches": P}, configs, n, check, bw)
        rows.sort(key=lambda r: r.get("median_us", math.inf))
        print(f"\n== A at {P} patches (roofline {rows[0].get('roofline_us', 0):.2f} us; "
              f"{time.time() - t0:.0f} s)")
        print(f"{'median us':>10} {'% roof':>7} {'ok':>3} {'regs':>5}  config")
        for r in rows[:12] + [r for r in rows[12:] if r["label"] == "default"]:
            if "median_us" in r:
                print(f"{r['median_us']:10.2f} {r['pct_roofline']:7.1f} "
                      f"{'y' if r.get('correct', True) else 'N':>3} {r.get('n_regs', '-'):>5}  {r['label']}")
            else:
                print(f"{'-':>10} {'-':>7} {'-':>3} {'-':>5}  {r['label']}: {r.get('failure')}")
        ok = [r for r in rows if "median_us" in r and r.get("correct", True)]
        if ok:
            print(f"best correct at {P}: {ok[0]['pct_roofline']:.1f}% of roofline "
                  f"({'meets' if ok[0]['pct_roofline'] >= 80 else 'below'} the 80% goal)  {ok[0]['label']}")
        out.extend(rows)
    return out


def suite(kdef: Any, configs: list[dict[str, Any]], n: int, check: str, bw: float,
          cases: Any = None) -> dict:
    per_case = []
    for c in cases or kdef.cases:
        rows = time_configs(kdef, dict(c.axes), configs, n, check, bw)
        ok = [r for r in rows if "median_us" in r and r.get("correct", True)]
        best = min(ok, key=lambda r: r["median_us"]) if ok else None
        per_case.append({"case": c.number, "axes": c.axes, "rows": rows,
                         "best": best and {k: best[k] for k in ("label", "median_us", "pct_roofline")}})
        if best:
            print(f"case {c.number:2d} {c.axes}: best {best['median_us']:.2f} us  {best['label']}")
    means = {}
    for i, cfg in enumerate(configs):
        ts = [pc["rows"][i].get("median_us") for pc in per_case]
        if all(t is not None and pc["rows"][i].get("correct", True) for t, pc in zip(ts, per_case)):
            means[label(kdef, cfg)] = sum(ts) / len(ts)
    best_mean = sum(pc["best"]["median_us"] for pc in per_case if pc["best"]) / len(per_case)
    print(f"\nsuite mean of the per-case best: {best_mean:.3f} us "
          f"({'meets' if best_mean <= 3.3 else 'above'} the 3.3 us goal)")
    for lab, m in sorted(means.items(), key=lambda kv: kv[1])[:5]:
        print(f"suite mean {m:.3f} us  {lab}")
    return {"per_case": per_case, "mean_of_best_us": best_mean, "config_means_us": means}


def _err(kdef: Any, inputs: tuple, cfg: dict[str, Any]) -> float:
    refs = kdef.reference(*inputs)
    outs = tuple(torch.full(r.shape, math.nan, dtype=torch.float32, device=r.device) for r in refs)
    kdef.launch(*inputs, config=cfg, out=outs)
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    errs = [rel_error(o, r) for o, r in zip(outs, refs)]
    return math.nan if any(math.isnan(e) for e in errs) else max(errs)


def _angle_inputs(kdef: Any, axes: dict[str, int], G: int) -> tuple:
    """RoPE tables with positions uniform in [0, G): A through its own max_grid_size axis, B with
    positions drawn here (an independent table, not the kernel's `long` draw)."""
    dev = DEV
    if kdef.name == A_NAME:
        return kdef.make_inputs({**axes, "max_grid_size": G}, seed=7, distribution="realistic",
                                device=dev)
    gq, gk, q, k, _ = kdef.make_inputs(axes, seed=7, distribution="benchmark", device=dev)
    gen = torch.Generator().manual_seed(7)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    f = torch.randint(0, G, (q.shape[0],), generator=gen).double()[:, None] * inv[None, :]
    return gq, gk, q, k, torch.cat([f, f], dim=1).float().to(dev).contiguous()


def errors(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Relative error of each record's config on its own shape, per magnitude and angle range."""
    dev = DEV
    rows = []
    print("\n== errors (worst relative error over outputs; rtol 2e-5)")
    head = [f"x{s:g}" for s in SCALES] + [f"pos<{g}" for g in ANGLE_POSITIONS]
    print(f"{'kernel':6} {'case':>22} " + " ".join(f"{h:>8}" for h in head) + "  config")
    for rec in records:
        kdef = kernels.get_kernel(rec["kernel"])
        axes = dict(rec["axes"])
        try:
            cfg = kdef.validate_config(rec["config"])
        except KernelSearchError as exc:
            print(f"skip record {axes}: {exc}")
            continue
        base = kdef.make_inputs(axes, seed=3, distribution="benchmark", device=dev)
        groups = [("grad_cos", "grad_sin")] if kdef.name == A_NAME else [
            ("grad_q_embed", "grad_k_embed"), ("q", "k")]
        row: dict[str, Any] = {"kernel": kdef.name, "axes": axes, "config": cfg, "errors": {}}
        for s in SCALES:
            worst = 0.0
            for g in groups:
                x = tuple(t * s if n in g else t for t, n in zip(base, kdef.input_names))
                refs = kdef.reference(*x)
                if not all(r.abs().max().item() <= torch.finfo(torch.float32).max and
                           r.abs().max().item() >= torch.finfo(torch.float32).tiny for r in refs):
                    continue  # the float64 result leaves the float32 range: not in the domain
                e = _err(kdef, x, cfg)
                worst = math.nan if math.isnan(e) or math.isnan(worst) else max(worst, e)
            row["errors"][f"x{s:g}"] = worst
        for G in ANGLE_POSITIONS:
            row["errors"][f"pos<{G}"] = _err(kdef, _angle_inputs(kdef, axes, G), cfg)
        rows.append(row)
        short = "A" if kdef.name == A_NAME else "B"
        print(f"{short:6} {json.dumps(axes):>22} " +
              " ".join(f"{row['errors'][h]:8.1e}" for h in head) + "  " + label(kdef, cfg))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--n", type=int, default=30, help="timed calls per config (median)")
    ap.add_argument("--configs", type=Path, help="JSON list of A configs to time")
    ap.add_argument("--records", type=Path, help="exported records: their configs get the error table")
    ap.add_argument("--suite", action="store_true", help="also time the configs on the 16 suite cases")
    ap.add_argument("--check", choices=("domain", "base", "none"), default="domain")
    ap.add_argument("--max-configs", type=int, default=0, help="time only the first N candidates")
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--cases", help="with --suite: only these suite case numbers, comma-separated")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny run under the Triton interpreter (checks this script, times nothing real)")
    args = ap.parse_args(argv)
    global DEV
    if args.smoke:
        DEV = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("issue14_a_large: needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    A = kernels.get_kernel(A_NAME)
    configs = json.loads(args.configs.read_text()) if args.configs else candidates()
    configs = valid(A, configs)
    if args.max_configs:
        configs = configs[:args.max_configs]
    bw = 4.25e12 if args.smoke else copy_bandwidth()
    name = "interpreter" if args.smoke else torch.cuda.get_device_name()
    print(f"{name}: copy bandwidth {bw / 1e12:.3f} TB/s; {len(configs)} configs")
    meta = {"device": name, "copy_bandwidth": bw,
            "source_hash": A.source_hash, "n": args.n, "check": args.check}
    if not args.skip_large:
        rows = large(A, configs, args.n, args.check, bw, (131, 300) if args.smoke else SIZES)
        (args.out / "large.json").write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str))
    if args.suite:
        small = sorted(A.cases, key=lambda c: A.bytes_moved(c.axes))[:2] if args.smoke else None
        if args.cases:
            wanted = {int(n) for n in args.cases.split(",")}
            small = [c for c in A.cases if c.number in wanted]
        s = suite(A, configs, args.n, args.check, bw, small)
        (args.out / "suite.json").write_text(json.dumps({**meta, **s}, indent=1, default=str))
    if args.records:
        doc = json.loads(args.records.read_text())
        recs = doc["records"] if isinstance(doc, dict) else doc
        rows = errors(recs)
        (args.out / "errors.json").write_text(json.dumps({**meta, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
