"""Workload-specific properties: A's determinism and single launch, B's split strategies."""
from __future__ import annotations

import importlib

import pytest
import torch

from kernelsearch.kernels.vision_rope3d_spatial_merge_bwd import KERNEL as B
from kernelsearch.kernels.vision_rope_generation_bwd import KERNEL as A
from kernelsearch.kernels.check import check_config, rel_error

# The domain's draws without the scaled copies of the gradients (1e-30 .. 1e30): the benchmark,
# realistic and long-position inputs. Where a test is about counters, grids or tile loops, the
# magnitudes add nothing; test_domain sweeps 13 magnitudes through the fixed and hybrid sums,
# the only reductions whose result depends on them (a float32 ticket or single sum scales).
UNSCALED = [d for d in A.domain.draws() if not d.scaled]


def gpu(fn):
    """Marked `gpu` and skipped without one; the same checks run under the interpreter."""
    fn = pytest.mark.skipif(not torch.cuda.is_available(),
                            reason="needs a CUDA GPU; the same checks run under the interpreter")(fn)
    return pytest.mark.gpu(fn)


def test_a_deterministic_bits():
    inputs = A.make_inputs({"total_patches": 300}, seed=9)
    cfg = A.validate_config({"BLOCK_P": 16, "TILES": 2})
    first = A(*inputs, config=cfg)
    for _ in range(3):
        assert torch.equal(A(*inputs, config=cfg), first)


def test_a_ticket_counter_resets_between_calls():
    """The last program resets the counter: later calls with other grids still reduce right."""
    for P, bp, tiles in ((300, 8, 1), (37, 16, 2), (1000, 32, 4), (5, 8, 1)):
        cfg = A.validate_config({"BLOCK_P": bp, "TILES": tiles, "REDUCE": "ticket"})
        res = check_config(A, {"total_patches": P}, cfg, seed=P, draws=UNSCALED)
        assert res.ok, (P, res.detail)


# Each config is checked on the whole domain, but for the float32 reductions (ticket, ticket2,
# single) and the two layouts test_domain sweeps across 13 magnitudes as they are (fixed-8-2,
# hybrid-8-2): those run the unscaled draws here.
@pytest.mark.parametrize("cfg", [
    {"REDUCE": "ticket2", "BLOCK_P": 8, "TILES": 1, "num_warps": 1},   # 38 programs: two groups
    {"REDUCE": "ticket2", "BLOCK_P": 8, "TILES": 2, "COLS": "split64", "PIPELINE": "prefetch"},
    {"REDUCE": "ticket", "BLOCK_P": 16, "TILES": 4, "COLS": "pad128", "PIPELINE": "prefetch"},
    {"REDUCE": "fixed", "BLOCK_P": 8, "TILES": 1, "num_warps": 2},
    {"REDUCE": "fixed", "BLOCK_P": 16, "TILES": 2, "COLS": "split64", "num_warps": 1},
    {"REDUCE": "fixed", "BLOCK_P": 32, "TILES": 1, "COLS": "pad128", "num_warps": 8},
    {"REDUCE": "hybrid", "BLOCK_P": 8, "TILES": 1, "num_warps": 2},
    {"REDUCE": "hybrid", "BLOCK_P": 16, "TILES": 2, "COLS": "split64", "num_warps": 1,
     "SLOTS": "spread"},
    {"REDUCE": "single", "BLOCK_P": 32, "COLS": "split64", "PIPELINE": "prefetch"},
])
def test_a_reductions_and_pipelines_are_correct_and_deterministic(cfg):
    """Every cross-program sum and tile loop matches float64, twice in a row to the bit (the
    second call runs on counters the first one reset, the group counters included)."""
    in_domain_sweep = cfg in ({"REDUCE": "fixed", "BLOCK_P": 8, "TILES": 1, "num_warps": 2},
                              {"REDUCE": "hybrid", "BLOCK_P": 8, "TILES": 1, "num_warps": 2})
    draws = UNSCALED if cfg["REDUCE"] in ("ticket", "ticket2", "single") or in_domain_sweep else None
    cfg = A.validate_config(cfg)
    res = check_config(A, {"total_patches": 300}, cfg, seed=4, draws=draws)
    assert res.ok, res.detail
    inputs = A.make_inputs({"total_patches": 300}, seed=5)
    assert torch.equal(A(*inputs, config=cfg), A(*inputs, config=cfg))


