"""Issue 31 on the H200: two real open-source libraries other than fla-core, each shipping
`@triton.autotune` kernels as a pure-Python package, run unchanged but for the decorator swap, in
fresh processes with fresh Triton caches:

  liger    Liger-Kernel 0.8.5 (`liger-kernel`): DyT forward and backward with its optional beta
           (`reset_to_zero`, a key over a constexpr size) and without it (None), and the fused
           SwiGLU MLP's inference forward (TensorDescriptor arguments, configs with pre_hooks)
  gemlite  gemlite 0.6.0.post2: 4-bit weight-only linear layers (A16W4, group 128) at batch 1,
           16 and 128 (its GEMV, split-K GEMM and GEMM kernels: keys over sizes and dtype ids,
           `restore_value`, `prune_configs_by`; called through a `torch.library.custom_op`)

Modes, one fresh process each:

  triton     plain `triton.autotune` on a cold host
  ks-first   `@kernelsearch.autotune` on a first host: tunes and shares through the service
  ks-served  `@kernelsearch.autotune` on a second host: served, no benchmark expected

The swap is `triton.autotune = kernelsearch.autotune` before the library is imported (its
decorators read the attribute at import); nothing of the library is edited. Each run records the
time from the first call to all results, how many configs were benchmarked (Triton's
`Autotuner._bench` calls), the sources kernelsearch reports, each autotuned kernel's config per
key, and any error that reached the caller with its message; `table` compares every op's output
with triton.autotune's (relative error of the norm; configs differ in summation order).

    python3 issue31_libs.py run --lib liger --mode triton --work DIR
    python3 issue31_libs.py table DIR --out SUMMARY.json
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

LIBS = ("liger", "gemlite")
MODES = ("triton", "ks-first", "ks-served")


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
            out[f"{fn.__module__}.{fn.__qualname__}"] = sorted(
                [[[str(v) for v in k], _config_dict(c)] for k, c in obj.cache.items()],
                key=lambda kc: json.dumps(kc[0]))
    return out


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


def liger_ops() -> dict:
    """name -> a call returning the op's result tensors (inputs made once, seeded)."""
    import torch
    from liger_kernel.ops import LigerMLPFunction
    from liger_kernel.ops.dyt import LigerDyTFunction

    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    M, N = 4096, 4096
    x = torch.randn(M, N, device=dev, dtype=dt, generator=g)
    alpha = torch.full((1,), 0.5, device=dev, dtype=dt)
    gamma = torch.randn(N, device=dev, dtype=dt, generator=g)
    beta = torch.randn(N, device=dev, dtype=dt, generator=g)
    dy = torch.randn(M, N, device=dev, dtype=dt, generator=g)
    B, S, dim, hidden = 4, 512, 2048, 5632
    inp = torch.randn(B, S, dim, device=dev, dtype=dt, generator=g)
    wg, wu = (torch.randn(hidden, dim, device=dev, dtype=dt, generator=g) / dim ** 0.5
              for _ in range(2))
    wd = torch.randn(dim, hidden, device=dev, dtype=dt, generator=g) / hidden ** 0.5

    def dyt(with_beta: bool):
        leaves = [t.clone().requires_grad_(True) for t in (x, alpha, gamma)]
        b = beta.clone().requires_grad_(True) if with_beta else None
        y = LigerDyTFunction.apply(*leaves, b)
        y.backward(dy)
        grads = [t.grad for t in leaves] + ([b.grad] if with_beta else [])
        return [y.detach(), *grads]

    def mlp_inference():
        with torch.no_grad():
            return [LigerMLPFunction.apply(inp, wg, wu, wd)]

    return {"dyt_beta_fwd_bwd": lambda: dyt(True), "dyt_nobeta_fwd_bwd": lambda: dyt(False),
            "swiglu_mlp_inference": mlp_inference}


