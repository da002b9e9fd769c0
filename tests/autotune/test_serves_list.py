"""`serves_list` (the torch.compile hook's rule for an undeclared kernel's record) is
`kernels.configs.covers` plus "tuned on this code": a partly measured list is refused."""
from __future__ import annotations

import triton

from kernelsearch.kernels.configs import canonical_key
from kernelsearch.kernels.resolve import Found, Match
from kernelsearch.kernels.undeclared import Definition, kernel_def
from kernelsearch.identity import serves_list

LISTED = (triton.Config({"BLOCK": 32}, num_warps=4), triton.Config({"BLOCK": 64}, num_warps=4))
UND = kernel_def(Definition(name="m.k", module="m", qualname="k", arg_names=("x", "n"), key=("n",),
                            dtype_args=("x",), configs=tuple({"BLOCK": b, "num_warps": 4, "num_stages": 3,
                                                             "num_ctas": 1} for b in (32, 64)),
                            source_hash="h1"))


def found(timed: tuple, winner: triton.Config = LISTED[0], source: str | None = "h1") -> Found:
    return Found({**winner.kwargs, "num_warps": winner.num_warps}, Match.EXACT, "store", source,
                 {canonical_key(c): 1.0 + i for i, c in enumerate(timed)})


def test_a_record_of_the_whole_list_on_this_code_serves_it() -> None:
    assert serves_list(found(LISTED), UND, LISTED)
    assert serves_list(found(LISTED, source=None), UND, LISTED)


def test_a_partly_measured_list_or_other_code_is_not_served() -> None:
    assert not serves_list(found(LISTED[:1]), UND, LISTED)
    assert not serves_list(found(LISTED, source="other"), UND, LISTED)
    extra = triton.Config({"BLOCK": 128}, num_warps=8)
    assert not serves_list(found((*LISTED, extra), winner=extra), UND, LISTED)
