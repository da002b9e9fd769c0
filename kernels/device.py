"""Which device a kernel runs on, named the way records are keyed."""
from __future__ import annotations

import os
import platform
from typing import Any

import torch

INTERPRETER_DEVICE = "cpu (triton interpreter)"


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def default_device() -> torch.device:
    """CUDA when a GPU is visible and we are not interpreting, else the CPU (interpreter)."""
    if torch.cuda.is_available() and not is_interpreter():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_name(device: torch.device | None = None) -> str:
    """`torch.cuda.get_device_name()` on a GPU; a label that says so under the interpreter."""
    device = device or default_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return INTERPRETER_DEVICE


def device_info(device: torch.device | None = None) -> dict[str, Any]:
    """What a record stores about the device it was measured on."""
    device = device or default_device()
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {
            "name": p.name,
            "compute_capability": f"{p.major}.{p.minor}",
            "memory_bytes": int(p.total_memory),
            "multiprocessors": int(p.multi_processor_count),
            "l2_bytes": int(getattr(p, "L2_cache_size", 0)),
            "cuda_version": torch.version.cuda,
            "driver_version": _driver_version(),
            "interpreter": False,
        }
    return {
        "name": INTERPRETER_DEVICE,
        "compute_capability": None,
        "memory_bytes": None,
        "multiprocessors": num_programs_hint(device),
        "l2_bytes": None,
        "cuda_version": None,
        "driver_version": None,
        "cpu": platform.processor() or platform.machine(),
        "interpreter": True,
    }


def num_programs_hint(device: torch.device) -> int:
    """Multiprocessor count for persistent grids; a small number under the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _driver_version() -> str | None:
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    except OSError:
        pass
    return None


def versions() -> dict[str, str]:
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__}


# Dense fp16/bf16 tensor-core peaks (FLOP/s) from the vendors' datasheets: the compute roofline of
# kernels that declare `flops`. A device not listed has no compute roofline (memory only).
TENSOR_PEAK_FLOPS = {
    "NVIDIA H200": 989.4e12,
    "NVIDIA H100 80GB HBM3": 989.4e12,
    "NVIDIA H100": 989.4e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA B200": 2250e12,
}


def peak_flops(name: str) -> float | None:
    return TENSOR_PEAK_FLOPS.get(name)
