"""A broad sweep of configs over suite cases on the GPU, for learning the landscape.

Not the tuner: no database, no Optuna. It compiles candidate configs in parallel processes (the
on-disk Triton cache then makes the in-process compile a load), checks every config on every case
against float64 with poisoned outputs, times them all under one profiler session per case, and
writes one JSON file. Used for the performance notes in docs/; `python -m kernelsearch_tools.explore -h`.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any

import torch

from kernelsearch.kernels.runtime import runtime_of
from kernelsearch.kernels.spec import config_key
from kernelsearch.search_space.runner import compile_config


def candidates(kname: str, limit: int, seed: int,
               spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The kernel's default, then up to `limit` distinct valid configs: a shuffled product grid
    plus extras from `spec` ({grid: {param: [values]}, extra: [configs]}) when given, else drawn
    at random from the declaration's parameter choices (the full product is too large to list:
    B's holds half a million)."""
    from kernelsearch.kernels import get_kernel

    k = get_kernel(kname)
    if spec is not None:
        grid, extra = spec.get("grid", {}), list(spec.get("extra", []))
        out = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())] + extra
    else:
        out = _draws(k, limit, seed)
    valid = []
    for c in out:
        try:
            valid.append(k.validate_config(c))
        except ValueError:
            pass
    uniq = list({config_key(c): c for c in valid}.values())
    random.Random(seed).shuffle(uniq)
    if limit and len(uniq) > limit:
        uniq = uniq[:limit]
    return [k.default_config] + [c for c in uniq if c != k.default_config]


def _draws(k: Any, limit: int, seed: int) -> list[dict[str, Any]]:
    """Random configs from each parameter's choices until `limit` distinct valid ones (or many
    tries: rules may reject most combinations)."""
    rng = random.Random(seed)
    keys: dict[str, dict[str, Any]] = {}
    want = limit or 400
    for _ in range(50 * want):
        if len(keys) >= want:
            break
        cfg = {p.name: rng.choice(p.choices) for p in k.params}
        try:
            full = k.validate_config({n: v for n, v in cfg.items() if k.param(n).active(cfg)})
        except ValueError:
            continue
        keys.setdefault(config_key(full), full)
    return list(keys.values())


def _compile_for_shapes(args: tuple[str, dict[str, Any], list[dict[str, int]]]) -> tuple[str, str | None]:
    kname, cfg, shapes = args
    key = config_key(cfg)
    try:
        for axes in shapes:
            compile_config(kname, axes, cfg)
        torch.cuda.synchronize()
        return key, None
    except Exception as exc:  # reported per config, the sweep goes on
        return key, f"{type(exc).__name__}: {str(exc)[:200]}"


def compile_ahead(kname: str, cfgs: list[dict[str, Any]], workers: int,
                  shapes: list[dict[str, int]]) -> dict[str, str | None]:
    """Compile every config for every swept shape in parallel processes (the on-disk cache
    then turns the sweep's own compiles into loads); launches run on garbage, never timed."""
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return dict(pool.map(_compile_for_shapes, [(kname, c, shapes) for c in cfgs], chunksize=4))


def sweep_case(k, axes: dict[str, int], cfgs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    from kernelsearch.kernels.check import rel_error
    from kernelsearch.kernels.measure import time_calls

    dev = torch.device("cuda")
    rows = []
    data = {}
    for dist in ("benchmark", "realistic"):
        inputs = k.make_inputs(axes, seed=int.from_bytes(os.urandom(4), "little"), distribution=dist,
                               device=dev)
        data[dist] = (inputs, k.reference(*inputs))
    ok_cfgs = []
    for cfg in cfgs:
        row: dict[str, Any] = {"config": cfg}
        try:
            errs = {}
            for dist, (inputs, refs) in data.items():
                outs = tuple(torch.full(r.shape, math.nan, dtype=torch.float32, device=dev) for r in refs)
                k.launch(*inputs, config=cfg, out=outs)
                torch.cuda.synchronize()
                errs[dist] = max(rel_error(o, r) for o, r in zip(outs, refs))
            row["errors"] = errs
            row["ok"] = all(not math.isnan(e) and e <= k.rtol for e in errs.values())
            row.update(runtime_of(k).compiled_stats())
        except Exception as exc:
            row["ok"] = False
            row["failure"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
        if row["ok"]:
            ok_cfgs.append((row, cfg))
    inputs = data["benchmark"][0]
    fns = [(lambda c=cfg: k.launch(*inputs, config=c)) for _, cfg in ok_cfgs]
    for (row, _), t in zip(ok_cfgs, time_calls(fns, n=n, device=dev)):
        row["timing"] = t.as_dict()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--kernel", action="append", help="kernel (repeatable); every kernel when omitted")
    ap.add_argument("--case", action="append", type=int, help="suite case number (repeatable)")
    ap.add_argument("--limit", type=int, default=400, help="at most this many configs per kernel")
    ap.add_argument("--n", type=int, default=10, help="timed calls per config")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grid", help="JSON file {kernel: {grid: {param: [values]}, extra: [configs]}} "
                                   "replacing random draws from the kernel's parameters "
                                   "(docs/benchmarks/explore_grid.json: the grids of the notes)")
    a = ap.parse_args(argv)
    specs = json.load(open(a.grid)) if a.grid else {}
    from kernelsearch.kernels import all_kernels
    from kernelsearch.kernels.device import device_info, versions
    from kernelsearch.kernels.measure import copy_bandwidth

    result: dict[str, Any] = {"device": device_info(), "versions": versions(),
                              "copy_bandwidth_Bps": copy_bandwidth(), "kernels": {}}
    for kname in a.kernel or sorted(all_kernels()):
        k = all_kernels()[kname]
        if specs and kname not in specs:
            continue
        cfgs = candidates(kname, a.limit, a.seed, specs.get(kname))
        cases = [c for c in k.cases if not a.case or c.number in a.case]
        t0 = time.time()
        compile_errors = compile_ahead(kname, cfgs, a.workers, [c.axes for c in cases])
        t_compile = time.time() - t0
        failed = {key: err for key, err in compile_errors.items() if err}
        cfgs = [c for c in cfgs if not compile_errors.get(config_key(c))]
        print(f"{kname}: {len(cfgs)} configs compiled in {t_compile:.1f}s, {len(failed)} failed",
              flush=True)
        per_case = []
        for c in cases:
            t1 = time.time()
            rows = sweep_case(k, c.axes, cfgs, a.n)
            timed = [r for r in rows if "timing" in r]
            best = min(timed, key=lambda r: r["timing"]["median_us"]) if timed else None
            dflt = rows[0].get("timing", {}).get("median_us")
            n_bad = sum(1 for r in rows if not r["ok"])
            print(f"  case {c.number:>2} {c.axes}: best {best['timing']['median_us'] if best else float('nan'):.2f} us "
                  f"default {dflt if dflt else float('nan'):.2f} us, wrong/failed {n_bad}/{len(rows)} "
                  f"({time.time() - t1:.1f}s) best={json.dumps(best['config']) if best else None}", flush=True)
            per_case.append({"case": c.number, "axes": c.axes,
                             "roofline_us": k.bytes_moved(c.axes) / result["copy_bandwidth_Bps"] * 1e6,
                             "rows": rows})
            # Written after every case: a run cut short by its time limit keeps what it measured.
            result["kernels"][kname] = {"compile_s": t_compile, "compile_failures": failed,
                                        "cases": per_case}
            with open(a.out, "w") as fh:
                json.dump(result, fh, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
