"""The dashboard's pages: records per kernel and device, a page per kernel (its cases per device
and a tune action), a page per case (its trials), the jobs (filtered, paginated) and a page per
job, live jobs with cancel (routers/dashboard.py serves them).

Rendered on the server with Jinja2 (autoescaping on, so a record or job holding markup shows as
text) and inline SVG charts that scale to the page; the only script is a vendored file that
polls /v1/jobs, writes with textContent and cancels jobs with the bearer token the user types
(kept in the tab's sessionStorage). Nothing is fetched from the network.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from kernelsearch import kernels
from kernelsearch.db.interfaces import ServiceStore

from kernelsearch.db.statuses import ACTIVE_STATUSES, JOB_STATUSES, JobStatus, TrialStatus
from kernelsearch.db.views import WORKER_VERSIONS
from kernelsearch.kernels.configs import canonical_key
from kernelsearch.kernels.undeclared import MAX_NAME_CHARS, UndeclaredKernel

from .charts import PALETTE, Series, make_chart, microseconds
from .lookups import run_read
from .settings import Settings
from .views import case_work, current_versions, job_json, record_json

_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["us"] = lambda v: "" if v is None else microseconds(float(v))
_env.filters["segment"] = lambda v: quote(str(v), safe="")

JOBS_PER_PAGE = 50
# The newest jobs the index page shows (all of them are on /jobs).
RECENT_JOBS = 5

CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
# What a record's versions are compared with: torch and triton with what the device's workers
# reported, the kernel's source with this server's code (which its workers run).
WORKER_FIELDS = (("torch", "torch"), ("triton", "triton"))


class PageError(Exception):
    """A dashboard page asked with arguments that name nothing (shown as a 4xx page)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _as_dict(v: Any) -> dict[str, Any]:
    return v.as_dict() if hasattr(v, "as_dict") else dict(v)


def _axes_label(axes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(axes.items()))


def _kernel_or_none(name: str | None) -> kernels.KernelDef | None:
    try:
        return kernels.get_kernel(name) if name else None
    except KeyError:
        return None


def case_url(kernel: str, device: str, axes: dict[str, Any], **extra: Any) -> str:
    """The case page of (kernel, device, axes); extra query arguments (job, failed) filter it."""
    q = {"kernel": kernel, "device": device, **axes, **{k: v for k, v in extra.items() if v}}
    return "/case?" + urlencode(q)


def kernel_url(kernel: str, **query: Any) -> str:
    """The kernel's page; query arguments (a case's axes) preselect the case to tune."""
    return f"/kernels/{quote(kernel, safe='')}" + ("?" + urlencode(query) if query else "")


def _times(latency: float | None, factor: float | None) -> float | None:
    if latency is None or factor is None or not math.isfinite(factor) or factor <= 0:
        return None
    return latency * factor


def reported_versions(store: ServiceStore) -> dict[str, dict[str, Any]]:
    """The torch and triton versions each device's workers last reported (by device name);
    a device no worker has tuned on here is absent."""
    out = {}
    for d in store.list_devices():
        got = (d.get("info") or {}).get(WORKER_VERSIONS)
        if isinstance(got, dict):
            out[str(d["name"])] = got
    return out


def version_drift(record: dict[str, Any], reported: Mapping[str, Mapping[str, Any]]
                  ) -> list[dict[str, str]]:
    """What the record was tuned under that differs from what runs now: torch and triton
    against the versions the record's device's workers reported (nothing when none has), the
    kernel's source against this server's; empty when the server no longer has the kernel."""
    tuned = record.get("versions") or {}
    out = []
    workers = reported.get(record.get("device") or "")
    for key, label in WORKER_FIELDS if workers else ():
        now = workers.get(key) if workers else None
        if now and tuned.get(key) != now:
            out.append({"name": label, "tuned": str(tuned.get(key) or "?"), "now": str(now),
                        "where": "the device's workers"})
    try:
        source = current_versions(record["kernel"])["source_hash"]
    except KeyError:
        return out
    if tuned.get("source_hash") != source:
        out.append({"name": "kernel source", "tuned": str(tuned.get("source_hash") or "?"),
                    "now": str(source or "?"), "where": "this server"})
    return out


