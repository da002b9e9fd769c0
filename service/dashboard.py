"""The dashboard's pages: records per kernel and device, a page per case (its trials), a page
per job, live jobs with cancel (routers/dashboard.py serves them).

Rendered on the server with Jinja2 (autoescaping on, so a record or job holding markup shows as
text) and inline SVG charts that scale to the page; the only script is a vendored file that
polls /v1/jobs, writes with textContent and cancels jobs with the bearer token the user types
(kept in the tab's sessionStorage). Nothing is fetched from the network.
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from kernelsearch import kernels
from kernelsearch.db.interfaces import ServiceStore

from .charts import PALETTE, Series, make_chart, microseconds
from .lookups import run_read
from .settings import Settings
from kernelsearch.db.statuses import ACTIVE_STATUSES

from .views import case_work_or_none, current_versions, job_json, record_json

_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["us"] = lambda v: "" if v is None else microseconds(float(v))

CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
VERSION_FIELDS = (("torch", "torch"), ("triton", "triton"), ("source_hash", "kernel source"))


class PageError(Exception):
    """A dashboard page asked with arguments that name nothing (shown as a 4xx page)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _as_dict(v: Any) -> dict[str, Any]:
    return v.as_dict() if hasattr(v, "as_dict") else dict(v)


def _axes_label(axes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(axes.items()))


def case_url(kernel: str, device: str, axes: dict[str, Any], **extra: Any) -> str:
    """The case page of (kernel, device, axes); extra query arguments (job, failed) filter it."""
    q = {"kernel": kernel, "device": device, **axes, **{k: v for k, v in extra.items() if v}}
    return "/case?" + urlencode(q)


def _times(latency: float | None, factor: float | None) -> float | None:
    if latency is None or factor is None or not math.isfinite(factor) or factor <= 0:
        return None
    return latency * factor


def version_drift(record: dict[str, Any]) -> list[dict[str, str]]:
    """What the record was tuned under that differs from this server (torch, triton, the
    kernel's source); empty when the same, or when the server no longer has the kernel."""
    try:
        current = current_versions(record["kernel"])
    except KeyError:
        return []
    tuned = record.get("versions") or {}
    return [{"name": label, "tuned": str(tuned.get(key) or "?"), "server": str(current.get(key) or "?")}
            for key, label in VERSION_FIELDS if tuned.get(key) != current.get(key)]


def _decorate(r: dict[str, Any]) -> dict[str, Any]:
    lat = r.get("latency_us")
    r["work"] = case_work_or_none(r["kernel"], r["case"])
    r["eager_us"] = r.get("eager_latency_us") or _times(lat, r.get("speedup_eager"))
    r["compile_us"] = r.get("compile_latency_us") or _times(lat, r.get("speedup_compile"))
    pct = r.get("roofline_pct")
    r["roofline_us"] = lat * pct / 100 if lat is not None and pct else None
    r["case_label"] = _axes_label(r["case"])
    r["case_url"] = case_url(r["kernel"], r["device"], r["case"])
    r["drift"] = version_drift(r)
    return r


