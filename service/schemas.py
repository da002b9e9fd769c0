"""Request and response models of the REST API, so the OpenAPI document describes every route."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from kernelsearch.db.statuses import JOB_KINDS, JOB_STATUSES
from kernelsearch.db.views import RecordFields, field_specs
from kernelsearch.db.wire import AxisValue
from kernelsearch.kernels.undeclared import MAX_NAME_CHARS

JobStatus = Literal[JOB_STATUSES]  # type: ignore[valid-type]  # the statuses' one definition
JobKind = Literal[JOB_KINDS]  # type: ignore[valid-type]
Match = Literal["exact", "nearest"]


class FieldError(BaseModel):
    loc: list[str | int] = Field(description='where: e.g. ["body", "cases", 0, "seq_len"]')
    msg: str
    type: str = Field(description="pydantic's error type, or empty")


class Message(BaseModel):
    """Every 4xx/5xx answer of the API has this one shape (service.errors builds it)."""

    detail: str = Field(description="what went wrong, as one sentence")
    errors: list[FieldError] = Field(default_factory=list,
                                     description="each invalid field of a 422; empty otherwise")


class Health(BaseModel):
    status: Literal["ok"]
    database: str = Field(description="backend name: sqlite or postgresql")
    records_version: int
    devices: list[str]
    worker: Literal["embedded", "none"]
    versions: dict[str, str]


class Unhealthy(BaseModel):
    status: Literal["unavailable", "degraded"]
    detail: str


class AxisOut(BaseModel):
    """A size axis has a range; a categorical one (a dtype, say) its choices; an undeclared
    kernel's key may also be a value that is no integer, given as a key token (`tokens`)."""

    name: str
    minimum: int | None = None
    maximum: int | None = None
    choices: list[str] | None = None
    tokens: list[str] | None = Field(None, description="the key tokens' prefixes this axis "
                                     "takes besides integers (scale=float:0.5)")
    accepts: str | None = Field(None, description="what the axis takes, in words")
    doc: str = ""


class ParamOut(BaseModel):
    name: str
    choices: list[Any]
    default: Any
    doc: str = ""
    requires: dict[str, list[Any]] = Field(default_factory=dict)


class KernelOut(BaseModel):
    name: str
    description: str
    benchmark_problem: str
    axes: list[AxisOut]
    inputs: list[str]
    outputs: list[str]
    params: list[ParamOut]
    default_config: dict[str, Any]
    rtol: float
    n_cases: int
    extra_axes: list[str] = Field(default_factory=list,
                                  description="axes a lookup accepts that do not key the case")


class CaseOut(BaseModel):
    number: int
    axes: dict[str, AxisValue]
    bytes_moved: int
    info: dict[str, Any] = Field(default_factory=dict)


class _RecordOutBase(BaseModel):
    """A tuned record: the best config found for (kernel, case, device)."""

    model_config = ConfigDict(extra="allow")


def _record_out_fields() -> dict[str, Any]:
    """The fields RecordOut names, in the order the API answers with them: the record's own
    (typed as `RecordFields` types them) and the API's short forms of the others; every other
    field of the view passes through as an extra."""
    rec = field_specs(RecordFields)

    def own(name: str, description: str | None = None) -> tuple[Any, Any]:
        tp, default = rec[name]
        return tp, Field(default, description=description)

    return {
        "kernel": own("kernel"),
        "device": own("device"),
        "case": (dict[str, AxisValue], ...),
        "config": own("config"),
        "latency_us": (float, Field(description="median latency of the best config, microseconds")),
        "roofline_pct": own("roofline_pct", "bytes / copy bandwidth over latency, in %"),
        "speedup_eager": own("speedup_eager"),
        "speedup_compile": own("speedup_compile"),
        "timing_method": own("timing_method"),
        "versions": (dict[str, str | None],
                     Field(default_factory=dict, description="torch, triton and kernel source hash")),
        "tuned_at": own("tuned_at"),
    }


RecordOut = create_model("RecordOut", __base__=_RecordOutBase, __module__=__name__,
                         __doc__=_RecordOutBase.__doc__, **_record_out_fields())


class BestOut(RecordOut):  # type: ignore[valid-type,misc]
    match: Match = Field(description="exact: a record for these axes; nearest: the tuned case "
                                     "of this kernel and device closest in work")
    requested: dict[str, AxisValue] = Field(description="the axes asked for")
    distance: float = Field(0.0, ge=0, description="how far the record's case is from the one "
                            "asked for: 0 when exact, else the log ratio of their bytes moved")
    ignored_axes: list[str] = Field(default_factory=list, description="informational axes the "
                                    "query named, which do not key a case and were ignored")
    same_versions: bool = Field(description="tuned with this service's torch, triton and kernel source")
    current_versions: dict[str, str | None]


