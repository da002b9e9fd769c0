"""A config's one canonical form: records, triton.Config and declarations agree on identity."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernelsearch
from kernelsearch.kernels.configs import (canonical, canonical_key, from_triton_config,
                                          to_triton_config)


def test_a_triton_config_and_its_record_share_one_form() -> None:
    tc = triton.Config({"BLOCK": 64}, num_warps=2)
    assert canonical(tc) == {"BLOCK": 64, "num_warps": 2, "num_stages": 3, "num_ctas": 1}
    assert from_triton_config(tc) == canonical(tc)
    # Written with Triton's defaults spelt out, or left out: the same config.
    assert canonical_key({"BLOCK": 64, "num_warps": 2, "num_stages": 3, "num_ctas": 1,
                          "maxnreg": None}) == canonical_key(tc)
    assert canonical_key({"BLOCK": 64, "num_warps": 2}) == canonical_key(tc)
    assert canonical_key({"BLOCK": 64, "num_warps": 2, "num_ctas": 2}) != canonical_key(tc)
    assert canonical(triton.Config({"B": 1}, num_ctas=2, maxnreg=128))["maxnreg"] == 128


def test_to_triton_config_returns_the_listed_config_with_its_hook() -> None:
    def hook(args):
        return None

    listed = [triton.Config({"BLOCK": 32}, num_warps=4, pre_hook=hook),
              triton.Config({"BLOCK": 64}, num_warps=2)]
    got = to_triton_config({"BLOCK": 32, "num_warps": 4, "num_stages": 3, "num_ctas": 1}, listed)
    assert got is listed[0]
    made = to_triton_config({"BLOCK": 128, "num_warps": 8})
    assert made.kwargs == {"BLOCK": 128} and (made.num_warps, made.num_stages) == (8, 3)


def _keep_all(configs, named_args, **kwargs):
    return list(configs)


@kernelsearch.autotune(
    configs=[triton.Config({"BLOCK": 32}, num_warps=1),
             triton.Config({"BLOCK": 64}, num_warps=1, num_ctas=2)],
    key=["n"], prune_configs_by={"early_config_prune": _keep_all})
@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


def _copy(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _copy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


def _inputs(axes, *, seed, distribution="benchmark", device="cpu"):
    return (torch.randn(int(axes["n"]), generator=torch.Generator().manual_seed(seed)).to(device),)


def test_a_declared_space_keeps_a_config_at_triton_defaults_after_pruning() -> None:
    """declare() writes num_ctas=1 into the config that leaves it at Triton's default (every
    config then names the same options); pruning must still find that config in the space."""
    kdef = _copy_kernel.declare(
        name="ks_test_configs_copy", launch=_copy, make_inputs=_inputs, axes=("n",),
        input_names=("x",), output_names=("out",), bytes_moved=lambda a: 8 * int(a["n"]),
        rtol=0.0, register=False)
    assert {c.get("num_ctas") for c in kdef.space_configs} == {1, 2}
    assert sorted(c["BLOCK"] for c in kdef.configs_for_case({"n": 100})) == [32, 64]
