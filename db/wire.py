"""The records file (export/import) and the rules every stored record passes first.

`RecordDoc` is built from `views.RecordFields`, refined with strict types (`true` is no count,
"1.5" no latency) and the columns' widths, so a record SQLite accepts is one PostgreSQL accepts
too; `TrialDoc` likewise from `views.TrialIn`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, fields
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError,
                      create_model, field_validator, model_validator)

from .checks import axes_key
from .errors import ImportRejected
from .models import TIMING_METHODS, Case, Device, Kernel, Record
from .portable import dotted, first_unportable
from .statuses import RECORD_ORIGINS, TRIAL_STATES, WINNER_ORIGINS, RecordOrigin, TrialStatus
from .views import Accepted, RecordFields, RecordIn, RecordView, Rejection, TrialIn, field_specs

EXPORT_SCHEMA = "kernelsearch.records"
# Version 2 adds each record's trials and its references' latencies; version 3 the definitions
# of the undeclared kernels its records are of (`kernels`, by name); versions 1 and 2 still import.
EXPORT_VERSION = 3
IMPORT_VERSIONS = (1, 2, 3)
EXPORT_MESSAGE_CHARS = 2000
INT32_MAX = 2**31 - 1  # Integer columns on PostgreSQL
INT64_MAX = 2**63 - 1  # BigInteger columns

# A case axis: a size, or a category such as a dtype (strict: `true` is not 1, 1 is not "1").
AxisValue = StrictInt | StrictStr


def _width(column: Any) -> int:
    """The declared length of a String column: PostgreSQL refuses longer text, SQLite does not."""
    return int(column.property.columns[0].type.length)


def _finite(v: float | None, name: str, *, positive: bool = False) -> float | None:
    if v is None:
        return v
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite")
    if v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}")
    return v


def _datetime_text(v: Any) -> Any:
    # Lax datetime parsing would also read a number as a Unix time.
    if not isinstance(v, (str, datetime)):
        raise ValueError(f"expected an ISO 8601 date-time text, got {type(v).__name__}")
    return v


def _doc_fields(cls: type, types: dict[str, Any], limits: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """create_model() fields for a view dataclass: its types and defaults, a wire type where
    `types` names one, and `limits` (pydantic Field arguments) added."""
    return {name: (types.get(name, tp), Field(default, **limits.get(name, {})))
            for name, (tp, default) in field_specs(cls).items()}


class DeviceInfoDoc(BaseModel):
    """The keys of `device_info` that fill the devices table's columns; others are kept as given."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: str | None = Field(None, max_length=_width(Device.name))
    compute_capability: str | None = Field(None, max_length=_width(Device.compute_capability))
    memory_bytes: int | None = Field(None, ge=0, le=INT64_MAX)
    multiprocessors: int | None = Field(None, ge=0, le=INT32_MAX)
    cuda_version: str | None = Field(None, max_length=_width(Device.cuda_version))
    driver_version: str | None = Field(None, max_length=_width(Device.driver_version))
    interpreter: bool | None = None


