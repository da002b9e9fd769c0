"""Search beyond a kernel's config list (issue 35): the derived space, the per-key study (warm
start, failed trials, budget, resume), the strict gate, the re-measure's decision. Timings under
the interpreter mean nothing, so the studies here time a synthetic cost and the mechanics are
what is asserted."""
from __future__ import annotations

import optuna
import pytest
import torch
import triton
import triton.language as tl
from optuna.trial import TrialState

from kernelsearch.kernels.capture import capture_call
from kernelsearch.kernels.configs import canonical_key
from kernelsearch.search_space.derived import (DerivedRule, SpaceMode, derived_choices,
                                               derived_configs, space_mode)
from kernelsearch.search_space.key_search import (A_CONFIG, A_FAILED, A_LISTED, Budget,
                                                  ConfigFailed, refuse, search_key)
from kernelsearch.search_space.remeasure import decide, interleaved
from kernelsearch.search_space.strict_gate import GateMode, capture_draws, written_check

LISTED = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT": 3}, num_warps=4, num_stages=3),
          triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "SPLIT": 3}, num_warps=8, num_stages=4),
          triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT": 5}, num_warps=1, num_stages=2)]


def test_the_derived_space_widens_powers_of_two_and_keeps_the_rest() -> None:
    ch = derived_choices(LISTED)
    assert ch["BLOCK_M"] == (16, 32, 64, 128)          # half the smallest .. twice the largest
    assert ch["BLOCK_N"] == (32, 64, 128, 256)
    assert ch["SPLIT"] == (3, 5)                       # not powers of two: the listed values
    assert ch["num_warps"] == (1, 2, 4, 8, 16)         # 2..16, and the list's own 1
    assert ch["num_stages"] == (1, 2, 3, 4, 5, 6)
    space = derived_configs(LISTED)
    assert len(space) == 4 * 4 * 2 * 5 * 6
    listed = [canonical_key(c) for c in LISTED]
    assert [canonical_key(c) for c in space[:3]] == listed   # every listed config, first
    assert len({canonical_key(c) for c in space}) == len(space)
    assert derived_configs(LISTED, mode=SpaceMode.LIST) == [dict(c) for c in space[:3]]


def test_a_user_narrows_the_derived_space() -> None:
    ch = derived_choices(LISTED, DerivedRule(widen=1, keep=("BLOCK_N",), num_warps=(4,),
                                             num_stages=(3,)))
    assert ch["BLOCK_M"] == (32, 64) and ch["BLOCK_N"] == (64, 128)
    assert ch["num_warps"] == (1, 4, 8) and ch["num_stages"] == (2, 3, 4)
    with pytest.raises(ValueError, match="widen"):
        DerivedRule(widen=3)
    with pytest.raises(ValueError, match="KS_SEARCH_SPACE"):
        space_mode("wide")
    assert space_mode("list") is SpaceMode.LIST and space_mode("") is SpaceMode.DERIVED


def _cost(cfg: dict) -> float:
    """A synthetic time with its best outside the list (BLOCK_M 128, BLOCK_N 256, 8 warps)."""
    if cfg["num_stages"] >= 5:
        raise ConfigFailed("out of resources: shared memory")
    return (abs(cfg["BLOCK_M"].bit_length() - 8) + abs(cfg["BLOCK_N"].bit_length() - 9)
            + abs(cfg["num_warps"] - 8) / 4 + cfg["num_stages"] / 10 + 1.0)


