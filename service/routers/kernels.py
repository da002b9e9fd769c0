"""/v1/kernels: the kernels this service knows, their axes and their tuned cases."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from kernelsearch import kernels

from .. import schemas
from ..definitions import known_or_reloaded
from ..deps import StoreDep
from .common import ERRORS, kernel_or_404

router = APIRouter(tags=["kernels"])


@router.get("/v1/kernels", response_model=list[schemas.KernelOut])
def list_kernels(store: StoreDep) -> Any:
    """Every kernel: the declared ones and the undeclared ones any process registered."""
    known_or_reloaded(store, "")
    return [_describe(k) for k in kernels.all_kernels().values()]


@router.get("/v1/kernels/{kernel}", response_model=schemas.KernelOut, responses=ERRORS)
def get_kernel(kernel: str, store: StoreDep) -> Any:
    return _describe(kernel_or_404(kernel, store))


@router.get("/v1/kernels/{kernel}/cases", response_model=list[schemas.CaseOut], responses=ERRORS)
def kernel_cases(kernel: str, store: StoreDep) -> Any:
    k = kernel_or_404(kernel, store)
    return [{"number": c.number, "axes": c.axes, "bytes_moved": int(k.bytes_moved(c.axes)),
             "info": c.info} for c in k.cases]


def _describe(k: kernels.KernelDef) -> dict[str, Any]:
    return {**k.describe(), "extra_axes": list(k.extra_axes)}
