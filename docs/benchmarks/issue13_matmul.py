"""Issue 13's evidence on the GPU: the tutorial matmul tuned through the service and served, and a
fresh process's time from its first call to all 8 results under `@triton.autotune`,
`@kernelsearch.autotune` (warm service) and the best configs fixed in advance, with the latency of
each pick. issue13_matmul.sh runs the steps; each `run` is its own fresh process.

    python issue13_matmul.py tune --url URL             # queue the 8 shapes, wait, print records
    python issue13_matmul.py serve-check --out F        # a second process: all 8 served?
    python issue13_matmul.py run --mode triton|ks|fixed --out F [--fixed F]
    python issue13_matmul.py latency --runs F... --out F
    python issue13_matmul.py report --dir D             # JSON + text table
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

T_IMPORT0 = time.perf_counter()

KERNEL = "triton_tutorial_matmul"


def shapes() -> list[tuple[int, int, int]]:
    """The declaration's 8 cases; KS13_SHAPES="M,N,K;..." for a dry run on the CPU interpreter."""
    import os

    raw = os.environ.get("KS13_SHAPES")
    if raw:
        return [tuple(int(v) for v in s.split(",")) for s in raw.split(";")]
    from ks_matmul_example.declaration import SHAPES

    return [tuple(s) for s in SHAPES]


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def label(s: tuple[int, int, int]) -> str:
    return "x".join(str(v) for v in s)


def launch(kernel: Any, a: Any, b: Any, **meta: Any) -> Any:
    """The tutorial's launcher, over any of the three kernels."""
    import torch
    import triton

    M, K = a.shape
    K, N = b.shape
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)
    grid = lambda META: (triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"]),)  # noqa: E731
    kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                 c.stride(0), c.stride(1), ACTIVATION="", **meta)
    return c


def cmd_tune(args: argparse.Namespace) -> None:
    from kernelsearch.rest_client import Client

    from ks_matmul_example import kernel as ex

    cases = [{"M": m, "N": n, "K": k} for m, n, k in shapes()]
    with Client(args.url, timeout=30) as c:
        t0 = time.monotonic()
        job = c.submit_job(KERNEL, cases, n_trials=len(ex.get_autotune_config()), sampler="grid",
                           timeout_s=args.timeout)
        done = c.wait(job["id"], timeout=args.timeout + 60, poll_s=2)
        wall = time.monotonic() - t0
        recs = c.records(kernel=KERNEL)
    print(f"job {done['id']} {done['status']} in {wall:.1f} s, {done['trials_done']} trials "
          f"{done.get('error') or ''}")
    for r in sorted(recs, key=lambda r: r["case"]["M"]):
        print(f"  {label(tuple(r['case'][k] for k in 'MNK')):>16}  {r['latency_us']:9.1f} us  "
              f"{r['config']}")
    Path(args.out).write_text(json.dumps({"job": done, "wall_s": wall, "records": recs}, indent=1,
                                         default=str))


def _inputs() -> list[tuple[Any, Any]]:
    import torch

    gen = torch.Generator(device=device()).manual_seed(0)
    out = []
    for m, n, k in shapes():
        a = torch.randn(m, k, device=device(), dtype=torch.float16, generator=gen)
        b = torch.randn(k, n, device=device(), dtype=torch.float16, generator=gen)
        out.append((a, b))
    sync()
    return out


def cmd_run(args: argparse.Namespace) -> None:
    """One fresh process: the time from the first call to all 8 results, and what each ran."""
    import torch
    import triton

    from ks_matmul_example import kernel as ex

    t_import = time.perf_counter() - T_IMPORT0
    inputs = _inputs()
    sync()
    picks: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    if args.mode == "triton":
        tuned = triton.autotune(configs=ex.get_autotune_config(), key=["M", "N", "K"])(
            ex.matmul_kernel.fn)
        t0 = time.perf_counter()
        outs = [launch(tuned, a, b) for a, b in inputs]
        sync()
        wall = time.perf_counter() - t0
        from kernelsearch.kernels.configs import canonical as config_dict

        for key, cfg in tuned.cache.items():
            picks[label(tuple(key[:3]))] = config_dict(cfg)
    elif args.mode == "ks":
        from kernelsearch.kernels.configs import canonical as config_dict

        t0 = time.perf_counter()
        outs = [ex.matmul(a, b) for a, b in inputs]
        sync()
        wall = time.perf_counter() - t0
        for key, cfg in ex.matmul_kernel.cache.items():
            picks[label(tuple(key[:3]))] = config_dict(cfg)
            sources[label(tuple(key[:3]))] = ex.matmul_kernel.sources[key].value
    else:
        from kernelsearch.resolution import to_triton

        fixed = json.loads(Path(args.fixed).read_text())
        metas = frozenset(k for c in ex.get_autotune_config() for k in c.kwargs)
        cfgs = [to_triton(fixed[label(s)], metas).all_kwargs() for s in shapes()]
        t0 = time.perf_counter()
        outs = [launch(ex.matmul_kernel.fn, a, b, **cfg) for (a, b), cfg in zip(inputs, cfgs)]
        sync()
        wall = time.perf_counter() - t0
        picks = {label(s): fixed[label(s)] for s in shapes()}
    errs = {}
    for s, (a, b), c in zip(shapes(), inputs, outs):
        ref = torch.matmul(a.float(), b.float())
        errs[label(s)] = float((c.float() - ref).norm() / ref.norm())
    doc = {"mode": args.mode, "cache": args.cache, "first_call_to_all_s": wall,
           "import_s": t_import, "picks": picks, "sources": sources, "rel_errors": errs}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"{args.mode:>6} {args.cache:>5} cache: {wall:7.3f} s first call to all 8 "
          f"(imports {t_import:.1f} s) sources={sorted(set(sources.values())) or '-'} "
          f"max rel err {max(errs.values()):.2e}")