def test_the_study_is_warm_started_with_the_list_and_its_timings(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/o.db"
    timings = {canonical_key(LISTED[0]): 9.0, canonical_key(LISTED[1]): 7.0}
    ran: list[str] = []

    def evaluate(cfg: dict) -> float:
        ran.append(canonical_key(cfg))
        return _cost(cfg)

    found = search_key(evaluate, LISTED, storage=url, study_name="k1", listed_timings=timings,
                       budget=Budget(n_trials=12, timeout_s=None))
    study = optuna.load_study(study_name="k1", storage=url)
    warm = [t for t in study.trials if t.user_attrs.get(A_LISTED)]
    assert sorted(t.value for t in warm) == [7.0, 9.0]          # measured ones: added, not run
    assert canonical_key(LISTED[0]) not in ran and canonical_key(LISTED[1]) not in ran
    assert ran[0] == canonical_key(LISTED[2])                   # the unmeasured one runs first
    assert found.evaluated == 12                                # beyond the list: the budget
    assert len(ran) == 13 == len(set(ran))                      # and the unmeasured listed one
    third = _cost(found.configs[canonical_key(LISTED[2])])
    assert found.listed_best == min([(canonical_key(LISTED[1]), 7.0),
                                     (canonical_key(LISTED[2]), third)], key=lambda kt: kt[1])
    assert found.best is not None and found.best[1] < found.listed_best[1]
    assert found.searched_candidates()[0] == found.best[0]


def test_a_config_that_fails_is_a_failed_trial_and_the_study_survives_a_restart(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/o.db"
    bad = canonical_key(triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT": 3},
                                      num_warps=4, num_stages=6))
    first = search_key(_cost, LISTED, storage=url, study_name="k2",
                       budget=Budget(n_trials=12, timeout_s=None), sampler="random")
    study = optuna.load_study(study_name="k2", storage=url)
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert failed and all(A_FAILED in t.user_attrs for t in failed)
    assert all(first.timings[t.user_attrs[A_CONFIG]] is None for t in failed)
    # The budget counts every run's configs: a second run (a worker taking over) adds 6, and
    # runs none of the first run's again; a refused config is never run again.
    refuse(url, "k2", first.best[0], "wrong on draw 1")
    ran: list[str] = []
    second = search_key(lambda c: ran.append(canonical_key(c)) or _cost(c), LISTED, storage=url,
                        study_name="k2", budget=Budget(n_trials=18, timeout_s=None),
                        sampler="random")
    assert second.evaluated == 18 and len(ran) == 6
    assert not set(ran) & {k for k, t in first.timings.items()}
    assert second.timings[first.best[0]] is None
    assert bad not in ran or second.timings[bad] is None


def test_a_config_that_does_not_compile_is_a_failed_trial(tmp_path) -> None:
    @triton.jit
    def _k(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), 1.0)

    def evaluate(cfg: dict) -> float:
        x = torch.zeros(64)
        try:
            _k[(1,)](x, BLOCK=cfg["BLOCK"])
        except Exception as exc:  # the interpreter's refusal of a non-power-of-two arange
            raise ConfigFailed(str(exc)) from None
        return 1.0 + cfg["BLOCK"] / 64

    found = search_key(evaluate, [{"BLOCK": 16}, {"BLOCK": 24}], storage=f"sqlite:///{tmp_path}/o.db",
                       study_name="k3", choices={"BLOCK": (16, 24)},
                       budget=Budget(n_trials=2, timeout_s=None))
    assert found.timings[canonical_key({"BLOCK": 24})] is None
    assert found.timings[canonical_key({"BLOCK": 16})] is not None


@triton.jit
def _full_blocks(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2 x, but only over whole blocks: right for n a multiple of BLOCK, else the tail is
    left unwritten (the kind of wrong a config beyond the list can be)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < (n // BLOCK) * BLOCK
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


def _capture(n: int):
    named = {"x_ptr": torch.randn(n), "y_ptr": torch.zeros(n), "n": n}
    configs = [{"BLOCK": 16}, {"BLOCK": 64}]
    return capture_call(named, ["BLOCK"], configs, lambda meta: (triton.cdiv(n, meta["BLOCK"]),))


def _run(cfg, values) -> None:
    x, y = values
    n = x.numel()
    _full_blocks[(triton.cdiv(n, cfg["BLOCK"]),)](x, y, n, BLOCK=cfg["BLOCK"])


def test_the_strict_gate_refuses_a_config_wrong_on_the_edge_of_the_key() -> None:
    key_call, small_edge = _capture(128), _capture(96)
    listed = capture_draws(key_call, "cpu", mode=GateMode.LISTED)
    assert written_check(_run, {"BLOCK": 16}, {"BLOCK": 64}, listed, mode=GateMode.LISTED).passed
    strict = capture_draws(key_call, "cpu", edges=[small_edge], n=2)
    assert len(strict) == 3
    got = written_check(_run, {"BLOCK": 16}, {"BLOCK": 64}, strict)
    assert not got.passed and any("edge call 0" in r for r in got.reasons)
    assert written_check(_run, {"BLOCK": 16}, {"BLOCK": 32}, strict).passed


def test_the_strict_gate_draws_fresh_floats_and_keeps_integer_contents() -> None:
    idx = torch.tensor([3, 1, 2, 0])
    cap = capture_call({"x_ptr": torch.randn(4), "i_ptr": idx, "n": 4}, [], [{"B": 4}],
                       lambda meta: (1,))
    a, b = capture_draws(cap, "cpu", n=2)
    xa, ia = a.make()
    xb, ib = b.make()
    assert not torch.equal(xa, xb)
    if ia.dtype == idx.dtype and torch.equal(ia, idx):
        assert torch.equal(ib, idx)


def test_the_remeasure_serves_only_a_confident_speedup() -> None:
    base = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0] * 3
    faster = [t / 1.3 for t in base]
    v = decide(base, faster)
    assert v.serve_searched and v.low > 1 and v.gain == pytest.approx(1.3)
    # The M=64 case: the search's pick, re-measured, is slower: the list's best is served.
    slower = [t * 2.5 for t in base]
    v = decide(base, slower)
    assert not v.serve_searched and v.gain == 1.0 and v.speedup < 1
    # Noise wider than the difference: not served either.
    noisy_a = [1.0, 3.0, 1.0, 3.0, 1.0, 3.0]
    noisy_b = [0.95, 2.9, 3.0, 0.9, 1.0, 2.8]
    assert not decide(noisy_a, noisy_b).serve_searched
    with pytest.raises(ValueError, match="times"):
        decide([1.0], [1.0])
    calls: list[str] = []
    a, b = interleaved(lambda: calls.append("A") or 1.0, lambda: calls.append("B") or 2.0, 3)
    assert calls == ["A", "B"] * 3 and a == [1.0] * 3 and b == [2.0] * 3
