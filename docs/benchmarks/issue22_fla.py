"""Issue 22 on the H200: a real open-source library with many `@triton.autotune` kernels
(flash-linear-attention's `fla-core`, 205 of them), run unchanged but for the decorator swap, in
fresh processes with fresh Triton caches:

  triton     plain `triton.autotune` on a cold host
  ks-first   `@kernelsearch.autotune` on a first host: tunes and shares through the service
  ks-served  `@kernelsearch.autotune` on a second host: served, no benchmark expected
  fixed      the same code with ks-first's configs fixed in advance (Triton's cache pre-filled)

The swap is `triton.autotune = kernelsearch.autotune` before `import fla` (the decorators read
the attribute at import), and the same for fla's own wrapper of it, `fla_cache_autotune` (same
signature; replaced as its module is imported, `swap_fla_decorator`); nothing of fla is edited. The ops, bf16: `chunk_gated_delta_rule`
forward (its backward refuses to run on Hopper under Triton < 3.7.1, fla issue 640) and
`chunk_delta_rule` forward and backward. Issue 25's modes run fla unchanged (no swap), with Triton's disk cache of autotune results on
(`TRITON_CACHE_AUTOTUNING=1`) through the cache manager gpu.sh names (`TRITON_CACHE_MANAGER`):

  tc-triton      Triton's own file cache, a cold host
  tc-ks-first    kernelsearch.triton_cache on a first host: benchmarks, shares the entries
  tc-ks-second   kernelsearch.triton_cache on a second host (fresh Triton cache): served
  tc-redis-first, tc-redis-second   Triton's RemoteCacheManager over its RedisRemoteCacheBackend
                 (triton_redis.py: the attribute Triton 3.6.0's class reads and lacks)

Each mode prints one JSON line: time from the first call to all results,
the op latencies (triton.testing.do_bench, its L2 flush), how many configs were benchmarked, and
the config each autotuned kernel ran per key.

    python3 issue22_fla.py run --mode triton --out DIR
    python3 issue22_fla.py table DIR
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

SHAPE = dict(B=int(os.environ.get("FLA_B", 2)), T=int(os.environ.get("FLA_T", 4096)),
             H=int(os.environ.get("FLA_H", 16)), K=128, V=128)


def _config_dict(c) -> dict:
    out = dict(c.kwargs)
    for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        v = getattr(c, name, None)
        if v is not None:
            out[name] = v
    return out


def _picks() -> dict:
    """Every autotuner's cache: {module.qualname: [[key, config], ...]}."""
    from triton.runtime.autotuner import Autotuner

    out: dict = {}
    for obj in gc.get_objects():
        if isinstance(obj, Autotuner) and obj.cache:
            fn = obj.base_fn
            name = f"{fn.__module__}.{fn.__qualname__}"
            out[name] = sorted([[list(k), _config_dict(c)] for k, c in obj.cache.items()],
                               key=lambda kc: json.dumps(kc[0], default=str))
    return out


def _install_fixed(path: str) -> None:
    """triton.autotune whose cache holds the given picks before the first call."""
    import triton
    from triton.runtime.autotuner import Config

    picks = json.loads(Path(path).read_text())["picks"]
    real = triton.autotune

    def fixed(configs, key, **kw):
        def deco(fn):
            tuner = real(configs, key, **kw)(fn)
            base = tuner.base_fn
            for k, cfg in picks.get(f"{base.__module__}.{base.__qualname__}", []):
                meta = {n: v for n, v in cfg.items()
                        if n not in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
                opts = {n: v for n, v in cfg.items() if n in ("num_warps", "num_stages", "num_ctas",
                                                               "maxnreg")}
                tuner.cache[tuple(k)] = Config(meta, **opts)
            return tuner
        return deco

    triton.autotune = fixed


def swap_fla_decorator(replacement) -> None:
    """Replace fla.ops.utils.cache.fla_cache_autotune as that module is first imported (before
    any op module takes it with `from ... import`), without editing fla."""
    import importlib.abc
    import importlib.machinery

    target = "fla.ops.utils.cache"

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target_mod=None):
            if name != target:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return None
            real = spec.loader.exec_module

            def exec_module(module):
                real(module)
                module.fla_cache_autotune = replacement

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


MODES = ("triton", "ks-first", "ks-served", "fixed", "tc-triton", "tc-ks-first", "tc-ks-second",
         "tc-redis-first", "tc-redis-second")