class JobCreate(BaseModel):
    """A tuning job: suite cases ("all") or any valid shapes of one kernel."""

    # strict: `true` or "3" is not an integer, 3.0 neither.
    model_config = ConfigDict(extra="forbid", strict=True)

    kernel: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    cases: list[dict[str, AxisValue]] | Literal["all"] = Field(
        description='"all" for the kernel\'s suite, or a list of case axes such as {"seq_len": 2}')
    n_trials: int = Field(gt=0, description="trials this job adds to each case's study (earlier trials are kept)")
    sampler: str | None = Field(None, max_length=32, description="Optuna sampler; default tpe")
    timeout_s: float | None = Field(None, gt=0, le=30 * 86400,
                                    description="wall-clock limit of the whole job")
    capture: dict[str, Any] | None = Field(
        None, description="an undeclared kernel's call to tune on (kernels.capture.Capture as "
                          "JSON: arguments and a grid per config); its job has that one case")


class JobOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    status: JobStatus
    kernel: str
    kind: JobKind | None = Field(None, description="what the job runs: declared (a registered kernel's "
                                 "cases), capture (an undeclared kernel's captured call), search (a "
                                 "captured key beyond its config list), helion (Helion's own autotuner)")
    cases: list[dict[str, AxisValue]]
    n_trials: int
    sampler: str | None = None
    timeout_s: float | None = None
    trials_done: int = 0
    device: str | None = None
    best: Any = None
    error: str | None = None
    current_case: dict[str, Any] | None = None
    captured: bool = Field(False, description="the job tunes on a call's capture")
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class JobSubmitted(JobOut):
    """POST /v1/jobs's answer: the job, and whether it is an identical job already queued or
    running (no new job was made; its trials are not added twice)."""

    existing: bool = Field(description="true: an identical job (same kernel, cases, n_trials, "
                                       "sampler, timeout) was already queued or running, and this "
                                       "is that job; false: a new job was queued")


class DefinitionIn(BaseModel):
    """An undeclared kernel as `@kernelsearch.autotune` describes it (kernels.undeclared.Definition):
    its identity, Triton's tuning key and its configs."""

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: Literal["undeclared"] = "undeclared"
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="module.qualname of the kernel")
    module: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    qualname: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arg_names: list[str] = Field(min_length=1, max_length=200)
    key: list[str] = Field(max_length=64, description="triton.autotune's key: arguments whose values key a record")
    dtype_args: list[str] = Field(default_factory=list, max_length=200,
                                  description="tensor arguments whose dtype keys a record")
    configs: list[dict[str, bool | int | float | str]] = Field(min_length=1, max_length=1000)
    source_hash: str = Field(min_length=1, max_length=300, description="Triton's JIT cache key, hashed")
    search_space: list[dict[str, bool | int | float | str]] = Field(
        default_factory=list, max_length=1000,
        description="configs workers may search besides `configs` (the decorator's search_space=)")
    pruned: list[dict[str, bool | int | float | str]] = Field(
        default_factory=list, max_length=1000,
        description="configs the kernel's pruner made on calls (a record may hold one; never searched)")
    reached_by: Literal["decorator", "swap", "triton_cache"] = Field(
        "decorator", description="how the kernel reached kernelsearch: a worker importing a module "
                                 "that keeps triton.autotune wraps the kernel as the swap did")
    description: str = Field("", max_length=500)


class HelionEntryIn(BaseModel):
    """A Helion autotune cache entry (`kernelsearch.helion`): the exact text Helion stored under
    its cache key, and what the backend saw of the kernel."""

    model_config = ConfigDict(extra="forbid", strict=True)

    data: str = Field(min_length=1, max_length=60_000,
                      description="Helion's cache entry, as its local cache writes it (JSON text)")
    kernel: str | None = Field(None, min_length=1, max_length=290,
                               description="module.qualname of the Helion kernel, when known")
    arg_names: list[str] | None = Field(None, max_length=200,
                                        description="the kernel's tensor arguments, in call order")
    checked: bool | None = Field(None, description="whether Helion's accuracy check was on "
                                 "while it tuned (false: refused); null: not reported")


class HelionJobIn(BaseModel):
    """A Helion cache miss to tune on a worker (`kernelsearch.helion`, KS_HELION_ON_MISS=default):
    Helion's cache key and the call's capture (search_space/helion_job.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    key: str = Field(pattern="^[0-9a-f]{64}$", description="Helion's cache key (sha256 of its key, hex)")
    capture: dict[str, Any] = Field(description="the call: the kernel's module and qualified name, "
                                    "its arguments, Helion's settings and key fields (kind: helion)")


class HelionEntryOut(BaseModel):
    """A stored Helion entry: `data` is exactly the text that was stored under `key`."""

    key: str
    kernel: str
    hardware: str
    specialization_key: str
    axes: dict[str, AxisValue]
    config: dict[str, Any]
    data: str
    kernel_source_hash: str
    runtime_name: str
    backend: str
    key_type: str
    checked_by: str
    origin: str = Field(description="worker (tuned by a worker) or upload; an upload never "
                                    "replaces a worker's entry")
    uploaded_by: str | None
    uploaded_from: str | None
    created_at: datetime
    updated_at: datetime