def has_torch_reference(kernel: str | None) -> bool:
    """Whether a record's eager and torch.compile times are of a PyTorch path the kernel
    declares: without one they timed the float64 reference (or nothing), so no speedup is shown.
    A kernel this server does not have is taken at its record's word."""
    k = _kernel_or_none(kernel)
    return k is None or k.torch_reference is not None


def gain_label(r: Mapping[str, Any]) -> str:
    """A record's winner against the kernel's config list: a searched winner's gain
    over the list's best, or the list's own (after a search that found no confident gain)."""
    gain = r.get("gain_vs_list")
    if r.get("winner_origin") == "search" and gain is not None:
        return f"{gain:.2f}× (searched)"
    return "list (searched: no gain)" if gain is not None else "list"


def _decorate(r: dict[str, Any], reported: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    lat = r.get("latency_us")
    r["gain_label"] = gain_label(r)
    r["work"] = case_work(r["kernel"], r["case"])
    r["has_reference"] = has_torch_reference(r["kernel"])
    if r["has_reference"]:
        r["eager_us"] = r.get("eager_latency_us") or _times(lat, r.get("speedup_eager"))
        r["compile_us"] = r.get("compile_latency_us") or _times(lat, r.get("speedup_compile"))
    else:
        r["eager_us"] = r["compile_us"] = r["speedup_eager"] = r["speedup_compile"] = None
    pct = r.get("roofline_pct")
    r["roofline_us"] = lat * pct / 100 if lat is not None and pct else None
    r["case_label"] = _axes_label(r["case"])
    r["case_url"] = case_url(r["kernel"], r["device"], r["case"])
    r["drift"] = version_drift(r, reported)
    return r


def _tick_label(axes: dict[str, Any]) -> str:
    """A case on a chart's x axis: the values of all its axes (the axis names are in the
    axis title)."""
    return ",".join(str(v) for _, v in sorted(axes.items()))


def _groups(records: list[dict[str, Any]], reported: Mapping[str, Mapping[str, Any]]
            ) -> list[dict[str, Any]]:
    """Records per (kernel, device), sorted by work, each with its chart."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_key[(r["kernel"], r["device"])].append(_decorate(r, reported))
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
        names = sorted({k for r in rows for k in r["case"]})
        chart = make_chart(series, title=f"Latency per case: {kernel} on {device}",
                           y_label="latency", x_label=f"case ({', '.join(names)}), by work",
                           y_format=microseconds,
                           x_ticks=[(i, _tick_label(rows[i]["case"]))
                                    for i in range(0, len(rows), step)])
        out.append({"kernel": kernel, "device": device, "rows": rows, "chart": chart,
                    "kernel_url": kernel_url(kernel) if _kernel_or_none(kernel) else None,
                    "n_drift": sum(1 for r in rows if r["drift"]),
                    # An undeclared kernel declares no bytes: its size is its key's product.
                    "undeclared": isinstance(_kernel_or_none(kernel), UndeclaredKernel),
                    "has_reference": all(r["has_reference"] for r in rows)})
    return out


def _history_chart(trials: list[dict[str, Any]], title: str) -> Any:
    points, best_pts = [], []
    best = math.inf
    for t in trials:
        i = t["n"]
        lat = t.get("latency_median_us")
        ok = lat is not None and not t["failed"]
        points.append((i, lat if ok else None))
        if ok and lat is not None:
            best = min(best, float(lat))
        best_pts.append((i, best if math.isfinite(best) else None))
    titles = [f"trial {t['n']}: " + (microseconds(t["latency_median_us"])
              if t.get("latency_median_us") is not None else str(t.get("failure_kind") or t.get("state")))
              for t in trials]
    failed = [(i, titles[k]) for k, (i, y) in enumerate(points) if y is None]
    return make_chart([Series("trial latency", points, PALETTE[0], line=False, titles=titles),
                       Series("best so far", best_pts, PALETTE[2], dots=False, step=True)],
                      title=title, y_label="latency", x_label="trial", y_format=microseconds,
                      x_marks=failed, x_marks_name="failed trial")


def _failed(t: dict[str, Any]) -> bool:
    return str(t.get("state", "")).lower() != TrialStatus.COMPLETE


def _trial_rows(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for t in trials:
        t["failed"] = _failed(t)
        t["job_url"] = f"/jobs/{t['job_id']}" if t.get("job_id") is not None else None
    return trials


def _number_trials(trials: list[dict[str, Any]]) -> dict[str, int]:
    """One numbering for a case's chart and its table: 0.. over the case's trials in study
    then Optuna-number order (a case may have several studies, and Optuna's own numbers have
    gaps where another case's trials were stored); marks the fastest complete trial as best.
    Returns each study's index (1..) by name."""
    studies: dict[str, int] = {}
    best: dict[str, Any] | None = None
    for i, t in enumerate(_trial_rows(trials)):
        t["n"] = i
        t["best"] = False
        name = str(t.get("study_name") or "")
        t["study_index"] = studies.setdefault(name, len(studies) + 1)
        lat = t.get("latency_median_us")
        if not t["failed"] and lat is not None and (best is None or lat < best["latency_median_us"]):
            best = t
    if best is not None:
        best["best"] = True
    return studies


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
    j["current_label"] = _axes_label(cur["axes"]) if j.get("status") == JobStatus.RUNNING and cur.get("axes") else ""
    bests = [c.get("best_latency_us") for c in ((j.get("best") or {}).get("cases") or [])]
    bests.append(cur.get("best_latency_us"))
    found = [b for b in bests if isinstance(b, (int, float))]
    j["best_us"] = min(found) if found else None
    j["can_cancel"] = j.get("status") in ACTIVE_STATUSES
    j["url"] = f"/jobs/{j['id']}"
    name = str(j.get("kernel") or "")
    # A Helion job's kernel has entries, not records: its link is its /helion page.
    j["kernel_url"] = (f"/helion?{urlencode({'kernel': name})}" if name.startswith("helion:")
                       else kernel_url(name))
    return j


# ----------------------------------------------------------------------------- pages


def _case_args(store: ServiceStore, query: Mapping[str, str]
               ) -> tuple[str, str, dict[str, int], int | None, bool]:
    q = dict(query)
    kernel, device = q.pop("kernel", ""), q.pop("device", "")
    job, failed = q.pop("job", None), q.pop("failed", None)
    if not kernel or not device:
        raise PageError(422, "a case page needs kernel, device and the case's axes")
    if any(ord(ch) < 32 for ch in device):
        raise PageError(422, "device: control characters are not allowed")
    k = _get_kernel(kernel, store)
    try:
        axes = k.validate_axes(q)
    except ValueError as exc:
        raise PageError(422, f"axes: {exc}") from None
    if job is not None and not (job.isascii() and job.isdigit()):
        raise PageError(422, f"job: expected a job id, got {job!r}")
    return k.name, device, axes, int(job) if job is not None else None, failed == "1"


def _get_kernel(name: str, store: ServiceStore) -> kernels.KernelDef:
    """The page's kernel, one of the store's undeclared kernels included (another process may
    have registered it); PageError 404 otherwise."""
    from .definitions import known_or_reloaded

    known_or_reloaded(store, name)
    k = _kernel_or_none(name)
    if k is None:
        raise PageError(404, f"no kernel {name!r}")
    return k


def _study_links(store: ServiceStore, settings: Settings, names: list[str]) -> list[dict[str, Any]]:
    """Each study by name, with a link to optuna-dashboard only where the study is in this
    database's Optuna storage (an imported record names a study of another database)."""
    sidecar = settings.optuna_dashboard_url.rstrip("/")
    here = store.optuna_studies(names)
    return [{"name": s, "url": f"{sidecar}/ks/study?" + urlencode({"name": s}) if s in here else None}
            for s in names]


def render_case(store: ServiceStore, settings: Settings, query: Mapping[str, str]) -> str:
    """The case page; `query` holds kernel, device, the case's axes, and the job/failed filters."""
    kernel, device, axes, job, failed_only = _case_args(store, query)
    label = _axes_label(axes)
    reported = reported_versions(store)
    records = [_decorate(record_json(r), reported) for r in store.record_history(kernel, device, axes)]
    current = next((r for r in records if r.get("is_current")), None)
    trials = [_as_dict(t) for t in store.trial_summaries(kernel, device, axes)]
    trials.sort(key=lambda t: (str(t.get("study_name") or ""), t.get("trial_number") or 0))
    study_index = _number_trials(trials)
    chart = _history_chart(trials, f"Optimisation history: {kernel} {label} on {device}")
    shown = [t for t in trials if (job is None or t.get("job_id") == job)
             and (not failed_only or t["failed"])]
    names = sorted(set(study_index) - {""}
                   | ({current["study_name"]} if current and current.get("study_name") else set()))
    studies = _study_links(store, settings, names)
    for s in studies:
        s["index"] = study_index.get(s["name"])
    return _env.get_template("case.html").render(
        kernel=kernel, kernel_url=kernel_url(kernel), device=device, axes=axes, label=label,
        record=current, records=records, chart=chart, trials=shown, n_trials=len(trials),
        n_failed=sum(1 for t in trials if t["failed"]), job=job, failed_only=failed_only,
        all_url=case_url(kernel, device, axes) + "#trials",
        failed_url=case_url(kernel, device, axes, failed=1) + "#trials",
        tune_url=kernel_url(kernel, **axes) + "#tune",
        studies=studies, several_studies=len(study_index) > 1,
        sidecar=settings.optuna_dashboard_url.rstrip("/"))


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
    has_cases = j.get("device") and not str(j["kernel"]).startswith("helion:")  # Helion's: entries
    cases = [{"label": _axes_label(c),
              "url": case_url(j["kernel"], j["device"], c, job=job_id) + "#trials" if has_cases else None}
             for c in j.get("cases") or []]
    return _env.get_template("job.html").render(
        job=j, trials=trials, failed=failed, cases=cases, cancel=_cancel_enabled(settings))


def _cancel_enabled(settings: Settings) -> bool:
    # Writing from the page (cancel, tune) needs the service's token: without one, writes have
    # no guard.
    return settings.api_token is not None


def _one(query: Mapping[str, str], name: str) -> str | None:
    v = query.get(name)
    if v is not None and any(ord(ch) < 32 for ch in v):
        raise PageError(422, f"{name}: control characters are not allowed")
    return v or None


def render(store: ServiceStore, settings: Settings, embedded_worker: bool,
           query: Mapping[str, str] | None = None) -> str:
    """The index: records per kernel and device (`kernel=` keeps one kernel's), the kernels,
    and a short summary of the jobs (all of them are on /jobs)."""
    kernel = _one(query or {}, "kernel")
    records = [record_json(r) for r in store.list_records(kernel=kernel)]
    if kernel is not None:
        from .definitions import known_or_reloaded

        known_or_reloaded(store, kernel)
    if kernel is not None and not records and _kernel_or_none(kernel) is None:
        raise PageError(404, f"no kernel {kernel!r}")
    groups = _groups(records, reported_versions(store))
    now = datetime.now(timezone.utc)
    jobs = [job_row(job_json(j), now) for j in store.list_jobs(limit=RECENT_JOBS)]
    counts = [(s, store.count_jobs(s)) for s in JOB_STATUSES]
    n_records: dict[str, int] = defaultdict(int)
    for r in store.list_records():
        n_records[r.kernel] += 1
    known = [{"name": k.name, "url": kernel_url(k.name), "n_cases": len(k.cases),
              "n_records": n_records.get(k.name, 0), "description": k.description}
             for k in kernels.all_kernels().values()]
    return _env.get_template("dashboard.html").render(
        groups=groups, jobs=jobs, counts=[c for c in counts if c[1]], n_jobs=sum(n for _, n in counts),
        recent=RECENT_JOBS, kernel=kernel, kernels=known, cancel=_cancel_enabled(settings),
        embedded_worker=embedded_worker)


def _samplers() -> tuple[str, ...]:
    try:
        from kernelsearch.search_space.tuner import SAMPLERS
    except ImportError:
        return ("tpe",)
    return tuple(SAMPLERS)


def _tune_commands(base_url: str, kernel: str, axes: dict[str, Any] | None, n_trials: int,
                   token: bool, undeclared: bool = False) -> tuple[str, str]:
    """The curl line that queues the job the form would, and the CLI line that tunes here (an
    undeclared kernel's, every key with a stored call unless one is chosen)."""
    body = json.dumps({"kernel": kernel, "cases": [axes] if axes else "all", "n_trials": n_trials,
                       "sampler": "tpe"})
    auth = ' -H "Authorization: Bearer $KS_API_TOKEN"' if token else ""
    curl = (f"curl -X POST {base_url.rstrip('/')}/v1/jobs -H 'Content-Type: application/json'"
            f"{auth} -d '{body}'")
    which = f" --case {','.join(f'{k}={v}' for k, v in axes.items())}" if axes else \
        ("" if undeclared else " --all")
    return curl, f"kernelsearch tune {kernel}{which} --trials {n_trials}"


def render_kernel(store: ServiceStore, settings: Settings, name: str, query: Mapping[str, str],
                  base_url: str) -> str:
    """One kernel: its axes and parameters, the devices with its records, each case's best
    record per device, a latency chart per device, and the tune action (query arguments that
    are the kernel's axes preselect the case to tune)."""
    k = _get_kernel(name, store)
    chosen = None
    if query:
        try:
            chosen = k.validate_axes(dict(query))
        except ValueError as exc:
            raise PageError(422, f"axes: {exc}") from None
    reported = reported_versions(store)
    groups = _groups([record_json(r) for r in store.list_records(kernel=k.name)], reported)
    devices = [g["device"] for g in groups]
    info = {d["name"]: d for d in store.list_devices()}
    device_rows = [{"name": g["device"], "n_records": len(g["rows"]), "n_drift": g["n_drift"],
                    "compute_capability": (info.get(g["device"]) or {}).get("compute_capability"),
                    "interpreter": (info.get(g["device"]) or {}).get("interpreter"),
                    "reported": reported.get(g["device"])} for g in groups]
    best = {(g["device"], tuple(sorted(r["case"].items()))): r for g in groups for r in g["rows"]}
    cases: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in k.cases:
        cases[tuple(sorted(c.axes.items()))] = {"number": c.number, "axes": dict(c.axes)}
    for g in groups:
        for r in g["rows"]:
            cases.setdefault(tuple(sorted(r["case"].items())), {"number": None, "axes": r["case"]})
    undeclared = _undeclared_view(k, groups, store) if isinstance(k, UndeclaredKernel) else None
    if undeclared is not None:
        # A job tunes one key, on a call stored for it: those keys are offered, the first chosen.
        for axes in undeclared["captured"].values():
            cases.setdefault(tuple(sorted(axes.items())), {"number": None, "axes": axes})
        if chosen is None and undeclared["captured"]:
            chosen = next(iter(undeclared["captured"].values()))
    if chosen is not None:
        cases.setdefault(tuple(sorted(chosen.items())), {"number": None, "axes": chosen})
    rows = []
    for key, c in cases.items():
        c["label"] = _axes_label(c["axes"])
        c["work"] = case_work(k, c["axes"])
        c["records"] = [best.get((d, key)) for d in devices]
        c["tune_url"] = kernel_url(k.name, **c["axes"]) + "#tune"
        c["value"] = json.dumps(c["axes"], sort_keys=True)
        c["selected"] = chosen is not None and dict(chosen) == dict(c["axes"])
        c["captured"] = undeclared is not None and c["value"] in undeclared["captured"]
        rows.append(c)
    rows.sort(key=lambda c: (c["number"] is None, c["number"] or 0, c["work"] or 0, c["label"]))
    n_trials = min(32, settings.max_trials_per_job)
    curl, cli = _tune_commands(base_url, k.name, chosen, n_trials, settings.api_token is not None,
                               undeclared is not None)
    return _env.get_template("kernel.html").render(
        k=k.describe(), has_reference=k.torch_reference is not None, groups=groups,
        devices=device_rows, cases=rows, any_chosen=chosen is not None, n_trials=n_trials,
        max_trials=settings.max_trials_per_job, samplers=_samplers(), curl=curl, cli=cli,
        base_url=base_url.rstrip("/"), cancel=_cancel_enabled(settings), n_suite=len(k.cases),
        undeclared=undeclared)


def _undeclared_view(k: UndeclaredKernel, groups: list[dict[str, Any]],
                     store: ServiceStore) -> dict[str, Any]:
    """What the kernel page shows of an undeclared kernel instead of a suite, bytes and a
    float64 reference it does not have: where it lives, its configs, each key's timing of every
    config per device (the records' `config_timings`, the winner marked), and the cases a job
    can tune (those with a call stored with an earlier job)."""
    d = k.definition
    configs = [dict(c) for c in (*d.configs, *d.search_space)]
    keys = [canonical_key(c) for c in configs]
    devices = []
    for g in groups:
        rows = []
        for r in g["rows"]:
            timings = r.get("config_timings") or {}
            won = canonical_key(r["config"]) if isinstance(r.get("config"), dict) else None
            failed = {key for key in keys if key in timings and timings[key] is None}
            why = _failure_reasons(store, k.name, g["device"], r["case"]) if failed else {}
            rows.append({"label": r["case_label"], "url": r["case_url"],
                         "cells": [{"us": timings.get(key), "best": key == won,
                                    "failed": key in failed, "why": why.get(key, "")}
                                   for key in keys]})
        devices.append({"device": g["device"], "rows": rows})
    captured = {json.dumps(axes, sort_keys=True): axes for axes, _ in store.kernel_captures(k.name)}
    return {"module": d.module, "qualname": d.qualname, "source_hash": d.source_hash,
            "configs": [json.dumps(c, sort_keys=True) for c in configs],
            "n_listed": len(d.configs), "timings": devices, "captured": captured}


def _failure_reasons(store: ServiceStore, kernel: str, device: str,
                     axes: dict[str, Any]) -> dict[str, str]:
    """Why each config of a key failed, by canonical config key, from the key's trial
    summaries (the latest failure of each config): a record times a failed config as null,
    which is a measurement (wrong_result, a compile error), not a config left unmeasured."""
    out: dict[str, str] = {}
    for t in store.trial_summaries(kernel, device, axes):
        if t.get("failure_kind") and isinstance(t.get("config"), dict):
            msg = str(t.get("message") or "").strip().splitlines()
            out[canonical_key(t["config"])] = f"{t['failure_kind']}" + (f": {msg[0]}" if msg else "")
    return out


def _page_number(v: str | None) -> int:
    if v is None:
        return 1
    if not (v.isascii() and v.isdigit()) or int(v) < 1 or len(v) > 9:
        raise PageError(422, f"page: expected a page number from 1, got {v!r}")
    return int(v)


def render_jobs(store: ServiceStore, settings: Settings, query: Mapping[str, str]) -> str:
    """Every job, newest first, by status and kernel, a page at a time."""
    status, kernel = _one(query, "status"), _one(query, "kernel")
    if status is not None and status not in JOB_STATUSES:
        raise PageError(422, f"status: unknown {status!r}; known: {', '.join(JOB_STATUSES)}")
    if kernel is not None and len(kernel) > MAX_NAME_CHARS:
        raise PageError(422, f"kernel: at most {MAX_NAME_CHARS} characters")
    page = _page_number(query.get("page"))
    jobs, total = store.page_jobs(status, kernel, offset=(page - 1) * JOBS_PER_PAGE,
                                  limit=JOBS_PER_PAGE)
    n_pages = max(1, math.ceil(total / JOBS_PER_PAGE))
    if page > n_pages:
        raise PageError(404, f"page {page}: there are {n_pages} pages of jobs")
    now = datetime.now(timezone.utc)

    def url(p: int) -> str:
        q = {k: v for k, v in (("status", status), ("kernel", kernel)) if v}
        return "/jobs" + ("?" + urlencode({**q, **({"page": p} if p > 1 else {})}) if q or p > 1 else "")

    poll = None
    if page == 1 and kernel is None:
        poll = f"/v1/jobs?limit={JOBS_PER_PAGE}" + (f"&status={status}" if status else "")
    names = sorted(set(kernels.all_kernels()) | ({kernel} if kernel else set()))
    return _env.get_template("jobs.html").render(
        jobs=[job_row(job_json(j), now) for j in jobs], total=total, page=page, n_pages=n_pages,
        newer=url(page - 1) if page > 1 else None, older=url(page + 1) if page < n_pages else None,
        status=status, kernel=kernel, statuses=JOB_STATUSES, kernels=names, poll=poll,
        cancel=_cancel_enabled(settings))


HELION_PAGE = 200  # entries the /helion page shows


def render_helion(store: ServiceStore, settings: Settings, query: Mapping[str, str]) -> str:
    """Helion's cache entries (kernelsearch.helion), newest first; `kernel=` keeps one kernel's."""
    kernel = _one(query, "kernel")
    if kernel is not None and len(kernel) > 200:
        raise PageError(422, "kernel: at most 200 characters")
    entries = []
    for e in store.list_helion_entries(HELION_PAGE, kernel=kernel):
        d = e.as_dict()
        d["case_label"] = _axes_label(e.axes)
        d["config_label"] = json.dumps(e.config, sort_keys=True, separators=(", ", "="))
        entries.append(d)
    return _env.get_template("helion.html").render(entries=entries, kernel=kernel, limit=HELION_PAGE)


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
