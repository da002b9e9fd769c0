"""kernelsearch's declaration of the tutorial matmul: what a worker needs to tune it on its own.

The registry finds `KERNEL` through this package's entry point (group `kernelsearch.kernels`), in
the API, the worker, its trial child and the compile pool alike.
"""
from typing import Mapping

import torch

from .kernel import matmul, matmul_kernel

SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
          (3072, 3072, 3072), (4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192)]


def make_inputs(axes: Mapping[str, int], *, seed: int, distribution: str = "benchmark",
                device: "torch.device | str | None" = None) -> tuple:
    """A and B, fp16: standard normal entries ("benchmark"), or uniform in [-1, 1) scaled by
    1/sqrt(K) so that C's entries are of order one ("realistic")."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    M, N, K = int(axes["M"]), int(axes["N"]), int(axes["K"])
    # Drawn where they are used: 8192^2 normals take a second on the CPU, microseconds on a GPU.
    gen = torch.Generator(device=device).manual_seed(seed)
    if distribution == "benchmark":
        a = torch.randn(M, K, generator=gen, device=device)
        b = torch.randn(K, N, generator=gen, device=device)
    elif distribution == "realistic":
        a = (torch.rand(M, K, generator=gen, device=device) * 2 - 1) / K ** 0.5
        b = torch.rand(K, N, generator=gen, device=device) * 2 - 1
    else:
        raise ValueError(f"distribution: expected 'benchmark' or 'realistic', got {distribution!r}")
    return a.half(), b.half()


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """C in float64 from the same fp16 inputs."""
    return torch.matmul(a.double(), b.double())


def torch_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What a user would call instead: torch.matmul in fp16."""
    return torch.matmul(a, b)


def axes_of(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"M": int(a.shape[0]), "N": int(b.shape[1]), "K": int(a.shape[1])}


def bytes_moved(axes: Mapping[str, int]) -> int:
    M, N, K = int(axes["M"]), int(axes["N"]), int(axes["K"])
    return 2 * (M * K + K * N + M * N)


def flops(axes: Mapping[str, int]) -> int:
    return 2 * int(axes["M"]) * int(axes["N"]) * int(axes["K"])


def check_inputs(a: torch.Tensor, b: torch.Tensor) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float16 or t.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D float16 tensor")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"b: expected {a.shape[1]} rows (a's columns), got {b.shape[0]}")


KERNEL = matmul_kernel.declare(
    name="triton_tutorial_matmul",
    description="Triton tutorial 03: C = A x B, fp16 in and out, fp32 accumulation",
    benchmark_problem="triton tutorials/03-matrix-multiplication",
    axes=("M", "N", "K"),
    dtypes={"a_ptr": torch.float16, "b_ptr": torch.float16},
    launch=matmul,
    make_inputs=make_inputs,
    input_names=("a", "b"),
    output_names=("c",),
    reference=reference,
    torch_reference=torch_reference,
    axes_of=axes_of,
    check_inputs=check_inputs,
    # An fp16 output carries a relative rounding error of 2^-11 per element: the norm of the
    # difference to float64 stays near 3e-4; 2e-3 leaves room for fp32 accumulation order.
    rtol=2e-3,
    output_dtypes=lambda axes: (torch.float16,),
    bytes_moved=bytes_moved,
    flops=flops,
    cases=SHAPES,
)
