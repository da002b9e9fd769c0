"""The plain values the storage layer takes and gives: what other layers see instead of rows.

`RecordFields` is the one definition of a record: `RecordIn` and `RecordView` extend it, the
repositories copy columns by iterating it, and the wire format (`db.wire.RecordDoc`) and the
API's `RecordOut` are built from its fields. `models.Record` must have a column for each of
them (tests/db/test_store_contract.py checks it).
"""
from __future__ import annotations

import copy
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, Generic, TypeVar, final

from .models import utcnow
from .statuses import (ACTIVE_STATUSES, FINISHED_STATUSES, JOB_STATUSES, JobKind, JobStatus, RecordOrigin,
                       WinnerOrigin)

__all__ = [
    "ACTIVE_STATUSES", "FINISHED_STATUSES", "JOB_STATUSES", "JobView", "RecordFields", "RecordIn",
    "TrialIn", "RecordView", "ImportReport", "Withdrawal", "RECORD_KEY_FIELDS", "RECORD_COLUMNS",
    "VIEW_COLUMNS", "field_specs", "WORKER_VERSIONS", "HelionEntryIn", "HelionEntryView",
    "Accepted",
]

# The key of a device's info (ks_devices.info) under which a worker reports the torch and triton
# versions it tunes with; the dashboard compares a record's versions with them.
WORKER_VERSIONS = "worker_versions"


def _iso(v: Any) -> Any:
    return v.isoformat() if isinstance(v, datetime) else v


@dataclass(frozen=True)
class JobView:
    id: int
    kernel: str
    cases: list[dict[str, Any]]
    n_trials: int
    sampler: str
    timeout_s: float | None
    status: JobStatus
    trials_done: int
    device: str | None
    best: dict[str, Any] | None
    error: str | None
    owner: str | None
    heartbeat_at: datetime | None
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    current_case: dict[str, Any] | None
    # The call an undeclared kernel's job tunes on (kernels.capture.Capture as JSON), or None.
    capture: dict[str, Any] | None = None
    kind: JobKind = JobKind.DECLARED

    def as_dict(self) -> dict[str, Any]:
        """The job as the API shows it: whether it carries a capture, not the capture itself."""
        out = {k: _iso(v) for k, v in asdict(self).items() if k != "capture"}
        out["captured"] = self.capture is not None
        return out


# Not frozen: a RecordIn may be built up field by field, and a frozen dataclass cannot extend a
# mutable one (nor the reverse), so the view is not frozen either.
@dataclass(kw_only=True)
class RecordFields:
    """What a record measured, on what, with what: the fields every form of a record shares.
    `work` is the bytes the case moves (for nearest-case lookups)."""

    kernel: str
    axes: dict[str, Any]
    work: float
    device: str
    device_info: dict[str, Any] | None = None
    torch_version: str
    triton_version: str
    source_hash: str
    config: dict[str, Any]
    latency_median_us: float
    latency_min_us: float
    latency_max_us: float
    latency_iqr_us: float
    timing_method: str
    roofline_pct: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    # The PyTorch references' median latencies, measured with the record: what the speedups are
    # ratios of, carried with the record so they stay computable.
    eager_latency_us: float | None = None
    compile_latency_us: float | None = None
    rel_error: float
    n_trials: int
    n_failed: int = 0
    # Median latency of every config measured with the record, by `config_key` (a decorator's
    # list grows: only the new configs are measured); None when the study kept no such table.
    config_timings: dict[str, float | None] | None = None
    study_name: str | None = None
    job_id: int | None = None
    tuned_at: datetime = field(default_factory=utcnow)
    # Provenance (statuses.RECORD_ORIGINS): who stored the record, and from where when uploaded.
    origin: str = RecordOrigin.WORKER.value
    uploaded_by: str | None = None
    uploaded_from: str | None = None
    # The winner's origin (statuses.WINNER_ORIGINS) and, for a searched one, its median speedup
    # over the list's best, re-measured interleaved in the same run (search_space.remeasure).
    winner_origin: str = WinnerOrigin.LIST.value
    gain_vs_list: float | None = None
    # A searched winner's evidence (what KS_AUTOTUNE_SERVE_SEARCHED=auto serves an undeclared
    # kernel's on): the lower bound of the bootstrap interval of its re-measured gain, and how
    # many edge calls of the key the strict gate ran it on besides the captured call (None: no
    # strict gate ran).
    gain_low: float | None = None
    gate_edges: int | None = None


@dataclass(frozen=True, kw_only=True)
class TrialIn:
    """One trial of a record's study as an export carries it (Optuna's trial number)."""

    number: int
    state: str
    config: dict[str, Any]
    latency_median_us: float | None = None
    failure_kind: str | None = None
    message: str | None = None


@dataclass(kw_only=True)
class RecordIn(RecordFields):
    """A tuned result to store."""

    # The trials of the record's study (an import carries them; the tuner stores its own).
    trials: list[TrialIn] = field(default_factory=list)


