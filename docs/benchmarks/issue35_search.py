"""Issue 35 on the H200: search beyond a real library's own config list, per key, with a budget.

For each op of three real libraries with `@triton.autotune` kernels (nothing of them edited):

  gemlite  gemlite's 4-bit weight-only linear (A16W4, group 128, 4096 x 4096) at M=64 and
           M=4096: its GEMM / split-K matmul and their config lists
  liger    Liger-Kernel's DyT forward+backward (4096 x 4096, bf16) and fused SwiGLU MLP
  fla      flash-linear-attention's chunk_delta_rule forward (B=2, T=4096, H=16, bf16)
  toy      a small Triton matmul of this file (CPU under TRITON_INTERPRET: the logic's test)

the op runs once with its library's own autotuner (the list's pick), then the autotuned kernel
it launched with the longest list is searched in the derived space of that list
(search_space.derived) by a per-key Optuna study (search_space.key_search: the list's configs
enqueued first, failures as failed trials, the study in a SQLite store), with a budget of
KS35_TRIALS configs beyond the list and a share of the key's time (at most KS35_KEY_S s).
Each searched candidate faster than the list's best passes the strict gate (search_space.
strict_gate: every output of the op against the first listed config's on KS35_DRAWS fresh input
draws, integer weights kept) before the interleaved re-measure (search_space.remeasure:
KS35_REPEATS timings of each, bootstrap of the median speedup); it is served only when the
speedup is above 1 with 95 % confidence. The served config then runs on one more fresh draw
against the first listed config: a mismatch there is a wrong result served. Last, the sweep:
the whole derived space in a seeded random order (configs already timed are not run again),
exhaustive when it fits the key's time left, else the prefix that fits (the table says which).
Both the search and the sweep are scored by how many configs they ran to come within 2 % of
the best found by either.

Time: a library gets --deadline-s (default KS35_LIB_S) seconds, shared among the keys not run
yet; a key's search, gate, re-measure and sweep stay within its share (one compile may run
past it), and the table says each key's time against its share.

Every candidate, listed or derived, runs as the library's own pruner makes it for each call
(search_space.through_pruner: gemlite's `early_config_prune` yields new configs with
constexprs the list never sets); candidates the pruner turns into the same configs are timed
once. A config runs by setting the library's Autotuner to that one config (Triton then runs it
without benchmarking); the op is timed whole with triton.testing.do_bench (median, its L2
flush). Each library runs in its own process (a config that breaks the CUDA context ends only
that library's run).

    python3 issue35_search.py run --lib gemlite --out DIR     # one JSON line, DIR/gemlite.json
    python3 issue35_search.py table DIR [--summary F]         # per key, and overall
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

LIBS = ("gemlite", "liger", "fla", "toy")
TRIALS = int(os.environ.get("KS35_TRIALS", "24"))
KEY_S = float(os.environ.get("KS35_KEY_S", "30"))
LIB_S = float(os.environ.get("KS35_LIB_S", "140"))  # a library's time, shared among its keys
KEY_BUDGET_S = 60.0           # one key's time when search_op is called alone
SEARCH_SHARE = 0.45           # of a key's time left after its library's own autotune
SWEEP_RESERVE_S = 4.0         # a key's sweep stops this long before the key's end
REFINE, REFINE_TOP = 5, 3     # the fastest configs found, timed this many more times each
LIB_RESERVE_S = 3.0           # the library's imports and JSON, outside its keys
MIN_KEY_S = 8.0               # a key with less time than this is skipped (said so)
BUDGET_SLACK_S = 5.0          # one compile may run past a key's end
REPEATS = int(os.environ.get("KS35_REPEATS", "30"))
DRAWS = int(os.environ.get("KS35_DRAWS", "3"))
SAMPLER = os.environ.get("KS35_SAMPLER", "tpe")


# -- the libraries' ops: name -> make(seed) -> a call returning the op's output tensors -----------
def gemlite_ops() -> dict[str, Callable[[int], Callable[[], list]]]:
    import torch
    from gemlite import core
    from gemlite.helper import A16W4_HQQ_INT

    # gemlite's pruner yields a config of its own cache (per-device files it loads on import;
    # none for the H200 in 0.6.0), whatever it is given, for a shape the cache holds: emptied
    # before every call, the list (and each candidate) is what it works on.
    def no_cache() -> None:
        getattr(core, "GEMLITE_TRITON_CONFIG_CACHE", {}).clear()
    dev, dt = "cuda", torch.float16
    g = torch.Generator(device=dev).manual_seed(0)
    n_in, n_out, group = 4096, 4096, 128
    w_q = torch.randint(0, 16, (n_out, n_in), device=dev, dtype=torch.uint8, generator=g)
    scales = torch.rand(n_out, n_in // group, device=dev, dtype=dt, generator=g) * 0.02 + 0.005
    zeros = torch.full((n_out, n_in // group), 7.5, device=dev, dtype=dt)
    layer = A16W4_HQQ_INT(device=dev, dtype=dt).from_weights(w_q, scales, zeros)

    def make(m: int) -> Callable[[int], Callable[[], list]]:
        def at(seed: int) -> Callable[[], list]:
            x = torch.randn(m, n_in, device=dev, dtype=dt,
                            generator=torch.Generator(device=dev).manual_seed(seed))

            def op() -> list:
                no_cache()
                with torch.no_grad():
                    return [layer(x)]
            return op
        return at

    return {"a16w4_m64": make(64), "a16w4_m4096": make(4096)}


def liger_ops() -> dict[str, Callable[[int], Callable[[], list]]]:
    import torch
    from liger_kernel.ops import LigerMLPFunction
    from liger_kernel.ops.dyt import LigerDyTFunction

    dev, dt = "cuda", torch.bfloat16

    def dyt(seed: int) -> Callable[[], list]:
        g = torch.Generator(device=dev).manual_seed(seed)
        M, N = 4096, 4096
        x = torch.randn(M, N, device=dev, dtype=dt, generator=g)
        alpha = torch.full((1,), 0.5, device=dev, dtype=dt)
        gamma, beta = (torch.randn(N, device=dev, dtype=dt, generator=g) for _ in range(2))
        dy = torch.randn(M, N, device=dev, dtype=dt, generator=g)

        def op() -> list:
            leaves = [t.clone().requires_grad_(True) for t in (x, alpha, gamma, beta)]
            y = LigerDyTFunction.apply(*leaves)
            y.backward(dy)
            return [y.detach(), *[t.grad for t in leaves]]
        return op

    def mlp(seed: int) -> Callable[[], list]:
        g = torch.Generator(device=dev).manual_seed(seed)
        B, S, dim, hidden = 4, 512, 2048, 5632
        inp = torch.randn(B, S, dim, device=dev, dtype=dt, generator=g)
        g0 = torch.Generator(device=dev).manual_seed(0)  # the weights: fixed, as a model's
        wg, wu = (torch.randn(hidden, dim, device=dev, dtype=dt, generator=g0) / dim ** 0.5
                  for _ in range(2))
        wd = torch.randn(dim, hidden, device=dev, dtype=dt, generator=g0) / hidden ** 0.5

        def op() -> list:
            with torch.no_grad():
                return [LigerMLPFunction.apply(inp, wg, wu, wd)]
        return op

    return {"dyt_fwd_bwd": dyt, "swiglu_mlp": mlp}


def fla_ops() -> dict[str, Callable[[int], Callable[[], list]]]:
    import torch
    import torch.nn.functional as F
    from fla.ops.delta_rule import chunk_delta_rule

    dev, dt = "cuda", torch.bfloat16
    B, T, H, K, V = 2, 4096, 16, 128, 128

    def fwd(seed: int) -> Callable[[], list]:
        g = torch.Generator(device=dev).manual_seed(seed)
        q = torch.randn(B, T, H, K, device=dev, dtype=dt, generator=g)
        k = F.normalize(torch.randn(B, T, H, K, device=dev, dtype=torch.float32, generator=g),
                        p=2, dim=-1).to(dt)
        v = torch.randn(B, T, H, V, device=dev, dtype=dt, generator=g)
        beta = torch.rand(B, T, H, device=dev, dtype=dt, generator=g).sigmoid()

        def op() -> list:
            with torch.no_grad():
                o, _ = chunk_delta_rule(q, k, v, beta)
                return [o]
        return op

    return {"chunk_delta_rule_fwd": fwd}


def toy_ops() -> dict[str, Callable[[int], Callable[[], list]]]:
    """A small autotuned matmul (this file's), for the CPU test under TRITON_INTERPRET."""
    import torch
    import triton
    import triton.language as tl

    def wall_bench(fn: Callable[[], Any], quantiles: Any = None, **_: Any) -> list[float]:
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return [ms] * (len(quantiles) if quantiles else 1)

    @triton.autotune(configs=[triton.Config({"BM": 16, "BN": 16}, num_warps=4),
                              triton.Config({"BM": 32, "BN": 16}, num_warps=4)], key=["M", "N"],
                     do_bench=wall_bench)
    @triton.jit
    def mm(a, b, c, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        rk = tl.arange(0, K)
        x = tl.load(a + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
        y = tl.load(b + rk[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
        m = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(c + rm[:, None] * N + rn[None, :], tl.dot(x, y), mask=m)

    def at(seed: int) -> Callable[[], list]:
        g = torch.Generator().manual_seed(seed)
        M, N, K = 32, 32, 16
        a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)

        def op() -> list:
            c = torch.empty(M, N)
            mm[lambda meta: (triton.cdiv(M, meta["BM"]), triton.cdiv(N, meta["BN"]))](a, b, c, M, N, K)
            return [c]
        return op

    return {"toy_mm": at}


# -- the search of one key -----------------------------------------------------------------------
def _config_dict(c: Any) -> dict:
    from kernelsearch.kernels.configs import canonical

    return canonical(c)


def _tuners() -> list:
    from triton.runtime.autotuner import Autotuner

    return [o for o in gc.get_objects() if isinstance(o, Autotuner)]


def _timer(op: Callable[[], Any], on_gpu: bool) -> Callable[[], float]:
    if on_gpu:
        import torch
        from triton.testing import do_bench

        def t() -> float:
            v = float(do_bench(op, warmup=5, rep=20, return_mode="median")) * 1e3
            torch.cuda.synchronize()
            return v
        return t

    def wall() -> float:
        t0 = time.perf_counter()
        op()
        return (time.perf_counter() - t0) * 1e6
    return wall


def search_op(name: str, make: Callable[[int], Callable[[], list]], storage: str,
              on_gpu: bool, budget_s: float = KEY_BUDGET_S) -> dict:
    """One key within `budget_s` seconds: the list's pick, the search, the gate, the re-measure,
    the sweep (module doc). The library's autotuner is given back its list, cache and run
    whatever happens."""
    restore: list[Callable[[], None]] = []
    try:
        return _search_op(name, make, storage, on_gpu, budget_s, restore)
    finally:
        for undo in restore:
            undo()


def _reach(seq: list[float | None], target: float) -> int | None:
    """How many configs of `seq` (timings in run order, None: failed) it took to come within
    2 % of `target`; None when it never did."""
    for i, v in enumerate(seq, 1):
        if v is not None and v <= target * 1.02:
            return i
    return None


def _search_op(name: str, make: Callable[[int], Callable[[], list]], storage: str,
               on_gpu: bool, budget_s: float, restore: list[Callable[[], None]]) -> dict:
    import torch
    import triton

    from kernelsearch.kernels.configs import canonical_key
    from kernelsearch.kernels.undeclared import written_mismatches
    from kernelsearch.search_space.derived import derived_choices, derived_configs
    from kernelsearch.search_space.key_search import Budget, ConfigFailed, search_key
    from kernelsearch.search_space.remeasure import remeasure
    from kernelsearch.search_space.strict_gate import Draw, GateMode, written_check
    from kernelsearch.search_space.through_pruner import PrunedRuns

    t0 = time.perf_counter()
    key_end = t0 + budget_s
    before = {id(t): dict(t.cache) for t in _tuners()}
    op = make(0)
    op()  # the library's own autotune: the list's pick
    touched = [t for t in _tuners() if len(t.cache) > len(before.get(id(t), {}))]
    touched = [t for t in touched if len(t.configs) > 1]
    if not touched:
        return {"op": name, "error": "no autotuned kernel with a list of 2+ configs ran"}
    tuner = max(touched, key=lambda t: len(t.configs))
    own_s = time.perf_counter() - t0
    kernel = f"{tuner.base_fn.__module__}.{tuner.base_fn.__qualname__}"
    listed_tc = list(tuner.configs)
    listed = [_config_dict(c) for c in listed_tc]
    hook = next((c.pre_hook for c in listed_tc if c.pre_hook is not None), None)
    picked = _config_dict(next(iter(tuner.cache.values())))
    saved = (list(tuner.configs), dict(tuner.cache))
    # Every candidate, listed or derived, runs as the kernel's own pruner makes it for each call.
    pruned = PrunedRuns(tuner)

    def undo() -> None:
        pruned.undo()
        tuner.configs = saved[0]
        tuner.cache.clear()
        tuner.cache.update(saved[1])
    restore.append(undo)
    space = derived_configs(listed)
    choices = derived_choices(listed)
    timings: dict[str, float | None] = {}   # by candidate
    by_ran: dict[str, float | None] = {}    # by what the pruner made of it: timed once
    ran_as: dict[str, str] = {}
    cfg_of: dict[str, dict] = {}
    why: dict[str, str] = {}                # a failed candidate's error
    fresh_s: list[float] = []

    def use(cfg: dict) -> None:
        meta = {k: v for k, v in cfg.items() if k not in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
        same = next((c for c in listed_tc if canonical_key(_config_dict(c)) == canonical_key(cfg)), None)
        pruned.use(same or triton.Config(meta, num_warps=cfg.get("num_warps", 4),
                                         num_stages=cfg.get("num_stages", 3),
                                         num_ctas=cfg.get("num_ctas", 1),
                                         maxnreg=cfg.get("maxnreg"), pre_hook=hook))

    def evaluate(cfg: dict) -> float:
        key = canonical_key(cfg)
        if key in timings:
            if timings[key] is None:
                raise ConfigFailed("failed before")
            return float(timings[key])  # type: ignore[arg-type]
        s0 = time.perf_counter()
        ident = None
        try:
            use(cfg)
            op()
            ident = pruned.identity()
            ran_as[key], cfg_of[key] = ident, cfg
            if ident in by_ran:
                v = by_ran[ident]
                if v is None:
                    raise ConfigFailed("the pruner made it a config that failed before")
            else:
                v = statistics.median(_timer(op, on_gpu)() for _ in range(2))
                fresh_s.append(time.perf_counter() - s0)
        except Exception as exc:  # compile errors, out of resources, pruned away: a failed trial
            if on_gpu and "illegal" in str(exc).lower():
                raise
            timings[key] = None
            if ident is not None:
                by_ran[ident] = None
            why[key] = f"{type(exc).__name__}: {str(exc)[:200]}"
            raise ConfigFailed(why[key]) from None
        timings[key] = by_ran[ident] = v
        return v

    left = key_end - time.perf_counter()
    search_budget_s = max(1.0, min(KEY_S, SEARCH_SHARE * left))
    s_start = time.perf_counter()
    found = search_key(evaluate, listed, storage=storage, study_name=f"issue35/{name}",
                       choices=choices, budget=Budget(n_trials=TRIALS, timeout_s=search_budget_s),
                       sampler=SAMPLER)
    search_s = time.perf_counter() - s_start
    out: dict[str, Any] = {"op": name, "kernel": kernel, "listed": len(listed),
                           "derived_space": len(space), "library_pick": picked,
                           "own_autotune_s": round(own_s, 1),
                           "evaluated_beyond_list": found.evaluated, "search_ran": len(found.order),
                           "trials_to_best": found.trials_to_best, "stopped": found.stopped,
                           "search_s": round(search_s, 1), "search_budget_s": round(search_budget_s, 1),
                           "failed_configs": sum(1 for v in found.timings.values() if v is None),
                           "budget_s": round(budget_s, 1)}
    lb = found.listed_best
    if lb is None:
        out["error"] = "no listed config ran"
        out["why"] = sorted(set(why.values()))[:3]
        return out
    out["list_best_us"] = lb[1]
    first = listed[0]
    shapes: list = []

    def run(cfg: Any, values: list) -> None:
        use(dict(cfg))
        got = make(values[0])()
        for dst, src in zip(values[1:], got):
            dst.copy_(src)

    use(first)
    ref_out = op()
    shapes = [(t.shape, t.dtype, t.device) for t in ref_out]

    def draw(seed: int) -> Draw:
        return Draw(f"draw seed {seed}", lambda: [seed, *[torch.full(s, float("nan"), dtype=d, device=v)
                                                         for s, d, v in shapes]])

    draws = [draw(1 + i) for i in range(DRAWS)]
    served, verdict, refused = lb[0], None, []
    for key in found.searched_candidates(3):
        if ran_as.get(key) == ran_as.get(lb[0]):
            continue  # the pruner made it the list's best: nothing to re-measure
        gate = written_check(run, first, found.configs[key], draws, mode=GateMode.STRICT)
        if not gate.passed:
            refused.append({"config": found.configs[key], "why": gate.reasons[:2]})
            continue
        lcfg, scfg = found.configs[lb[0]], found.configs[key]

        def t_list() -> float:
            use(lcfg)
            return _timer(op, on_gpu)()

        def t_new() -> float:
            use(scfg)
            return _timer(op, on_gpu)()
        v = remeasure(t_list, t_new, repeats=REPEATS)
        verdict = {"config": scfg, "ran_as": pruned.made.get(ran_as.get(key, "")),
                   "speedup": round(v.speedup, 4), "low": round(v.low, 4),
                   "high": round(v.high, 4), "served": v.serve_searched,
                   "list_us": round(v.list_median_us, 3), "searched_us": round(v.searched_median_us, 3)}
        if v.serve_searched:
            served = key
        break
    # The served config against the first listed one on one more fresh draw.
    final = draw(1000)
    vals_ref, vals_got = final.make(), final.make()
    run(first, vals_ref)
    run(found.configs[served], vals_got)
    nanb = final.make()
    _, bad = written_mismatches(nanb, vals_ref, vals_got)
    # The sweep: the derived space in a seeded random order, exhaustive when it fits the key's
    # time left (configs the search ran are not run again), else the prefix that fits.
    order = list(space)
    random.Random(35).shuffle(order)
    per_cfg = statistics.median(fresh_s) if fresh_s else 1.0
    sweep_end = key_end - SWEEP_RESERVE_S
    sw0 = time.perf_counter()
    for cfg in order:
        if canonical_key(cfg) not in timings and time.perf_counter() + per_cfg > sweep_end:
            break
        try:
            evaluate(cfg)
        except ConfigFailed:
            pass
    swept = [canonical_key(c) for c in order if canonical_key(c) in timings]
    exhaustive = len(swept) == len(space)
    # The best of many single timings is biased low: the fastest few configs (as the pruner made
    # them) are timed REFINE more times, and their medians stand for them in "within 2 %".
    fastest = sorted({ran_as[k]: v for k, v in timings.items() if v is not None}.items(),
                     key=lambda iv: iv[1])[:REFINE_TOP]
    for ident, _ in fastest:
        use(cfg_of[next(k for k, r in ran_as.items() if r == ident)])
        v = statistics.median(_timer(op, on_gpu)() for _ in range(REFINE))
        for k, r in ran_as.items():
            if r == ident and timings.get(k) is not None:
                timings[k] = v
    best = min(v for v in timings.values() if v is not None)
    search_seq = [timings.get(k) for k in found.order]
    sweep_seq = [timings[k] for k in swept]
    beyond = [(k, t) for k, t in found.ranked() if k not in found.listed]
    out.update({"verdict": verdict, "refused": refused,
                "served": "search" if served != lb[0] else "list",
                "served_config": found.configs[served],
                "served_ran_as": pruned.made.get(ran_as.get(served, "")),
                "gain": verdict["speedup"] if verdict and verdict["served"] else 1.0,
                "wrong_served": 1 if bad else 0, "wrong_detail": bad[:2],
                "distinct_configs_ran": len(set(ran_as.values())),
                "pruner_rewrote": sum(1 for k, r in ran_as.items() if r != k),
                "sweep_configs": len(swept), "sweep_exhaustive": exhaustive,
                "sweep_s": round(time.perf_counter() - sw0, 1),
                "best_found_us": best, "sweep_best_us": min((v for v in sweep_seq if v is not None), default=None),
                "searched_best_us": found.best[1] if found.best else None,
                "search_best_beyond_list_us": beyond[0][1] if beyond else None,
                "search_to_2pct": _reach(search_seq, best),
                "sweep_to_2pct": _reach(sweep_seq, best)})
    return out


def run_lib(lib: str, out_dir: Path, deadline_s: float = LIB_S) -> dict:
    """Every key of `lib`, the library's time (`deadline_s`) shared among the keys left."""
    import torch

    start = time.perf_counter()
    on_gpu = torch.cuda.is_available() and lib != "toy"
    ops = {"gemlite": gemlite_ops, "liger": liger_ops, "fla": fla_ops, "toy": toy_ops}[lib]()
    out_dir.mkdir(parents=True, exist_ok=True)
    db = out_dir / f"{lib}-studies.db"
    db.unlink(missing_ok=True)
    storage = f"sqlite:///{db}"
    rows: list[dict] = []
    got: dict[str, Any] = {}
    names = list(ops)
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        budget = (deadline_s - (t0 - start) - LIB_RESERVE_S) / (len(names) - i)
        if budget < MIN_KEY_S:
            rows.append({"op": name, "error": f"skipped: {budget:.0f} s left of the library's "
                                              f"{deadline_s:g} s"})
        else:
            try:
                row = search_op(name, ops[name], storage, on_gpu, budget)
            except Exception as exc:
                row = {"op": name, "error": f"{type(exc).__name__}: {exc}"[:400],
                       "at": traceback.format_exc()[-600:]}
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            row["budget_s"] = round(budget, 1)
            row["within_budget"] = row["wall_s"] <= budget + BUDGET_SLACK_S
            rows.append(row)
        print(json.dumps({"lib": lib, **{k: rows[-1].get(k) for k in
                                         ("op", "served", "gain", "wall_s", "error")}}), file=sys.stderr)
        # Written after every key: a library killed by its time limit keeps what it did.
        got = {"lib": lib, "device": torch.cuda.get_device_name() if on_gpu else "cpu",
               "budget": {"trials": TRIALS, "key_s": KEY_S, "lib_s": deadline_s,
                          "repeats": REPEATS, "draws": DRAWS, "sampler": SAMPLER}, "keys": rows}
        (out_dir / f"{lib}.json").write_text(json.dumps(got, indent=1, default=str))
    return got


def _us(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}"


def _line(r: dict) -> str:
    head = f"{r['lib']:8s} {r['op']:22s}"
    if r.get("error"):
        return f"{head} ERROR {r['error'][:120]} {'; '.join(r.get('why', []))[:200]}"
    v = r.get("verdict") or {}
    ran = r["search_ran"]
    s2, w2 = r["search_to_2pct"], r["sweep_to_2pct"]
    sweep_kind = ("(exhaustive)" if r["sweep_exhaustive"]
                  else f"(a random subsample of the {r['derived_space']}: not exhaustive)")
    if v:
        vs = f"re-measured x{v['speedup']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
    else:
        vs = f"no candidate beat the list (search's best beyond it {_us(r['search_best_beyond_list_us'])} us)"
    return (f"{head} list {r['listed']:3d} space {r['derived_space']:5d} | search ran {ran:3d} "
            f"({r['evaluated_beyond_list']} beyond, {r['failed_configs']} failed, "
            f"{r['distinct_configs_ran']} distinct after the pruner) in {r['search_s']:.1f} s"
            f" | list best {_us(r['list_best_us'])} us, served {r['served']}: gain {r['gain']:.3f}, {vs}"
            f" | refused {len(r['refused'])}, wrong served {r['wrong_served']}"
            f" | best found {_us(r['best_found_us'])} us; to within 2 %: search "
            f"{s2 if s2 is not None else 'never'}/{ran}, sweep "
            f"{w2 if w2 is not None else 'never'}/{r['sweep_configs']}"
            f" {sweep_kind}"
            f" | key {r['wall_s']:.0f} s of {r['budget_s']:.0f} s")


def table(out_dir: Path) -> dict:
    """The table (per key) and the summary (overall) of a run's JSON files."""
    rows = []
    for f in sorted(out_dir.glob("*.json")):
        doc = json.loads(f.read_text())
        if not isinstance(doc, dict) or "keys" not in doc:
            continue
        for r in doc.get("keys", []):
            rows.append({"lib": doc["lib"], **r})
    good = [r for r in rows if not r.get("error")]
    served = [r["gain"] for r in good if r["served"] == "search"]
    speedups = [r["verdict"]["speedup"] for r in good if r.get("verdict")]
    per_key = {f"{r['lib']}/{r['op']}": (
        {"error": r["error"][:200]} if r.get("error") else
        {"served": r["served"], "gain": r["gain"],
         "speedup_median": (r.get("verdict") or {}).get("speedup"),
         "speedup_ci": [(r.get("verdict") or {}).get("low"), (r.get("verdict") or {}).get("high")],
         "list_best_us": r["list_best_us"], "best_found_us": r["best_found_us"],
         "search_ran": r["search_ran"], "search_to_2pct": r["search_to_2pct"],
         "sweep_configs": r["sweep_configs"], "sweep_exhaustive": r["sweep_exhaustive"],
         "sweep_to_2pct": r["sweep_to_2pct"], "derived_space": r["derived_space"],
         "wrong_served": r["wrong_served"], "wall_s": r["wall_s"], "budget_s": r["budget_s"],
         "within_budget": r["within_budget"]}) for r in rows}
    summary = {
        "keys": len(rows), "keys_ok": len(good),
        "libraries_ok": sorted({r["lib"] for r in good}),
        "served_searched": len(served),
        "served_gain_median": statistics.median(served) if served else None,
        "served_gain_min": min(served) if served else None,
        "served_gain_max": max(served) if served else None,
        "served_below_1": sum(1 for g in served if g < 1.0),
        "remeasured_speedup_median": statistics.median(speedups) if speedups else None,
        "remeasured_speedup_spread": [min(speedups), max(speedups)] if speedups else None,
        "wrong_results_served": sum(r.get("wrong_served", 0) for r in good),
        "refused_by_gate": sum(len(r.get("refused", [])) for r in good),
        "keys_within_budget": sum(1 for r in good if r.get("within_budget")),
        "per_key": per_key,
    }
    print("\n".join(_line(r) for r in rows))
    print(json.dumps({k: v for k, v in summary.items() if k != "per_key"}))
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--lib", choices=LIBS, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--deadline-s", type=float, default=LIB_S,
                   help="the library's seconds, shared among its keys")
    t = sub.add_parser("table")
    t.add_argument("dir", type=Path)
    t.add_argument("--summary", type=Path, help="also write the summary (per key too) as JSON")
    a = ap.parse_args()
    if a.cmd == "run":
        got = run_lib(a.lib, a.out, a.deadline_s)
        print(json.dumps({"lib": a.lib, "keys": len(got["keys"]),
                          "errors": sum(1 for k in got["keys"] if k.get("error"))}))
        return 0
    summary = table(a.dir)
    if a.summary:
        a.summary.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