class _TrialRules(BaseModel):
    """One trial as exported (version 2)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("number", check_fields=False)
    @classmethod
    def _number(cls, v: int) -> int:
        if v < 0:
            raise ValueError("must be >= 0")
        return v

    @field_validator("latency_median_us", check_fields=False)
    @classmethod
    def _latency(cls, v: float | None) -> float | None:
        return _finite(v, "latency_median_us", positive=True)

    @model_validator(mode="after")
    def _outcome(self) -> Any:
        t: Any = self  # a TrialDoc: the fields are TrialIn's
        if t.state == TrialStatus.COMPLETE and t.latency_median_us is None:
            raise ValueError("a complete trial needs latency_median_us")
        if t.state == TrialStatus.FAIL and t.latency_median_us is not None:
            raise ValueError("a failed trial has no latency_median_us")
        return self


TrialDoc = create_model(
    "TrialDoc", __base__=_TrialRules, __module__=__name__, __doc__=_TrialRules.__doc__,
    **_doc_fields(TrialIn, {"number": StrictInt, "state": Literal[TRIAL_STATES]}, {}),
)

_RECORD_TYPES: dict[str, Any] = {
    "axes": dict[str, AxisValue],
    "device_info": DeviceInfoDoc | None,
    "timing_method": Literal[TIMING_METHODS],
    "origin": Literal[RECORD_ORIGINS],
    "winner_origin": Literal[WINNER_ORIGINS],
}
_RECORD_LIMITS: dict[str, dict[str, Any]] = {
    "kernel": {"max_length": _width(Kernel.name)},
    "device": {"max_length": _width(Device.name)},
    "torch_version": {"max_length": _width(Record.torch_version)},
    "triton_version": {"max_length": _width(Record.triton_version)},
    "source_hash": {"max_length": _width(Record.source_hash)},
    "n_trials": {"ge": 0, "le": INT32_MAX},
    "n_failed": {"ge": 0, "le": INT32_MAX},
    "study_name": {"max_length": _width(Record.study_name)},
    "job_id": {"ge": 0, "le": INT32_MAX},
    "tuned_at": {"strict": False},
    "uploaded_by": {"max_length": _width(Record.uploaded_by)},
    "uploaded_from": {"max_length": _width(Record.uploaded_from)},
    "gain_vs_list": {"gt": 0, "allow_inf_nan": False},
    "gain_low": {"gt": 0, "allow_inf_nan": False},
    "gate_edges": {"ge": 0, "le": INT32_MAX},
}


class _RecordRules(BaseModel):
    """One record as exported; the same rules validate `RecordIn` before it is stored.

    Strict types (`true` is no count, "1.5" no latency) and the columns' widths, so a record
    SQLite accepts is one PostgreSQL accepts too.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("kernel", "device", "torch_version", "triton_version", "source_hash",
                     check_fields=False)
    @classmethod
    def _non_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("axes", check_fields=False)
    @classmethod
    def _axes(cls, v: dict[str, AxisValue]) -> dict[str, AxisValue]:
        if len(axes_key(v)) > _width(Case.axes_key):
            raise ValueError(f"longer than {_width(Case.axes_key)} characters as JSON")
        return v

    @field_validator("tuned_at", "superseded_at", mode="before", check_fields=False)
    @classmethod
    def _when(cls, v: Any) -> Any:
        return v if v is None else _datetime_text(v)

    @field_validator("work", "latency_iqr_us", "rel_error", "roofline_pct", check_fields=False)
    @classmethod
    def _non_negative(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name)

    @field_validator(
        "latency_median_us", "latency_min_us", "latency_max_us", "speedup_eager", "speedup_compile",
        "eager_latency_us", "compile_latency_us", check_fields=False,
    )
    @classmethod
    def _positive(cls, v: float | None, info: Any) -> float | None:
        return _finite(v, info.field_name, positive=True)

    @field_validator("tuned_at", check_fields=False)
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        # An offset can carry a time at either end of the calendar past it (0001-01-01T00:00
        # +23:59 is in year 0 in UTC): datetime raises OverflowError, which pydantic would not
        # turn into a validation error.
        try:
            return (v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v).astimezone(timezone.utc)
        except OverflowError:
            raise ValueError(f"{v.isoformat()} is outside the years 1..9999 in UTC") from None

    @field_validator("latency_max_us", check_fields=False)
    @classmethod
    def _ordered(cls, v: float, info: Any) -> float:
        # The last of the three latencies (fields validate in order), so the error names a field.
        lo, mid = info.data.get("latency_min_us"), info.data.get("latency_median_us")
        if lo is not None and mid is not None and not lo <= mid <= v:
            raise ValueError("latencies must satisfy latency_min_us <= latency_median_us <= latency_max_us")
        return v

    @model_validator(mode="after")
    def _speedups_from_references(self) -> Any:
        # A speedup is the reference's latency over the record's: computable whenever the
        # reference was measured, so a record that carries one always shows the other.
        r: Any = self
        if r.speedup_eager is None and r.eager_latency_us is not None:
            r.speedup_eager = r.eager_latency_us / r.latency_median_us
        if r.speedup_compile is None and r.compile_latency_us is not None:
            r.speedup_compile = r.compile_latency_us / r.latency_median_us
        return self

    @model_validator(mode="after")
    def _trials_need_a_study(self) -> Any:
        r: Any = self
        if r.trials and not r.study_name:
            raise ValueError("trials need the record's study_name")
        numbers = [t.number for t in r.trials]
        if len(set(numbers)) != len(numbers):
            raise ValueError("trials: each trial number may appear once")
        return self

    def to_record_in(self) -> RecordIn:
        names = {f.name for f in fields(RecordIn)}
        d = {k: v for k, v in self.model_dump().items() if k in names}
        # device_info as given: no keys added for the columns it did not name.
        r: Any = self
        d["device_info"] = r.device_info.model_dump(exclude_unset=True) if r.device_info else None
        d["trials"] = [TrialIn(**t) for t in d.get("trials") or []]
        return RecordIn(**d)


# The view's own fields (id, is_current, superseded_*) are in exports for readers and ignored
# on import: the supersede rule decides them.
_VIEW_ONLY = {name: (tp | None, Field(None, strict=False))
              for name, (tp, _) in field_specs(RecordView).items()
              if name not in {f.name for f in fields(RecordFields)}}

_RECORD_DOC_FIELDS: dict[str, Any] = {
    **_doc_fields(RecordFields, _RECORD_TYPES, _RECORD_LIMITS),
    "trials": (list[TrialDoc], []),  # type: ignore[valid-type]
    **_VIEW_ONLY,
}
RecordDoc = create_model("RecordDoc", __base__=_RecordRules, __module__=__name__,
                         __doc__=_RecordRules.__doc__, **_RECORD_DOC_FIELDS)


def first_error(e: ValidationError) -> tuple[str, str]:
    """(dotted location, message) of a validation's first error."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(entry)"
    return loc, err["msg"]


class InvalidRecord(ValueError):
    """A record that breaks the wire format's rules; `field` is the dotted path of the first bad
    field ("(entry)" for a rule over several)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


