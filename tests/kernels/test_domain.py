"""The built-in kernels' input domains, the gate's tolerance, and A's exact fixed-point sum."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from kernelsearch.kernels.check import check_config, rel_error
from kernelsearch.kernels.spec import Draw
from kernelsearch.kernels.vision_rope_generation_bwd import KERNEL as A

gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                         reason="needs a CUDA GPU; the same checks run under the interpreter")

SCALES = (1e-30, 1e-25, 1e-20, 1e-14, 1e-10, 1e-5, 1.0, 1e5, 1e10, 1e12, 1e20, 1e25, 1e30)
BENCH = [Draw("benchmark", "benchmark")]


@pytest.fixture(params=["vision_rope_generation_bwd", "vision_rope3d_spatial_merge_bwd"])
def kdef(request):
    """The RoPE kernels: their domains hold the magnitudes and the largest angles."""
    from kernelsearch.kernels import get_kernel

    return get_kernel(request.param)


def _small(kdef):
    return {"seq_len": 3} if kdef.name.endswith("merge_bwd") else {"total_patches": 37}


def test_domain_declares_magnitudes_and_the_largest_angles(kdef):
    draws = kdef.domain.draws()
    scales = [d.scale for d in draws if d.scaled]
    assert min(scales) <= 1e-30 and max(scales) >= 1e30
    assert {n for d in draws for n in d.scaled} <= set(kdef.input_names)
    assert "long" in {d.name for d in draws}
    axes = {name: 64 for name in _small(kdef)}
    emb = kdef.make_inputs(axes, seed=1, distribution="long", device="cpu")[-1]
    assert emb.abs().max().item() >= 1e5  # positions up to at least 1e5 (angles in radians)


def test_the_kernels_tolerance_is_what_rejects_a_slightly_wrong_result(kdef):
    """Pins rtol: a result off by 1.3e-4 (unreduced fast sine at 1e4 rad, measured on the H200)
    fails the gate as declared; the same gate ten times looser lets it through."""
    real = kdef.launch

    def off(*inputs, config, out=None):
        outs = real(*inputs, config=config, out=out)
        for o in outs:
            o.mul_(1 + 1.3e-4)
        return outs

    wrong = dataclasses.replace(kdef, launch=off)
    axes = _small(kdef)
    assert check_config(kdef, axes, kdef.default_config, seed=1, draws=BENCH).ok
    assert not check_config(wrong, axes, kdef.default_config, seed=1, draws=BENCH).ok
    loose = dataclasses.replace(wrong, rtol=kdef.rtol * 10)
    assert check_config(loose, axes, kdef.default_config, seed=1, draws=BENCH).ok


@gpu
@pytest.mark.gpu
def test_gpu_unreduced_fast_trig_is_rejected_on_the_largest_angles(kdef):
    """On the GPU `approx` is the hardware's sin.approx/cos.approx: the domain's largest angles
    reject it, while `approx_rr` and `precise` pass the same draw."""
    axes = {"seq_len": 1024} if "seq_len" in _small(kdef) else {"total_patches": 12288}
    long = [Draw("long", "long")]
    res = check_config(kdef, axes, {"TRIG": "approx"}, seed=1, draws=long)
    assert not res.ok and "long" in res.detail, res.errors
    for trig in ("approx_rr", "precise"):
        ok = check_config(kdef, axes, {"TRIG": trig}, seed=1, draws=long)
        assert ok.ok, (trig, ok.detail)


# The two slowest under the interpreter (25-35 s each on the 2-core machine) run on the GPU only:
# there the whole list takes seconds; here the plain and the padded persistent layouts run, and
# the hybrid sweep below covers the split64, prefetch, persistent and spread layouts.
_GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (seconds there); the interpreter "
                               "runs the plain and padded fixed layouts, the hybrid sweep the others")
A_CONFIGS = [
    {"REDUCE": "fixed", "BLOCK_P": 8, "num_warps": 2},                       # 19 programs
    pytest.param({"REDUCE": "fixed", "BLOCK_P": 16, "TILES": 2, "COLS": "split64", "PIPELINE": "prefetch"},
                 marks=(_GPU_ONLY, pytest.mark.gpu)),
    pytest.param({"REDUCE": "fixed", "BLOCK_P": 8, "GRID": "persistent", "PROGRAMS_PER_SM": 2,
                  "SLOTS": "spread"}, marks=(_GPU_ONLY, pytest.mark.gpu)),
    {"REDUCE": "fixed", "BLOCK_P": 32, "COLS": "pad128", "GRID": "persistent",
     "PROGRAMS_PER_SM": 1, "PIPELINE": "prefetch"},
]


@pytest.mark.parametrize("cfg", A_CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_a_fixed_sum_is_right_and_bit_identical_across_the_float32_range(cfg):
    """Gradients scaled from 1e-30 to 1e30 (where a fixed binary point gave zeros, errors of
    3e-4 at 1e-14, and NaN from 1e10): float64 within rtol, the same bits twice."""
    cfg = A.validate_config(cfg)
    # 150 patches as in the hybrid sweep below (19 programs at BLOCK_P 8 still sum across
    # programs; the magnitudes are what this test is about). FIXED_MAX_PROGRAMS' folding is
    # test_workloads' test_a_fixed_sum_folds_more_tiles_past_its_program_limit.
    base = A.make_inputs({"total_patches": 150}, seed=11)  # on the device the kernel runs on
    for s in SCALES:
        x = (base[0] * s, base[1] * s) + base[2:]
        (ref,) = A.reference(*x)
        first = A(*x, config=cfg)
        assert rel_error(first, ref) <= A.rtol, (s, rel_error(first, ref))
        assert torch.equal(A(*x, config=cfg), first), s


HYBRID_CONFIGS = [
    {"REDUCE": "hybrid", "BLOCK_P": 8, "num_warps": 2},                      # 38 programs
    {"REDUCE": "hybrid", "BLOCK_P": 16, "TILES": 2, "COLS": "split64", "PIPELINE": "prefetch",
     "SLOTS": "spread"},
    {"REDUCE": "hybrid", "BLOCK_P": 8, "GRID": "persistent", "PROGRAMS_PER_SM": 2},
    {"REDUCE": "hybrid", "BLOCK_P": 32, "COLS": "pad128", "GRID": "persistent",
     "PROGRAMS_PER_SM": 1, "SLOTS": "spread"},
]


@pytest.mark.parametrize("cfg", HYBRID_CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_a_hybrid_sum_is_right_and_bit_identical_across_the_float32_range(cfg):
    """The same magnitudes through the hybrid sum: from 1e-14 down and 1e10 up the partials
    leave the 3-digit fixed point's exact band (where the old fixed gave zeros or NaN) and
    take the float64 path; float64 within rtol, the same bits twice."""
    cfg = A.validate_config(cfg)
    base = A.make_inputs({"total_patches": 150}, seed=11)  # on the device the kernel runs on
    for s in SCALES:
        x = (base[0] * s, base[1] * s) + base[2:]
        (ref,) = A.reference(*x)
        first = A(*x, config=cfg)
        assert rel_error(first, ref) <= A.rtol, (s, rel_error(first, ref))
        assert torch.equal(A(*x, config=cfg), first), s


def _mixed(P: int, seed: int, scales: list[tuple[int, int, float]]) -> tuple[torch.Tensor, ...]:
    """Benchmark inputs whose gradient rows lo:hi are scaled by s, for each (lo, hi, s)."""
    gc, gs, pos, inv, emb = (t.clone() for t in A.make_inputs({"total_patches": P}, seed=seed))
    for lo, hi, s in scales:
        gc[lo:hi] *= s
        gs[lo:hi] *= s
    return gc, gs, pos, inv, emb


@pytest.mark.parametrize("cfg", HYBRID_CONFIGS[:3], ids=lambda c: "-".join(str(v) for v in c.values()))
def test_a_hybrid_sum_adds_both_paths_in_one_call(cfg):
    """Rows scaled by 1e-25 and 1e25 among normal rows: some programs stay on the fixed point,
    some are flagged, in one call; float64 within rtol, the same bits twice."""
    cfg = A.validate_config(cfg)
    x = _mixed(200, 3, [(40, 80, 1e-25), (120, 136, 1e25), (190, 200, 1e-25)])
    (ref,) = A.reference(*x)
    first = A(*x, config=cfg)
    assert rel_error(first, ref) <= A.rtol, rel_error(first, ref)
    assert torch.equal(A(*x, config=cfg), first)


def test_a_hybrid_sum_keeps_tiny_partials_beside_exactly_cancelling_normal_ones():
    """Normal rows that cancel exactly across programs (the fixed point's integer sum) leave the
    result to rows scaled by 1e-25 (the float64 path): the old 3-digit fixed point gave zeros
    there; the result is the float64 sum over the tiny rows alone."""
    gc, gs, pos, inv, emb = _mixed(160, 2, [(32, 128, 1e-25)])
    for t in (gc, gs):
        t[-32:] = -t[:32]
    emb[-32:], pos[-32:] = emb[:32], pos[:32]
    (ref,) = A.reference(gc[32:128], gs[32:128], pos[32:128], inv, emb[32:128])
    got = A(gc, gs, pos, inv, emb, config={"REDUCE": "hybrid", "BLOCK_P": 8})
    assert ref.abs().min() > 1e-30
    assert rel_error(got, ref) <= A.rtol, rel_error(got, ref)


@pytest.mark.parametrize("reduce", ["fixed", "hybrid"])
def test_a_fixed_sum_is_exact_across_programs_where_a_float32_sum_is_not(reduce):
    """Two programs' partials of 1e10 that cancel, at opposite ends of the grid: an ordered
    float32 sum loses everything between them, the integer sum keeps it."""
    gc, gs, pos, inv, emb = (t.clone() for t in A.make_inputs({"total_patches": 160}, seed=2))
    for t in (gc, gs):
        t[:8] *= 1e10
        t[-8:] = -t[:8]
    emb[-8:], pos[-8:] = emb[:8], pos[:8]
    x = (gc, gs, pos, inv, emb)
    (ref,) = A.reference(*x)
    fixed = A(*x, config={"REDUCE": reduce, "BLOCK_P": 8})
    ticket = A(*x, config={"REDUCE": "ticket", "BLOCK_P": 8})
    assert rel_error(fixed, ref) <= A.rtol
    assert rel_error(ticket, ref) > 100 * A.rtol  # what the exact sum buys


def test_a_fixed_sum_words_are_clean_after_a_persistent_launch():
    """A later call on another grid (another program count) still completes every output."""
    big = A.validate_config({"REDUCE": "fixed", "BLOCK_P": 8, "GRID": "persistent",
                             "PROGRAMS_PER_SM": 3})
    small = A.validate_config({"REDUCE": "fixed", "BLOCK_P": 16})
    spread = A.validate_config({"REDUCE": "fixed", "BLOCK_P": 16, "SLOTS": "spread"})
    hybrid = A.validate_config({"REDUCE": "hybrid", "BLOCK_P": 8, "GRID": "persistent",
                                "PROGRAMS_PER_SM": 3})
    for P, cfg in ((200, big), (37, small), (200, spread), (200, small), (5, big), (37, spread),
                   (200, hybrid), (37, small), (5, hybrid)):
        res = check_config(A, {"total_patches": P}, cfg, seed=P, draws=BENCH)
        assert res.ok, (P, res.detail)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [{}, HYBRID_CONFIGS[1],
                                 {"REDUCE": "hybrid", "COLS": "split64", "BLOCK_P": 128,
                                  "GRID": "persistent", "PROGRAMS_PER_SM": 2, "num_warps": 8}],
                         ids=["default", "tiles2-spread", "persistent"])
def test_gpu_a_hybrid_sum_is_right_and_the_same_bits_under_contention(cfg):
    """On the GPU the grid's atomics race and flagged rows cross the fences for real: 12288
    patches with tiny, huge and normal rows, and all-tiny inputs (every program flagged), give
    float64 within rtol and the same bits in 50 calls; a NaN call leaves the next one clean."""
    cfg = A.validate_config(cfg)
    P = 12288
    gc, gs, pos, inv, emb = (t.cuda() for t in _mixed(P, 5, [(1000, 3000, 1e-25),
                                                             (7000, 7100, 1e25)]))
    tiny = [t.cuda() for t in _mixed(P, 6, [(0, P, 1e-30)])]
    for x in ((gc, gs, pos, inv, emb), tuple(tiny)):
        (ref,) = A.reference(*x)
        first = A(*x, config=cfg)
        assert rel_error(first, ref) <= A.rtol, rel_error(first, ref)
        for _ in range(50):
            assert torch.equal(A(*x, config=cfg), first)
    bad = gc.clone()
    bad[123, 4] = float("nan")
    assert torch.isnan(A(bad, gs, pos, inv, emb, config=cfg)[4])
    res = check_config(A, {"total_patches": P}, cfg, seed=7)
    assert res.ok, res.detail
