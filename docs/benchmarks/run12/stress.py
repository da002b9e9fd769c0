"""Run 12's race check of REDUCE=fixed on the GPU: many back-to-back calls must give the same
bits, and match float64, on the largest and smallest suite cases."""
import torch

from kernels import get_kernel

A = get_kernel("vision_rope_generation_bwd")
for P, cfg in ((12288, {"REDUCE": "fixed", "BLOCK_P": 8, "TILES": 1, "num_warps": 1}),
               (12288, {"REDUCE": "fixed", "BLOCK_P": 32, "TILES": 1, "num_warps": 4}),
               (131, {"REDUCE": "fixed", "BLOCK_P": 8, "TILES": 1, "num_warps": 2})):
    x = A.make_inputs({"total_patches": P}, seed=P, device="cuda")
    ref = A.reference(*x)[0]
    outs = torch.stack([A(*x, config=cfg) for _ in range(500)])
    same = bool((outs == outs[0]).all())
    err = float((outs[0].double() - ref).norm() / ref.norm())
    print(f"stress P={P} {cfg}: 500 calls identical={same} rel_err={err:.2e}")