def validated_record(rec: RecordIn) -> RecordIn:
    """`rec` through the wire format's rules (InvalidRecord names the field), normalised as an
    import would store it."""
    if not isinstance(rec, RecordIn):
        raise TypeError(f"rec: expected db.views.RecordIn, got {type(rec).__name__}")
    try:
        return RecordDoc.model_validate(asdict(rec)).to_record_in()
    except ValidationError as e:
        loc, msg = first_error(e)
        raise InvalidRecord(f"rec.{loc}: {msg}", field=loc) from None


# Checks an entry beyond its types (against the kernel's declaration, which this layer does not
# know: the acceptance gate): the entry as accepted, or ImportRejected with `field` set; the index
# is added here.
EntryCheck = Callable[[RecordIn], "Accepted[RecordIn]"]


def doc_definitions(doc: Any) -> dict[str, dict[str, Any]]:
    """The kernel definitions a records document carries (version 3's `kernels`), by name;
    ImportRejected when the field is not an object of objects. Each definition's own fields
    are the kernels layer's to check (kernels.undeclared.Definition.from_json)."""
    got = doc.get("kernels", {}) if isinstance(doc, dict) else {}
    if not isinstance(got, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                            for k, v in got.items()):
        raise ImportRejected("document: 'kernels' must map kernel names to definitions",
                             field="kernels")
    bad = first_unportable(got, ("kernels",))
    if bad is not None:
        raise ImportRejected(f"{dotted(bad[0])}: {bad[1]}", field=dotted(bad[0]))
    return got


def _entry_kernel(entry: Any) -> str | None:
    k = entry.get("kernel") if isinstance(entry, dict) else None
    return k if isinstance(k, str) else None


def parse_records_doc(doc: Any, *, check: EntryCheck | None = None,
                      rejected: list[Rejection] | None = None) -> list[RecordIn]:
    """Validate an export document; ImportRejected names the first bad entry and field. With
    `rejected`, a bad entry is appended there (index, kernel, why) and the others are returned;
    a document that is not a records document at all still raises."""
    return [rec for rec, _ in _entries(doc, check, rejected)]


def accepted_records_doc(doc: Any, *, check: EntryCheck,
                         rejected: list[Rejection] | None = None) -> list[Accepted[RecordIn]]:
    """`parse_records_doc` for storing: each entry as `check` (the acceptance gate) accepted it."""
    return [a for _, a in _entries(doc, check, rejected) if a is not None]


def _entries(doc: Any, check: EntryCheck | None,
             rejected: list[Rejection] | None) -> list[tuple[RecordIn, Accepted[RecordIn] | None]]:
    if not isinstance(doc, dict):
        raise ImportRejected(f"document: expected a JSON object, got {type(doc).__name__}")
    if doc.get("schema") != EXPORT_SCHEMA:
        raise ImportRejected(
            f"document: 'schema' must be {EXPORT_SCHEMA!r}, got {doc.get('schema')!r}", field="schema"
        )
    version = doc.get("version")
    if type(version) is not int or version not in IMPORT_VERSIONS:  # `true` == 1 in Python
        raise ImportRejected(
            f"document: unsupported version {version!r}; this code reads versions "
            f"{', '.join(map(str, IMPORT_VERSIONS))}",
            field="version",
        )
    entries = doc.get("records")
    if not isinstance(entries, list):
        raise ImportRejected("document: 'records' must be a list", field="records")
    doc_definitions(doc)
    out: list[tuple[RecordIn, Accepted[RecordIn] | None]] = []
    for i, entry in enumerate(entries):
        if rejected is None:
            out.append(_parse_entry(i, entry, check))
            continue
        try:
            out.append(_parse_entry(i, entry, check))
        except ImportRejected as e:
            rejected.append(Rejection(index=i, kernel=_entry_kernel(entry), message=str(e)))
    return out


def _parse_entry(i: int, entry: Any, check: EntryCheck | None) -> tuple[RecordIn, Accepted[RecordIn] | None]:
    """One entry of `records` as a RecordIn, and as `check` accepted it; ImportRejected names the
    entry and field."""
    if not isinstance(entry, dict):
        raise ImportRejected(f"records[{i}]: expected an object", index=i)
    bad = first_unportable(entry, ("records", i))
    if bad is not None:
        loc, why = bad
        raise ImportRejected(f"{dotted(loc)}: {why}", index=i, field=dotted(loc[2:]) or None)
    # A file's entry that does not say where it came from came from the file.
    entry = entry if "origin" in entry else {**entry, "origin": RecordOrigin.IMPORT.value}
    try:
        rec = RecordDoc.model_validate(entry).to_record_in()
    except ValidationError as e:
        path, msg = first_error(e)
        raise ImportRejected(f"records[{i}].{path}: {msg}", index=i, field=path) from None
    if check is None:
        return rec, None
    try:
        return rec, check(rec)
    except ImportRejected as e:
        where = e.field or "(entry)"
        raise ImportRejected(f"records[{i}].{where}: {e}", index=i, field=e.field) from None
