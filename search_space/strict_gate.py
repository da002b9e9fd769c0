"""The undeclared kernels' correctness check, in two modes: a listed config's and a searched one's.

An undeclared kernel has no reference: a config is right when every tensor it writes matches
what the first listed config writes (kernels.undeclared.written_mismatches, at DTYPE_RTOL by
dtype). A listed config (`GateMode.LISTED`) is checked on the call it was tuned on, as
`@kernelsearch.autotune` shares it. A config found beyond the list (`GateMode.STRICT`) has no
user's word that it is valid for the kernel at all, so it is checked on several input draws of
the captured shape (fresh random floats, integer contents as captured: indices stay indices)
and on the key's edges (the largest and smallest captured call sharing the key, where the
capture has them); failing any one refuses it, and the search records it as failed for good
(search_space.key_search.refuse).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import torch

from kernelsearch.kernels.capture import Capture, rebuild
from kernelsearch.kernels.undeclared import written_mismatches

STRICT_DRAWS = 3


class GateMode(enum.StrEnum):
    """How much a config must show before it is shared or served."""

    LISTED = "listed"   # the one call it was tuned on
    STRICT = "strict"   # several draws of the captured shape, and the key's edges


@dataclass(frozen=True)
class Draw:
    """One set of inputs to compare on, and what it is (for the refusal's message)."""

    what: str
    make: Callable[[], list[Any]]
    # How a config runs on this draw, when not as the gate's `run` does (an edge call of the
    # key: its own sizes and grids).
    run: Callable[[Mapping[str, Any], list[Any]], None] | None = None


@dataclass
class GateResult:
    passed: bool
    worst_rel_error: float = 0.0
    reasons: list[str] = field(default_factory=list)
    draws: int = 0


def capture_draws(capture: Capture, device: torch.device | str, *, mode: GateMode = GateMode.STRICT,
                  n: int = STRICT_DRAWS, edges: Sequence[Capture] = (), seed: int = 0,
                  edge_runs: Sequence[Callable[[Mapping[str, Any], list[Any]], None]] = ()
                  ) -> list[Draw]:
    """The draws a config is compared on: the capture's first draw (LISTED), or `n` draws of the
    captured shape and one of each edge capture (STRICT), run by its `edge_runs` entry when
    given (an edge's own scalars and grids). Each draw is the call's tensors, in the capture's
    order (`Capture.tensor_names`, as `CapturedKernel.captured_inputs`)."""

    def of(c: Capture, s: int) -> Callable[[], list[Any]]:
        def make() -> list[Any]:
            got = rebuild(c, device, seed=s)
            return [got[name] for name in c.tensor_names]
        return make

    if mode is GateMode.LISTED:
        return [Draw("the captured call", of(capture, seed))]
    out = [Draw(f"draw {i} of the captured shape", of(capture, seed + i)) for i in range(n)]
    runs = list(edge_runs) + [None] * (len(edges) - len(edge_runs))
    out += [Draw(f"edge call {i} of the key", of(e, seed), runs[i]) for i, e in enumerate(edges)]
    return out


def _clone(values: Sequence[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def written_check(run: Callable[[Mapping[str, Any], list[Any]], None], first: Mapping[str, Any],
                  candidate: Mapping[str, Any], draws: Sequence[Draw], *,
                  mode: GateMode = GateMode.STRICT,
                  scratch: Collection[int] = frozenset()) -> GateResult:
    """Run `first` and `candidate` (`run(config, inputs)` launches in place) on copies of each
    draw and compare every written tensor (written_mismatches). LISTED uses the first draw
    only; STRICT every draw. A candidate that raises on a draw fails it too."""
    if not draws:
        raise ValueError("draws: the gate needs at least one input draw")
    used = draws[:1] if mode is GateMode.LISTED else draws
    result = GateResult(passed=True)
    for d in used:
        before = d.make()
        ref, got = _clone(before), _clone(before)
        launch = d.run or run
        launch(first, ref)
        try:
            launch(candidate, got)
        except Exception as exc:  # noqa: BLE001 - any failure on any draw refuses the config
            result.passed = False
            result.reasons.append(f"{d.what}: failed to run ({type(exc).__name__}: {exc})"[:300])
            continue
        worst, bad = written_mismatches(before, ref, got, scratch)
        result.worst_rel_error = max(result.worst_rel_error, worst)
        result.draws += 1
        if bad:
            result.passed = False
            result.reasons += [f"{d.what}: {b}" for b in bad]
    return result


__all__ = ["GateMode", "Draw", "GateResult", "capture_draws", "written_check", "STRICT_DRAWS"]