def run(mode: str, out: Path, fixed: str | None) -> dict:
    import torch
    import triton
    from triton.runtime.autotuner import Autotuner

    benched: list[int] = []
    real_bench = Autotuner._bench

    def counting(self, *a, **k):
        benched.append(1)
        return real_bench(self, *a, **k)

    Autotuner._bench = counting
    hook_s = [0.0]
    if mode.startswith("tc-ks"):  # the time the cache manager's kernelsearch work adds
        import kernelsearch.triton_cache as tcm

        for name in ("served_entry", "share_entry"):
            def timed(*a, _real=getattr(tcm, name), **k):
                t = time.perf_counter()
                try:
                    return _real(*a, **k)
                finally:
                    hook_s[0] += time.perf_counter() - t
            setattr(tcm, name, timed)
    if mode.startswith("ks"):
        import kernelsearch

        triton.autotune = kernelsearch.autotune
        swap_fla_decorator(kernelsearch.autotune)
    elif mode == "fixed":
        _install_fixed(fixed)
        swap_fla_decorator(triton.autotune)
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    B, T, H, K, V = (SHAPE[n] for n in "BTHKV")
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, T, H, K, device=dev, dtype=dt, generator=g)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev, dtype=torch.float32,
                                                  generator=g), dim=-1).to(dt)
    v = torch.randn(B, T, H, V, device=dev, dtype=dt, generator=g)
    gate = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=dev, dtype=torch.float32,
                                                      generator=g))
    beta = torch.rand(B, T, H, device=dev, dtype=torch.float32, generator=g).sigmoid().to(dt)
    do = torch.randn(B, T, H, V, device=dev, dtype=dt, generator=g)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, beta)]
    torch.cuda.synchronize()

    def gdn_fwd():
        with torch.no_grad():
            return chunk_gated_delta_rule(q, k, v, gate, beta)[0]

    def delta_fwd_bwd():
        o, _ = chunk_delta_rule(*leaves)
        o.backward(do)
        return o

    t0 = time.perf_counter()
    results = [gdn_fwd(), delta_fwd_bwd()]
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    n_benched = len(benched)
    checksum = [float(r.detach().float().abs().sum()) for r in results] + \
        [float(t.grad.float().abs().sum()) for t in leaves]

    lat = {}
    for name, fn in (("gdn_fwd", gdn_fwd), ("delta_fwd_bwd", delta_fwd_bwd)):
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, quantiles=[0.5, 0.2, 0.8])
        lat[name] = {"median_us": ms[0] * 1e3, "p20_us": ms[1] * 1e3, "p80_us": ms[2] * 1e3}
    got = {"mode": mode, "shape": SHAPE, "first_call_to_results_s": first,
           "configs_benchmarked": n_benched, "latency": lat, "picks": _picks(),
           "checksum": checksum,
           "sources": _sources()}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{mode}.json").write_text(json.dumps(got, indent=1, default=str))
    if mode.startswith(("ks", "tc-ks")):
        from kernelsearch.backends import BACKENDS

        BACKENDS.drain(60)
    if mode.startswith("tc-ks"):
        from kernelsearch.triton_cache import STATS

        got["cache_manager"] = {"served": STATS.served, "shared": STATS.shared,
                                "missed": STATS.missed, "lookup_and_share_s": round(hook_s[0], 3)}
        (out / f"{mode}.json").write_text(json.dumps(got, indent=1, default=str))
    return got


def _sources() -> dict:
    try:
        from kernelsearch.tuner import Autotuner as KsAutotuner
    except ImportError:
        return {}
    counts: dict = {}
    for obj in gc.get_objects():
        if isinstance(obj, KsAutotuner):
            for s in obj.sources.values():
                counts[s.value] = counts.get(s.value, 0) + 1
    return counts


def table(out: Path) -> str:
    rows = {m: json.loads((out / f"{m}.json").read_text())
            for m in MODES if (out / f"{m}.json").exists()}
    lines = [f"shape {SHAPE} (bf16; chunk_gated_delta_rule fwd, chunk_delta_rule fwd+bwd)",
             f"{'mode':15} {'first call->results':>20} {'benchmarked':>12} {'gdn fwd us':>18} "
             f"{'delta fwd+bwd us':>18}  sources"]
    for m, r in rows.items():
        f, fb = r["latency"]["gdn_fwd"], r["latency"]["delta_fwd_bwd"]
        lines.append(f"{m:15} {r['first_call_to_results_s']:>18.2f} s {r['configs_benchmarked']:>12} "
                     f"{f['median_us']:>8.1f} [{f['p20_us']:.1f}-{f['p80_us']:.1f}] "
                     f"{fb['median_us']:>8.1f} [{fb['p20_us']:.1f}-{fb['p80_us']:.1f}]  {r['sources']}")
    if "ks-first" in rows and "ks-served" in rows:
        same = rows["ks-first"]["picks"] == rows["ks-served"]["picks"]
        lines.append(f"served host ran ks-first's configs: {same} "
                     f"({len(rows['ks-first']['picks'])} autotuned kernels)")
    for route in ("tc-ks", "tc-redis"):
        if f"{route}-first" in rows and f"{route}-second" in rows:
            a, b = rows[f"{route}-first"]["picks"], rows[f"{route}-second"]["picks"]
            differ = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
            lines.append(f"{route} second host ran the first host's configs: {not differ} "
                         f"({len(a)} autotuned kernels; differing: {differ})")
    if "triton" in rows and "ks-first" in rows:
        a, b = rows["triton"]["picks"], rows["ks-first"]["picks"]
        lines.append(f"kernels whose pick differs between triton and ks-first: "
                     f"{sum(1 for n in a if a[n] != b.get(n))} of {len(a)}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", required=True, choices=MODES)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--fixed", help="ks-first's JSON (fixed mode)")
    t = sub.add_parser("table")
    t.add_argument("out", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        got = run(a.mode, a.out, a.fixed)
        print(json.dumps({k: got[k] for k in ("mode", "first_call_to_results_s",
                                                "configs_benchmarked", "latency", "sources",
                                                "cache_manager") if k in got}))
    else:
        print(table(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