def cmd_serve_check(args: argparse.Namespace) -> None:
    """A second process asks the service for all 8 shapes, through the decorator."""
    args.mode, args.cache = "ks", "any"
    cmd_run(args)
    doc = json.loads(Path(args.out).read_text())
    served = sum(1 for v in doc["sources"].values() if v == "service")
    print(f"served: {served} of {len(shapes())}")
    fixed = {k: v for k, v in doc["picks"].items()}
    Path(args.fixed_out).write_text(json.dumps(fixed, indent=1))


def cmd_latency(args: argparse.Namespace) -> None:
    """Each distinct pick per shape timed the same way (CUPTI, cold L2, median of 30)."""
    import torch

    from kernelsearch.kernels.measure import time_call
    from kernelsearch.resolution import to_triton
    from ks_matmul_example import kernel as ex

    runs = [json.loads(Path(f).read_text()) for f in args.runs]
    metas = frozenset(k for c in ex.get_autotune_config() for k in c.kwargs)
    inputs = _inputs()
    out: dict[str, Any] = {}
    for s, (a, b) in zip(shapes(), inputs):
        lab = label(s)
        timed: dict[str, float] = {}
        row: dict[str, Any] = {}
        for r in runs:
            cfg = r["picks"].get(lab)
            if cfg is None:
                continue
            key = json.dumps(cfg, sort_keys=True)
            if key not in timed:
                meta = to_triton(cfg, metas).all_kwargs()
                t = time_call(lambda: launch(ex.matmul_kernel.fn, a, b, **meta), n=30)
                timed[key] = t.median_us
            row[f"{r['mode']}_{r['cache']}"] = {"config": cfg, "latency_us": timed[key]}
        row["torch.matmul"] = {"latency_us": time_call(lambda: torch.matmul(a, b), n=30).median_us}
        out[lab] = row
        print(lab, {k: round(v["latency_us"], 1) for k, v in row.items()})
    Path(args.out).write_text(json.dumps(out, indent=1))


def cmd_report(args: argparse.Namespace) -> None:
    d = Path(args.dir)
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("run_*.json"))}
    lat = json.loads((d / "latency.json").read_text()) if (d / "latency.json").exists() else {}
    tune = json.loads((d / "tune.json").read_text()) if (d / "tune.json").exists() else {}
    lines = ["fresh process, first call to all 8 results (s)",
             f"{'mode':>8} {'cold':>8} {'warm':>8}"]
    for mode in ("triton", "ks", "fixed"):
        vals = {r["cache"]: r["first_call_to_all_s"] for r in runs.values() if r["mode"] == mode}
        lines.append(f"{mode:>8} {vals.get('cold', float('nan')):8.3f} {vals.get('warm', float('nan')):8.3f}")
    cols = sorted({k for row in lat.values() for k in row})
    lines += ["", "kernel latency of each pick (us, CUPTI, cold L2, median of 30)",
              f"{'shape':>16} " + " ".join(f"{c:>13}" for c in cols)]
    for lab, row in lat.items():
        lines.append(f"{lab:>16} " + " ".join(
            f"{row[c]['latency_us']:13.1f}" if c in row else f"{'-':>13}" for c in cols))
    same = [lab for lab in lat if "triton_cold" in lat[lab] and "triton_warm" in lat[lab]
            and lat[lab]["triton_cold"]["config"] != lat[lab]["triton_warm"]["config"]]
    lines += ["", f"shapes where the two @triton.autotune runs picked different configs: "
                  f"{', '.join(same) or 'none'}"]
    text = "\n".join(lines)
    print(text)
    (d / "issue13_matmul.txt").write_text(text + "\n")
    (d / "issue13_matmul.json").write_text(json.dumps(
        {"runs": runs, "latency": lat, "tune": {"wall_s": tune.get("wall_s"),
                                                "job": tune.get("job")}}, indent=1, default=str))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune")
    t.add_argument("--url", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--timeout", type=float, default=240)
    s = sub.add_parser("serve-check")
    s.add_argument("--out", required=True)
    s.add_argument("--fixed-out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=("triton", "ks", "fixed"), required=True)
    r.add_argument("--cache", choices=("cold", "warm"), required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--fixed")
    la = sub.add_parser("latency")
    la.add_argument("--runs", nargs="+", required=True)
    la.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--dir", required=True)
    args = p.parse_args(argv)
    {"tune": cmd_tune, "serve-check": cmd_serve_check, "run": cmd_run, "latency": cmd_latency,
     "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