@pytest.mark.parametrize("reduce", ["fixed", "hybrid"])
@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_fixed_sum_poisons_nonfinite_partials_and_recovers(reduce, bad):
    """An Inf or NaN partial gives NaN, never a wrapped sum, and the words (and the hybrid
    sum's flagged rows) it touched are clean for the next call."""
    inputs = list(A.make_inputs({"total_patches": 64}, seed=1))
    inputs[0] = inputs[0].clone()
    inputs[0][5, 3] = bad
    cfg = {"REDUCE": reduce, "BLOCK_P": 8}
    out = A(*inputs, config=cfg)
    assert torch.isnan(out[3]) and torch.isfinite(out[4])
    res = check_config(A, {"total_patches": 64}, A.validate_config(cfg), seed=2)
    assert res.ok, res.detail


def test_a_hybrid_sum_clears_the_rows_it_read():
    """Flagged programs' rows are zero again after the call (the next call's flags start clean),
    and the clean call after a poisoned one is clean too."""
    mod = importlib.import_module("kernelsearch.kernels.vision_rope_generation_bwd")
    inputs = list(A.make_inputs({"total_patches": 64}, seed=1))
    inputs[0], inputs[1] = inputs[0].clone(), inputs[1].clone()
    for t in inputs[:2]:
        t[:16] *= 1e-30  # two programs flagged on every output
        t[40:48] *= 1e30  # one more
    inputs[0][60, 7] = float("nan")
    cfg = A.validate_config({"REDUCE": "hybrid", "BLOCK_P": 8})
    out = A(*inputs, config=cfg)
    assert torch.isnan(out[7]) and torch.isfinite(out).sum() == 17
    rows = [w[3] for w in mod._workspaces.values()]
    assert rows and all(not r.any() for r in rows)
    inputs[0][60, 7] = 0.0
    (ref,) = A.reference(*inputs)
    assert check_config(A, {"total_patches": 64}, cfg, seed=3).ok
    assert rel_error(A(*inputs, config=cfg), ref) <= A.rtol


@pytest.mark.parametrize("reduce", ["fixed", "hybrid"])
def test_a_fixed_sum_folds_more_tiles_past_its_program_limit(monkeypatch, reduce):
    mod = importlib.import_module("kernelsearch.kernels.vision_rope_generation_bwd")

    grids = []

    class Recording:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    real = mod._rope_gen_bwd_kernel
    monkeypatch.setattr(mod, "FIXED_MAX_PROGRAMS", 4)
    monkeypatch.setattr(mod, "_rope_gen_bwd_kernel", Recording())
    cfg = A.validate_config({"REDUCE": reduce, "BLOCK_P": 8, "TILES": 1})
    draws = A.domain.draws() if reduce == "hybrid" else None  # both of its paths, folded
    res = check_config(A, {"total_patches": 300}, cfg, seed=9, draws=draws)
    assert res.ok, res.detail
    assert grids and all(g == (4,) for g in grids)  # 38 tiles, 10 per program


_PTX = """
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernelsearch.kernels import vision_rope_generation_bwd as mod

k = mod._rope_gen_bwd_kernel
ptrs = {"gc_ptr": "*fp32", "gs_ptr": "*fp32", "pos_ptr": "*i64", "emb_ptr": "*fp32",
        "out_ptr": "*fp32", "ws_ptr": "*fp32", "counter_ptr": "*i32", "slots_ptr": "*i64",
        "rows_ptr": "*fp32", "P": "i32", "n_tiles": "i32"}
const = dict(BLOCK_P=16, TILES=1, REDUCE="hybrid", COLS="quarters", TRIG="approx_rr", ASM=True,
             RB=8, PIPELINE="none", GROUP=32, SLOT_STRIDE=16, PERSISTENT=False, WORD_STRIDE=1)
sig = {n: ptrs.get(n, "constexpr") for n in k.arg_names}
src = ASTSource(k, sig, constexprs={(k.arg_names.index(n),): v for n, v in const.items()})
cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
sys.stdout.write(cc.asm["ptx"])
"""


