"""GET /: tuned records per kernel and device, latency charts, a case's optimisation history, jobs.

Rendered on the server with Jinja2 (autoescaping on, so a record or job holding markup shows as
text) and inline SVG charts; the only script is a vendored file that polls /v1/jobs for live
progress and writes with textContent. Nothing is fetched from the network.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from kernelsearch import kernels

from .charts import PALETTE, Series, make_chart

router = APIRouter()

_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _as_dict(v: Any) -> dict[str, Any]:
    return v.as_dict() if hasattr(v, "as_dict") else dict(v)


def _axes_label(axes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(axes.items()))


def _work(kernel: str, axes: dict[str, int]) -> int | None:
    try:
        return int(kernels.get_kernel(kernel).bytes_moved(axes))
    except Exception:  # a record of a kernel this code no longer has
        return None


def _times(latency: float | None, factor: float | None) -> float | None:
    if latency is None or factor is None or not math.isfinite(factor) or factor <= 0:
        return None
    return latency * factor


def _groups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records per (kernel, device), sorted by work, each with its chart."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_key[(r["kernel"], r["device"])].append(r)
    out = []
    for (kernel, device), rows in sorted(by_key.items()):
        for r in rows:
            r["work"] = _work(kernel, r["case"])
            lat = r.get("latency_us")
            r["eager_us"] = _times(lat, r.get("speedup_eager"))
            r["compile_us"] = _times(lat, r.get("speedup_compile"))
            pct = r.get("roofline_pct")
            r["roofline_us"] = lat * pct / 100 if lat is not None and pct else None
            r["case_label"] = _axes_label(r["case"])
            r["history_url"] = "/?" + urlencode({"kernel": kernel, "device": device,
                                                 **r["case"]}) + "#history"
        rows.sort(key=lambda r: (r["work"] is None, r["work"] or 0, r["case_label"]))
        idx = list(range(len(rows)))
        series = [
            Series("tuned", [(i, r.get("latency_us")) for i, r in zip(idx, rows)], PALETTE[0]),
            Series("eager reference", [(i, r["eager_us"]) for i, r in zip(idx, rows)], PALETTE[1],
                   dashed=True),
            Series("torch.compile", [(i, r["compile_us"]) for i, r in zip(idx, rows)], PALETTE[3],
                   dashed=True),
            Series("roofline", [(i, r["roofline_us"]) for i, r in zip(idx, rows)], PALETTE[2],
                   dashed=True),
        ]
        for s in series:
            s.titles = [f"{s.name} {r['case_label']}: {y:.4g} us" if y is not None else ""
                        for r, (_, y) in zip(rows, s.points)]
        step = max(1, len(rows) // 8)
        chart = make_chart(series, title=f"Latency per case: {kernel} on {device}",
                           y_label="latency (us)", x_label="case (by work)",
                           x_ticks=[(i, rows[i]["case_label"].split("=")[-1])
                                    for i in range(0, len(rows), step)])
        out.append({"kernel": kernel, "device": device, "rows": rows, "chart": chart})
    return out


def _history(store: Any, kernel: str, device: str, axes: dict[str, int]) -> dict[str, Any]:
    trials = [_as_dict(t) for t in store.trial_summaries(kernel, device, axes)]
    trials.sort(key=lambda t: (str(t.get("study_name") or ""), t.get("trial_number") or 0))
    points, best_pts, failed = [], [], []
    best = math.inf
    for i, t in enumerate(trials):
        lat = t.get("latency_median_us")
        ok = lat is not None and t.get("state", "").lower() == "complete"
        points.append((i, lat if ok else None))
        if ok:
            best = min(best, lat)
        best_pts.append((i, best if math.isfinite(best) else None))
        if not ok:
            failed.append(t)
    titles = [f"trial {t.get('trial_number')}: " + (f"{t['latency_median_us']:.4g} us"
              if t.get("latency_median_us") is not None else str(t.get("failure_kind") or t.get("state")))
              for t in trials]
    chart = make_chart([Series("trial latency", points, PALETTE[0], line=False, titles=titles),
                        Series("best so far", best_pts, PALETTE[1], dots=False)],
                       title=f"Optimisation history: {kernel} {_axes_label(axes)} on {device}",
                       y_label="latency (us)", x_label="trial")
    return {"kernel": kernel, "device": device, "axes": axes, "label": _axes_label(axes),
            "chart": chart, "n_trials": len(trials), "n_failed": len(failed),
            "failures": failed[-10:],
            "records": [_as_dict(r) for r in store.record_history(kernel, device, axes)]}


def _selected(request: Request, groups: list[dict[str, Any]]) -> tuple[str, str, dict] | None:
    """The case whose history is shown: from the query, else the first record."""
    q = dict(request.query_params)
    kernel, device = q.pop("kernel", None), q.pop("device", None)
    if kernel and device:
        try:
            return kernel, device, kernels.get_kernel(kernel).validate_axes(q)
        except (KeyError, ValueError):
            return None
    if groups and groups[0]["rows"]:
        g = groups[0]
        return g["kernel"], g["device"], dict(g["rows"][0]["case"])
    return None


def render(request: Request) -> str:
    from .api import job_json, record_json

    store = request.app.state.store
    records = [record_json(r) for r in store.list_records()]
    groups = _groups(records)
    sel = _selected(request, groups)
    history = _history(store, *sel) if sel else None
    jobs = [job_json(j) for j in store.list_jobs(limit=20)]
    for j in jobs:
        total = max(1, int(j.get("n_trials") or 0) * max(1, len(j.get("cases") or [])))
        j["progress_pct"] = min(100.0, 100.0 * int(j.get("trials_done") or 0) / total)
        j["cases_label"] = "; ".join(_axes_label(c) for c in (j.get("cases") or [])[:4]) + (
            f" (+{len(j['cases']) - 4})" if len(j.get("cases") or []) > 4 else "")
    return _env.get_template("dashboard.html").render(
        groups=groups, history=history, jobs=jobs, kernels=list(kernels.all_kernels().values()),
        embedded_worker=bool(getattr(request.app.state, "embedded_worker", False)))


@router.get("/", response_class=HTMLResponse, include_in_schema=True, tags=["dashboard"])
async def dashboard(request: Request) -> HTMLResponse:
    """The dashboard (HTML)."""
    html = await run_in_threadpool(render, request)
    return HTMLResponse(html, headers={
        "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                   "style-src 'self'; script-src 'self'; object-src 'none'; "
                                   "base-uri 'none'; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
    })