@dataclass(kw_only=True)
class RecordView(RecordFields):
    """A stored record: current, or history pointing at the record that superseded it."""

    id: int
    is_current: bool
    superseded_at: datetime | None
    superseded_by: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: _iso(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class ImportReport:
    """added: new records stored; superseded: current records an imported one replaced;
    unchanged: entries already present (a second import of the same file is all unchanged)."""

    added: int = 0
    superseded: int = 0
    unchanged: int = 0
    trials_added: int = 0
    # Entries not imported (an import that keeps going past a bad entry): where and why.
    rejected: list[Rejection] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rejection:
    """One entry of a records document that was not imported: its index in `records`, its
    kernel's name (as the entry gives it, when it gives one) and why."""

    index: int
    kernel: str | None
    message: str


@dataclass(frozen=True)
class Withdrawal:
    """A withdrawn (deleted) record, and the record of its key served in its place, if any."""

    withdrawn: RecordView
    now_current: RecordView | None

    def as_dict(self) -> dict[str, Any]:
        return {"withdrawn": self.withdrawn.as_dict(),
                "now_current": self.now_current.as_dict() if self.now_current else None}


@dataclass(frozen=True, kw_only=True)
class HelionEntryIn:
    """One Helion autotune cache entry to store (`models.HelionEntry`): Helion's cache key and the
    exact text it stored (`data`), with what the acceptance gate read out of that text."""

    cache_key: str
    kernel: str
    hardware: str
    specialization_key: str
    axes: dict[str, Any]
    config: dict[str, Any]
    data: str
    kernel_source_hash: str
    runtime_name: str
    backend: str
    key_type: str
    checked_by: str
    # A worker's tuning or an upload (statuses.RecordOrigin): an upload never replaces a worker's.
    origin: str = RecordOrigin.UPLOAD.value
    uploaded_by: str | None = None
    uploaded_from: str | None = None


@dataclass(frozen=True, kw_only=True)
class HelionEntryView(HelionEntryIn):
    """A stored Helion entry: first stored at `created_at`, last replaced at `updated_at`."""

    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {k: _iso(v) for k, v in asdict(self).items()}


# The fields a record's key rows hold (ks_kernels, ks_cases, ks_devices); every other field of
# RecordFields is a column of ks_records under the same name, and so is each view-only field.
RECORD_KEY_FIELDS = ("kernel", "axes", "work", "device")
RECORD_COLUMNS = tuple(f.name for f in fields(RecordFields) if f.name not in RECORD_KEY_FIELDS)
VIEW_COLUMNS = tuple(f.name for f in fields(RecordView) if f.name not in RECORD_KEY_FIELDS)


def field_specs(cls: type, names: tuple[str, ...] | None = None) -> dict[str, tuple[Any, Any]]:
    """`{name: (type, default)}` of a view dataclass's fields, in their order, for building a
    pydantic model from them (`create_model(**specs)`); `...` marks a required field. A field
    with a default factory is required there: a document or an answer always says it."""
    hints = typing.get_type_hints(cls)
    wanted = [f for f in fields(cls) if names is None or f.name in names]
    if names is not None and len(wanted) != len(names):
        raise ValueError(f"{cls.__name__} has no field {sorted(set(names) - {f.name for f in wanted})}")
    return {f.name: (hints[f.name], ... if f.default is MISSING else f.default) for f in wanted}


# The acceptance gate's token (search_space.acceptance, the only module that may name it; a test
# reads the tree to hold it so). The gate needs the kernels' declarations, which this layer must
# not import, so the store cannot call the gate itself: instead it takes only an `Accepted`, and
# only a holder of this token can make one. A plain record given to the store is a TypeError,
# and a type checker refuses it before it runs.
_GATE_TOKEN = object()

R = TypeVar("R", RecordIn, HelionEntryIn)


@final
class Accepted(Generic[R]):
    """A record (or a Helion entry) the acceptance gate passed, as the store writes it. Only the
    gate makes one; it keeps its own copy, so changing the record afterwards changes nothing
    stored."""

    __slots__ = ("_value",)
    _value: R

    def __init__(self, value: R, token: object) -> None:
        if token is not _GATE_TOKEN:
            raise TypeError("Accepted: only the acceptance gate (search_space.acceptance) makes one")
        if not isinstance(value, (RecordIn, HelionEntryIn)):
            raise TypeError(f"Accepted: expected a RecordIn or HelionEntryIn, got {type(value).__name__}")
        object.__setattr__(self, "_value", copy.deepcopy(value))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Accepted is read-only")

    @property
    def value(self) -> R:
        """A copy of what the gate passed."""
        return copy.deepcopy(self._value)

    def __repr__(self) -> str:
        return f"Accepted({self._value!r})"


def accepted_value(got: Any, arg: str, kind: type[R]) -> R:
    """What the store writes from `got`: its gated value; TypeError naming the argument when
    `got` is not an `Accepted` of `kind` (a record that has not passed the gate)."""
    if not isinstance(got, Accepted) or not isinstance(got._value, kind):
        raise TypeError(f"{arg}: expected Accepted[{kind.__name__}] from the acceptance gate "
                        f"(search_space.acceptance), got {type(got).__name__}")
    return got.value


@dataclass(frozen=True)
class ArtifactSetView:
    """An artifact set with its files' bytes, and the record (kernel, case, device, config) it
    was compiled for, or the Helion entry (`helion_key`; its kernel, axes, hardware, config)."""

    id: int
    record_id: int | None
    kernel: str
    axes: dict[str, Any]
    device: str
    config: dict[str, Any]
    cache_key: str
    env_fingerprint: str
    env: dict[str, Any]
    group: str
    origin: str
    files: dict[str, bytes] = field(repr=False)
    is_current: bool = True
    helion_key: str | None = None