def test_a_hybrid_sum_ptx_fences_only_around_the_flagged_rows():
    """Compiled for sm_90 without a GPU: one relaxed 64-bit atomic instruction per thread (all
    words of all outputs), a release fence after the flagged row's store and a barrier and
    before that atomic, an acquire fence before the rows' L2 reads, and no other fence."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    got = subprocess.run([sys.executable, "-c", _PTX], env=env, capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    ops = [ln.strip() for ln in got.stdout.splitlines()
           if any(k in ln for k in ("fence", "membar", "atom.", "st.global", "bar.sync",
                                    "ld.global.cg"))]
    fences = [i for i, op in enumerate(ops) if "fence" in op or "membar" in op]
    atoms = [i for i, op in enumerate(ops) if "atom." in op]
    assert [ops[i] for i in fences] == ["fence.acq_rel.gpu;"] * 2
    assert len(atoms) == 1 and "atom.global.gpu.relaxed.add.u64" in ops[atoms[0]]
    release, acquire = fences
    assert "bar.sync" in ops[release - 1] and "st.global" in ops[release - 2]
    assert release < atoms[0] < acquire
    after = [op for op in ops[acquire + 1:] if "bar.sync" not in op]
    assert "bar.sync" in ops[acquire + 1] and "ld.global.cg" in after[0]


def test_a_prefetch_register_rule():
    with pytest.raises(ValueError, match="PIPELINE"):
        A.validate_config({"PIPELINE": "prefetch", "BLOCK_P": 64, "num_warps": 2, "TILES": 2})


def test_a_single_and_ticket_agree():
    inputs = A.make_inputs({"total_patches": 200}, seed=3)
    a = A(*inputs, config={"REDUCE": "single", "BLOCK_P": 32})
    b = A(*inputs, config={"REDUCE": "ticket", "BLOCK_P": 32, "TILES": 1})
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-4)


def test_a_max_grid_size_from_suite_case():
    inputs = A.make_inputs({"total_patches": 256}, seed=1)
    assert int(inputs[2].max()) < 16  # suite case 2: max_grid_size 16


def test_a_realistic_inputs_are_rope_tables():
    gc, gs, pos, inv, emb = A.make_inputs({"total_patches": 50}, seed=1, distribution="realistic")
    f = inv.double()
    assert torch.allclose(emb[:, :18].double(), pos[:, :1].double() * f, rtol=1e-6)
    assert torch.equal(emb[:, :36], emb[:, 36:])


def test_b_head_split_and_dim_split_agree():
    inputs = B.make_inputs({"seq_len": 5}, seed=2)
    full = B(*inputs, config={"HEADS": 16, "BLOCK_D": 64, "num_warps": 4})
    split = B(*inputs, config={"HEADS": 4, "BLOCK_D": 16, "ROWS": 2, "num_warps": 4})
    for x, y in zip(full, split):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-5)


def test_b_persistent_grid_covers_all_tiles():
    for S in (1, 9):
        cfg = B.validate_config({"GRID": "persistent", "PROGRAMS_PER_SM": 1, "ROWS": 2,
                                 "BLOCK_D": 32, "num_warps": 4})
        res = check_config(B, {"seq_len": S}, cfg, seed=S)
        assert res.ok, res.detail


def test_b_fast_trig_needs_range_reduction_on_real_angles():
    """approx_rr is checked on realistic angles (large); the check runs both draws."""
    res = check_config(B, {"seq_len": 40}, {"TRIG": "approx_rr", "ROWS": 8, "HEADS": 4, "num_warps": 4}, seed=1)
    assert res.ok, res.detail


@gpu
def test_gpu_a_one_launch_per_call():
    from torch.profiler import ProfilerActivity, profile

    inputs = A.make_inputs({"total_patches": 12288}, seed=1)
    A(*inputs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        A(*inputs)
        torch.cuda.synchronize()
    kinds = [e.name() for e in prof.profiler.kineto_results.events()
             if "cuda" in str(e.device_type()).lower()]
    assert len(kinds) == 1, kinds


@gpu
@pytest.mark.parametrize("kname", ["vision_rope_generation_bwd", "vision_rope3d_spatial_merge_bwd"])
def test_gpu_all_suite_cases_correct_default(kname):
    from kernelsearch import kernels

    k = kernels.get_kernel(kname)
    for c in k.cases:
        res = check_config(k, c.axes, k.default_config)
        assert res.ok, (c.number, res.detail)


@gpu
def test_gpu_timing_is_cupti():
    from kernelsearch.kernels.measure import CUPTI, measure_config

    t = measure_config(B, {"seq_len": 128}, B.default_config, n=5)
    assert t.method == CUPTI and t.n == 5 and t.median_us > 0


def test_suites_are_the_benchmarks_sixteen_cases():
    for k in (A, B):
        assert [c.number for c in k.cases] == list(range(1, 17))
        assert len({tuple(c.axes.items()) for c in k.cases}) == 16
        assert {p.name for p in k.params} >= {"num_warps", "TRIG"}


def test_bytes_formulas():
    P = A.cases[0].axes["total_patches"]
    assert A.bytes_moved(A.cases[0].axes) == 3 * P * 72 * 4 + P * 16 + 72
    S = B.cases[0].axes["seq_len"]
    assert B.bytes_moved(B.cases[0].axes) == 6 * S * 16 * 128 * 4 + 2 * S * 128 * 4
