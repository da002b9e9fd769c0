"""/v1/kernels: the kernels this service knows, their axes and their tuned cases."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from kernelsearch import kernels

from .. import schemas
from .common import ERRORS, kernel_or_404

router = APIRouter(tags=["kernels"])


@router.get("/v1/kernels", response_model=list[schemas.KernelOut])
def list_kernels() -> Any:
    return [_describe(k) for k in kernels.all_kernels().values()]


@router.get("/v1/kernels/{kernel}", response_model=schemas.KernelOut, responses=ERRORS)
def get_kernel(kernel: str) -> Any:
    return _describe(kernel_or_404(kernel))


@router.get("/v1/kernels/{kernel}/cases", response_model=list[schemas.CaseOut], responses=ERRORS)
def kernel_cases(kernel: str) -> Any:
    k = kernel_or_404(kernel)
    return [{"number": c.number, "axes": c.axes, "bytes_moved": int(k.bytes_moved(c.axes)),
             "info": c.info} for c in k.cases]


def _describe(k: kernels.KernelDef) -> dict[str, Any]:
    return {**k.describe(), "extra_axes": list(k.extra_axes)}
