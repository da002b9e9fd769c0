"""The dashboard's HTML routes (the pages are rendered by service/dashboard.py)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from ..dashboard import page, render, render_case, render_helion, render_job, render_jobs, render_kernel
from ..deps import EmbeddedWorkerDep, SettingsDep, StoreDep
from .common import JOB_ID

router = APIRouter(tags=["dashboard"])


@router.get("/", response_class=HTMLResponse, include_in_schema=True)
async def dashboard(request: Request, store: StoreDep, settings: SettingsDep,
                    embedded_worker: EmbeddedWorkerDep) -> HTMLResponse:
    """The dashboard (HTML): records per kernel and device (`kernel=` keeps one kernel's), the
    kernels, and the newest jobs."""
    return await page(render, store, settings, embedded_worker, request.query_params)


@router.get("/kernels/{kernel:path}", response_class=HTMLResponse)
async def kernel_page(kernel: str, request: Request, store: StoreDep,
                      settings: SettingsDep) -> HTMLResponse:
    """One kernel: axes, parameters, devices, each case's best record per device, a latency
    chart per device and a tune action; the kernel's axes as query arguments preselect a case."""
    return await page(render_kernel, store, settings, kernel, request.query_params,
                      str(request.base_url))


@router.get("/case", response_class=HTMLResponse)
async def case_page(request: Request, store: StoreDep, settings: SettingsDep) -> HTMLResponse:
    """One case (kernel, device and the case's axes as query arguments): its record, versions,
    optimisation history and every trial; `job=N` and `failed=1` filter the trial table."""
    return await page(render_case, store, settings, request.query_params)


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(request: Request, store: StoreDep, settings: SettingsDep) -> HTMLResponse:
    """Every job, newest first; `status=`, `kernel=` filter it, `page=` pages through it."""
    return await page(render_jobs, store, settings, request.query_params)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(store: StoreDep, settings: SettingsDep, job_id: int = JOB_ID) -> HTMLResponse:
    """One job: its progress and the trials it ran, the failed ones first."""
    return await page(render_job, store, settings, job_id)


@router.get("/helion", response_class=HTMLResponse)
async def helion_page(request: Request, store: StoreDep, settings: SettingsDep) -> HTMLResponse:
    """Helion's autotune cache entries stored by kernelsearch.helion, newest first (`kernel=`
    keeps one kernel's): kernel, case, hardware, config, the check it passed."""
    return await page(render_helion, store, settings, request.query_params)