def gemlite_ops() -> dict:
    import torch
    from gemlite.helper import A16W4_HQQ_INT

    dev, dt = "cuda", torch.float16
    g = torch.Generator(device=dev).manual_seed(0)
    n_in, n_out, group = 4096, 4096, 128
    w_q = torch.randint(0, 16, (n_out, n_in), device=dev, dtype=torch.uint8, generator=g)
    scales = torch.rand(n_out, n_in // group, device=dev, dtype=dt, generator=g) * 0.02 + 0.005
    zeros = torch.full((n_out, n_in // group), 7.5, device=dev, dtype=dt)
    layer = A16W4_HQQ_INT(device=dev, dtype=dt).from_weights(w_q, scales, zeros)
    xs = {b: torch.randn(b, n_in, device=dev, dtype=dt, generator=g) for b in (1, 16, 128)}

    def linear(b: int):
        with torch.no_grad():
            return [layer(xs[b])]

    return {f"a16w4_batch{b}": (lambda b=b: linear(b)) for b in xs}


def run(lib: str, mode: str, work: Path) -> dict:
    import torch
    import triton
    from triton.runtime.autotuner import Autotuner

    benched: list[int] = []
    real_bench = Autotuner._bench

    def counting(self, *a, **k):
        benched.append(1)
        return real_bench(self, *a, **k)

    Autotuner._bench = counting
    if mode.startswith("ks"):
        import logging

        import kernelsearch

        # kernelsearch's per-kernel decisions (a miss, a share refused and why) in the stderr.
        logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
        logging.getLogger("kernelsearch").setLevel(logging.INFO)

        triton.autotune = kernelsearch.autotune
    got: dict = {"lib": lib, "mode": mode, "errors": {}}
    try:
        ops = liger_ops() if lib == "liger" else gemlite_ops()
    except Exception as exc:  # the library's import or set-up failed under this mode
        got["errors"]["setup"] = _error(exc)
        ops = {}
    torch.cuda.synchronize()
    outs: dict = {}
    t0 = time.perf_counter()
    for name, op in ops.items():
        try:
            outs[name] = [t.detach().float().cpu() for t in op()]
        except Exception as exc:
            got["errors"][name] = _error(exc)
    torch.cuda.synchronize()
    got["first_call_to_results_s"] = round(time.perf_counter() - t0, 2)
    got["configs_benchmarked"] = len(benched)
    got["sources"] = _sources()
    got["picks"] = _picks()
    got["ops"] = sorted(ops)
    if mode.startswith("ks"):
        from kernelsearch.backends import BACKENDS

        BACKENDS.drain(60)
    work.mkdir(parents=True, exist_ok=True)
    torch.save(outs, work / f"{lib}-{mode}.pt")
    (work / f"{lib}-{mode}.json").write_text(json.dumps(got, indent=1, default=str))
    return got


def _error(exc: BaseException) -> str:
    tb = traceback.format_exception(exc)
    where = [ln.strip() for ln in tb if ln.strip().startswith("File ")][-3:]
    return f"{type(exc).__name__}: {exc}"[:600] + " | at " + " <- ".join(reversed(where))


def _compare(got: dict, want: dict) -> dict:
    """Per op: the largest relative error (norm of the difference over the norm) of its tensors
    against triton.autotune's, and whether every tensor is bitwise equal; None where missing."""
    import torch

    out: dict = {}
    for name, ref in want.items():
        mine = got.get(name)
        if mine is None or len(mine) != len(ref):
            out[name] = None
            continue
        errs = [float(torch.linalg.vector_norm(a.double() - b.double()) /
                      max(float(torch.linalg.vector_norm(b.double())), 1e-30))
                for a, b in zip(mine, ref)]
        out[name] = {"rel_err": max(errs), "bitwise": all(torch.equal(a, b) for a, b in zip(mine, ref))}
    return out


def table(work: Path, out: Path | None) -> str:
    import torch

    lines, summary = [], {}
    for lib in LIBS:
        rows = {m: json.loads((work / f"{lib}-{m}.json").read_text())
                for m in MODES if (work / f"{lib}-{m}.json").exists()}
        if not rows:
            continue
        ref = (torch.load(work / f"{lib}-triton.pt", weights_only=True)
               if (work / f"{lib}-triton.pt").exists() else {})
        lines.append(f"== {lib}: ops {next(iter(rows.values()))['ops']}")
        lines.append(f"{'mode':10} {'first call->results':>20} {'benchmarked':>12}  sources / errors")
        for m, r in rows.items():
            r["vs_triton"] = _compare(torch.load(work / f"{lib}-{m}.pt", weights_only=True), ref)
            worst = [v["rel_err"] for v in r["vs_triton"].values() if v is not None]
            missing = [k for k, v in r["vs_triton"].items() if v is None]
            lines.append(f"{m:10} {r['first_call_to_results_s']:>18.2f} s {r['configs_benchmarked']:>12}  "
                         f"{r['sources']}; outputs vs triton.autotune: max rel err "
                         f"{max(worst) if worst else float('nan'):.2e}"
                         f"{', missing ' + str(missing) if missing else ''}")
            for op, err in r["errors"].items():
                lines.append(f"{'':10} ERROR {op}: {err}")
        if "ks-first" in rows and "ks-served" in rows:
            a, b = rows["ks-first"]["picks"], rows["ks-served"]["picks"]
            differ = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
            lines.append(f"ks-served ran ks-first's configs: {not differ} "
                         f"({len(a)} autotuned kernels; differing: {differ})")
            sv = rows["ks-served"]
            n_keys = sum(sv["sources"].values())
            lines.append(f"second host served with no benchmark: "
                         f"{sv['configs_benchmarked'] == 0 and not sv['errors'] and n_keys > 0} "
                         f"({sv['sources'].get('service', 0)} of {n_keys} keys from the service, "
                         f"{sv['configs_benchmarked']} configs benchmarked)")
        names = sorted({n for r in rows.values() for n in r["picks"]})
        lines.append(f"autotuned kernels: {names}")
        summary[lib] = rows
    text = "\n".join(lines)
    if out is not None:
        out.write_text(json.dumps(summary, indent=1, default=str))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--lib", required=True, choices=LIBS)
    r.add_argument("--mode", required=True, choices=MODES)
    r.add_argument("--work", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("work", type=Path)
    t.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        got = run(a.lib, a.mode, a.work)
        print(json.dumps({k: got[k] for k in ("lib", "mode", "first_call_to_results_s",
                                                "configs_benchmarked", "sources", "errors")}))
    else:
        print(table(a.work, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