def _groups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records per (kernel, device), sorted by work, each with its chart."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_key[(r["kernel"], r["device"])].append(_decorate(r))
    out = []
    for (kernel, device), rows in sorted(by_key.items()):
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
            s.titles = [f"{s.name} {r['case_label']}: {microseconds(y)}" if y is not None else ""
                        for r, (_, y) in zip(rows, s.points)]
        step = max(1, len(rows) // 12)
        chart = make_chart(series, title=f"Latency per case: {kernel} on {device}",
                           y_label="latency", x_label="case (by work)", y_format=microseconds,
                           x_ticks=[(i, rows[i]["case_label"].split("=")[-1])
                                    for i in range(0, len(rows), step)])
        out.append({"kernel": kernel, "device": device, "rows": rows, "chart": chart,
                    "n_drift": sum(1 for r in rows if r["drift"])})
    return out


def _history_chart(trials: list[dict[str, Any]], title: str) -> Any:
    points, best_pts = [], []
    best = math.inf
    for i, t in enumerate(trials):
        lat = t.get("latency_median_us")
        ok = lat is not None and str(t.get("state", "")).lower() == "complete"
        points.append((i, lat if ok else None))
        if ok and lat is not None:
            best = min(best, float(lat))
        best_pts.append((i, best if math.isfinite(best) else None))
    titles = [f"trial {t.get('trial_number')}: " + (microseconds(t["latency_median_us"])
              if t.get("latency_median_us") is not None else str(t.get("failure_kind") or t.get("state")))
              for t in trials]
    failed = [(i, titles[i]) for i, (_, y) in enumerate(points) if y is None]
    return make_chart([Series("trial latency", points, PALETTE[0], line=False, titles=titles),
                       Series("best so far", best_pts, PALETTE[2], dots=False, step=True)],
                      title=title, y_label="latency", x_label="trial", y_format=microseconds,
                      x_marks=failed, x_marks_name="failed trial")


def _failed(t: dict[str, Any]) -> bool:
    return str(t.get("state", "")).lower() != "complete"


def _trial_rows(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for t in trials:
        t["failed"] = _failed(t)
        t["job_url"] = f"/jobs/{t['job_id']}" if t.get("job_id") is not None else None
    return trials


# ----------------------------------------------------------------------------- jobs


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _parse_time(v: Any) -> datetime | None:
    if not v:
        return None
    t = datetime.fromisoformat(str(v))
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def job_row(j: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A job as the jobs table shows it (dashboard.js computes the same from /v1/jobs)."""
    cases = j.get("cases") or []
    total = max(1, int(j.get("n_trials") or 0) * max(1, len(cases)))
    j["progress_pct"] = min(100.0, 100.0 * int(j.get("trials_done") or 0) / total)
    j["cases_label"] = "; ".join(_axes_label(c) for c in cases[:4]) + (
        f" (+{len(cases) - 4})" if len(cases) > 4 else "")
    start, end = _parse_time(j.get("started_at")), _parse_time(j.get("finished_at"))
    j["elapsed"] = _duration(((end or now) - start).total_seconds()) if start else ""
    cur = j.get("current_case") or {}
    j["current_label"] = _axes_label(cur["axes"]) if j.get("status") == "running" and cur.get("axes") else ""
    bests = [c.get("best_latency_us") for c in ((j.get("best") or {}).get("cases") or [])]
    bests.append(cur.get("best_latency_us"))
    found = [b for b in bests if isinstance(b, (int, float))]
    j["best_us"] = min(found) if found else None
    j["can_cancel"] = j.get("status") in ACTIVE_STATUSES
    j["url"] = f"/jobs/{j['id']}"
    return j


# ----------------------------------------------------------------------------- pages


def _case_args(query: Mapping[str, str]) -> tuple[str, str, dict[str, int], int | None, bool]:
    q = dict(query)
    kernel, device = q.pop("kernel", ""), q.pop("device", "")
    job, failed = q.pop("job", None), q.pop("failed", None)
    if not kernel or not device:
        raise PageError(422, "a case page needs kernel, device and the case's axes")
    if any(ord(ch) < 32 for ch in device):
        raise PageError(422, "device: control characters are not allowed")
    try:
        k = kernels.get_kernel(kernel)
    except KeyError:
        raise PageError(404, f"no kernel {kernel!r}") from None
    try:
        axes = k.validate_axes(q)
    except ValueError as exc:
        raise PageError(422, f"axes: {exc}") from None
    if job is not None and not (job.isascii() and job.isdigit()):
        raise PageError(422, f"job: expected a job id, got {job!r}")
    return k.name, device, axes, int(job) if job is not None else None, failed == "1"


def render_case(store: ServiceStore, settings: Settings, query: Mapping[str, str]) -> str:
    """The case page; `query` holds kernel, device, the case's axes, and the job/failed filters."""
    kernel, device, axes, job, failed_only = _case_args(query)
    label = _axes_label(axes)
    records = [_decorate(record_json(r)) for r in store.record_history(kernel, device, axes)]
    current = next((r for r in records if r.get("is_current")), None)
    trials = [_as_dict(t) for t in store.trial_summaries(kernel, device, axes)]
    trials.sort(key=lambda t: (str(t.get("study_name") or ""), t.get("trial_number") or 0))
    chart = _history_chart(trials, f"Optimisation history: {kernel} {label} on {device}")
    shown = [t for t in trials if (job is None or t.get("job_id") == job)
             and (not failed_only or _failed(t))]
    studies = sorted({str(t["study_name"]) for t in trials if t.get("study_name")}
                     | ({current["study_name"]} if current and current.get("study_name") else set()))
    sidecar = settings.optuna_dashboard_url.rstrip("/")
    return _env.get_template("case.html").render(
        kernel=kernel, device=device, axes=axes, label=label, record=current,
        records=records, chart=chart, trials=_trial_rows(shown), n_trials=len(trials),
        n_failed=sum(1 for t in trials if _failed(t)), job=job, failed_only=failed_only,
        all_url=case_url(kernel, device, axes) + "#trials",
        failed_url=case_url(kernel, device, axes, failed=1) + "#trials",
        studies=[{"name": s, "url": f"{sidecar}/ks/study?" + urlencode({"name": s})} for s in studies],
        sidecar=sidecar)


def render_job(store: ServiceStore, settings: Settings, job_id: int) -> str:
    job = store.get_job(job_id)
    if job is None:
        raise PageError(404, f"no job {job_id}")
    j = job_row(job_json(job), datetime.now(timezone.utc))
    trials = _trial_rows(store.job_trials(job_id))
    for t in trials:
        t["case_label"] = _axes_label(t["axes"])
        t["case_url"] = case_url(t["kernel"], t["device"], t["axes"], job=job_id) + "#trials"
    failed = [t for t in trials if t["failed"]]
    cases = [{"label": _axes_label(c),
              "url": case_url(j["kernel"], j["device"], c, job=job_id) + "#trials" if j.get("device") else None}
             for c in j.get("cases") or []]
    return _env.get_template("job.html").render(
        job=j, trials=trials, failed=failed, cases=cases, cancel=_cancel_enabled(settings))


def _cancel_enabled(settings: Settings) -> bool:
    # Cancelling from the page needs the service's token: without one, writes have no guard.
    return settings.api_token is not None


def render(store: ServiceStore, settings: Settings, embedded_worker: bool) -> str:
    groups = _groups([record_json(r) for r in store.list_records()])
    now = datetime.now(timezone.utc)
    jobs = [job_row(job_json(j), now) for j in store.list_jobs(limit=20)]
    return _env.get_template("dashboard.html").render(
        groups=groups, jobs=jobs, kernels=list(kernels.all_kernels().values()),
        cancel=_cancel_enabled(settings), embedded_worker=embedded_worker)


async def page(fn: Any, *args: Any) -> HTMLResponse:
    """fn(*args)'s HTML in a thread of the read pool (503 past KS_READ_TIMEOUT_S), with the CSP;
    a PageError is shown as its 4xx page."""
    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}
    try:
        html = await run_read(fn, *args)
    except PageError as exc:
        html = _env.get_template("error.html").render(status=exc.status, message=str(exc))
        return HTMLResponse(html, status_code=exc.status, headers=headers)
    return HTMLResponse(html, headers=headers)
