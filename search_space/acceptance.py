"""The one acceptance gate for a record: every way a record reaches the store passes here first
(the upload route, `kernelsearch records import`, the tuner, `@kernelsearch.autotune` sharing).

It lives in search_space because it needs the kernel's declaration (`KernelDef`), which the db
layer must not import; the service and the tuner both sit above it. The store still applies the
wire format's type and width rules (db.wire) to whatever it is given.

A record is refused with `RecordRejected`, naming the field, when it does not match its kernel's
declaration (known kernel, exactly its axes, a complete config the kernel accepts, launch options
in range) or breaks a physical bound (a latency faster than the device's memory allows, an error
above the kernel's tolerance, an unbounded derived figure, a time outside the project's era).
Checks the declaration cannot answer (a kernel without `bytes_moved`, a device of unknown
bandwidth) are skipped, never turned into a refusal.

Helion's autotune cache entries (`kernelsearch.helion`) are not records (no latency, error or
versions; Helion's own config) and pass their own gate here, `accepted_helion`: Helion's entry
shape, and the check the config passed (Helion's accuracy check against its default config)
recorded as the entry's `checked_by`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from kernelsearch import kernels
from kernelsearch.db.errors import ImportRejected
from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.db.views import HelionEntryIn, RecordIn
from kernelsearch.db.wire import InvalidRecord, validated_record
from kernelsearch.kernels.errors import InvalidConfig
from kernelsearch.kernels.spec import LAUNCH_OPTIONS, KernelDef, in_choices
from kernelsearch.kernels.undeclared import DTYPE_AXIS_SUFFIX

# Bytes per second no device moves: 1000 TB/s, some 200 times an H200's HBM and well above any
# on-chip cache. Applies on every device, known or not (an interpreter's too).
MAX_BYTES_PER_S = 1e15
# Peak memory bandwidth (bytes/s) from the vendors' datasheets. A record must not claim to move
# its case's bytes faster than PEAK_MARGIN times this: the margin covers caches (a small case
# may sit in L2) and datasheet rounding. A device not listed has only MAX_BYTES_PER_S.
PEAK_MEMORY_BANDWIDTH = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA H100": 3.35e12,
    "NVIDIA A100-SXM4-80GB": 2.039e12,
    "NVIDIA A100-SXM4-40GB": 1.555e12,
    "NVIDIA B200": 8e12,
}
PEAK_MARGIN = 10.0
# Derived figures: a roofline past 150 % or a speedup past 10^4 is a bad measurement or a lie.
MAX_ROOFLINE_PCT = 150.0
MAX_SPEEDUP = 1e4
# A speedup given with its reference latency must be their ratio, to this relative tolerance.
SPEEDUP_RTOL = 0.01
# Launch options where the kernel's own choices do not allow the value.
MAX_NUM_WARPS = 32
MAX_NUM_STAGES = 16
MAX_NUM_CTAS = 16
MAX_REGISTERS = 255
# No record predates the project's kernels; a clock may run a little ahead of the server's.
ERA_START = datetime(2020, 1, 1, tzinfo=timezone.utc)
CLOCK_SKEW = timedelta(hours=1)


class RecordRejected(ValueError):
    """A record the gate refuses: `field` is the dotted path of the first bad field, `status`
    the HTTP status an API answers with (404 for an unknown kernel, 422 otherwise)."""

    def __init__(self, field: str, message: str, *, status: int = 422) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message
        self.status = status


def _power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check_launch_options(k: KernelDef, config: dict[str, Any]) -> None:
    """Launch options in range, unless the kernel itself lists the value among its choices."""
    bounds = {
        "num_warps": (lambda v: _power_of_two(v) and v <= MAX_NUM_WARPS,
                      f"a power of two in 1..{MAX_NUM_WARPS}"),
        "num_stages": (lambda v: 1 <= v <= MAX_NUM_STAGES, f"an int in 1..{MAX_NUM_STAGES}"),
        "num_ctas": (lambda v: _power_of_two(v) and v <= MAX_NUM_CTAS,
                     f"a power of two in 1..{MAX_NUM_CTAS}"),
        "maxnreg": (lambda v: 1 <= v <= MAX_REGISTERS, f"an int in 1..{MAX_REGISTERS}"),
    }
    own = {p.name: p.choices for p in k.params}
    for opt in LAUNCH_OPTIONS:
        if opt not in config or config[opt] is None:
            continue
        v = config[opt]
        if opt in own and in_choices(v, own[opt]):
            continue
        ok, want = bounds[opt]
        if isinstance(v, bool) or not isinstance(v, int) or not ok(v):
            raise RecordRejected(f"config.{opt}", f"expected {want}, got {v!r}")


def _check_declaration(k: KernelDef, rec: RecordIn) -> None:
    try:
        axes = k.validate_axes(rec.axes, strict=True)
    except ValueError as e:
        raise RecordRejected("axes", str(e)) from None
    if axes != rec.axes:
        extra = sorted(set(rec.axes) - set(axes))
        raise RecordRejected("axes", f"{k.name}: axes {extra} do not key a case; a record's axes "
                                     f"are exactly {sorted(axes)}")
    if not isinstance(rec.config, dict):
        raise RecordRejected("config", f"expected an object, got {type(rec.config).__name__}")
    _check_launch_options(k, rec.config)
    try:
        full = k.validate_config(rec.config)
    except InvalidConfig as e:
        raise RecordRejected("config", str(e)) from None
    # validate_config completes a partial config with defaults; a record names what it ran.
    missing = sorted(set(full) - set(rec.config))
    if missing:
        raise RecordRejected("config", f"{k.name}: missing parameters {missing}; a record's config "
                                       f"names every parameter it ran with")


def _bytes_moved(k: KernelDef, axes: dict[str, Any]) -> float | None:
    """The case's bytes, or None where the kernel cannot say (an undeclared kernel has no
    bytes_moved, or one that fails on this case): the memory bound is then skipped."""
    fn = getattr(k, "bytes_moved", None)
    if fn is None:
        return None
    try:
        moved = float(fn(axes))
    except Exception:  # noqa: BLE001 - a user's declaration may raise anything
        return None
    return moved if math.isfinite(moved) and moved > 0 else None


def _tolerance(k: KernelDef, axes: dict[str, Any]) -> float | None:
    """The kernel's rtol for the case, or None where its declaration cannot say (no rtol, or a
    tolerance hook that fails): the error bound is then skipped."""
    try:
        rtol = float(k.rtol_for(axes))
    except Exception:  # noqa: BLE001 - a user's declaration may raise anything
        return None
    return rtol if math.isfinite(rtol) and rtol >= 0 else None


def _check_physics(k: KernelDef, rec: RecordIn) -> None:
    # Positive, finite and ordered latencies are db.wire's rules, applied before.
    moved = _bytes_moved(k, rec.axes)
    if moved is not None:
        rate = moved / (rec.latency_min_us * 1e-6)
        peak = PEAK_MEMORY_BANDWIDTH.get(rec.device)
        limit = min(MAX_BYTES_PER_S, peak * PEAK_MARGIN) if peak else MAX_BYTES_PER_S
        if rate > limit:
            whose = f"{PEAK_MARGIN:g} x {rec.device}'s peak" if peak else "any device's"
            raise RecordRejected(
                "latency_min_us",
                f"{rec.latency_min_us:g} us for the {moved:.0f} bytes this case moves is "
                f"{rate / 1e12:.3g} TB/s, beyond {whose} {limit / 1e12:.3g} TB/s: not a measurement")
    rtol = _tolerance(k, rec.axes)
    if rtol is not None and not (math.isfinite(rec.rel_error) and 0 <= rec.rel_error <= rtol):
        raise RecordRejected("rel_error", f"{rec.rel_error!r} is above the kernel's tolerance "
                                          f"{rtol:g} for this case")
    if rec.roofline_pct is not None and not 0 <= rec.roofline_pct <= MAX_ROOFLINE_PCT:
        raise RecordRejected("roofline_pct", f"{rec.roofline_pct!r} is outside 0..{MAX_ROOFLINE_PCT:g}")
    for name, ref in (("speedup_eager", rec.eager_latency_us),
                      ("speedup_compile", rec.compile_latency_us)):
        v = getattr(rec, name)
        if v is None:
            continue
        if not 0 < v <= MAX_SPEEDUP:
            raise RecordRejected(name, f"{v!r} is outside (0, {MAX_SPEEDUP:g}]")
        if ref is not None and abs(v - ref / rec.latency_median_us) > SPEEDUP_RTOL * v:
            raise RecordRejected(name, f"{v!r} is not the reference's latency over the record's "
                                       f"({ref / rec.latency_median_us:.4g})")
    if not (math.isfinite(rec.work) and rec.work > 0):
        raise RecordRejected("work", f"expected a finite number > 0, got {rec.work!r}")


def _check_time(rec: RecordIn, now: datetime) -> None:
    t = rec.tuned_at  # UTC-aware: db.wire converted it, refusing what overflows
    if not ERA_START <= t <= now + CLOCK_SKEW:
        raise RecordRejected("tuned_at", f"{t.isoformat()} is outside {ERA_START.date()} .. now "
                                         f"(+{CLOCK_SKEW} of clock skew)")


def accepted(rec: RecordIn, *, now: datetime | None = None) -> RecordIn:
    """`rec` normalised as the store keeps it (db.wire's rules), once it passes the gate;
    RecordRejected names the first bad field otherwise."""
    try:
        rec = validated_record(rec)
    except InvalidRecord as e:
        field = e.field.removesuffix(".(entry)") if e.field != "(entry)" else "record"
        raise RecordRejected(field, str(e).split(": ", 1)[-1]) from None
    try:
        k = kernels.get_kernel(rec.kernel)
    except kernels.UnknownKernel as e:
        raise RecordRejected("kernel", str(e), status=404) from None
    _check_declaration(k, rec)
    _check_physics(k, rec)
    _check_time(rec, now or datetime.now(timezone.utc))
    return rec


def as_upload(rec: RecordIn, *, by: str | None, host: str | None) -> RecordIn:
    """`rec` marked as uploaded by a user's process: who (a token's name, else "anonymous") and
    from which host. An upload never outranks a worker's record (db.repos.records.rank)."""
    return dataclasses.replace(rec, origin=RecordOrigin.UPLOAD, uploaded_by=(by or "anonymous")[:200],
                               uploaded_from=host[:200] if host else None)


def import_check(rec: RecordIn) -> None:
    """The gate as `import_records`' entry check (ImportRejected naming the field)."""
    try:
        accepted(rec)
    except RecordRejected as e:
        raise ImportRejected(e.reason, field=e.field) from None


# Helion's cache entries (kernelsearch.helion). Helion's cache key is the sha256 of its key's repr.
HELION_KEY = re.compile(r"[0-9a-f]{64}")
HELION_MAX_DATA = 60_000  # characters: an entry is a few KB; the API's body limit is 64 KiB
HELION_KEY_FIELDS = ("specialization_key", "kernel_source_hash", "hardware", "runtime_name", "backend")
# Which check an entry's config passed. Helion's autotuner compares every candidate's outputs with
# its default config's (`autotune_accuracy_check`, on unless turned off); the backend reports the
# setting when it can see the autotuner, and an entry tuned with the check off is refused.
HELION_CHECKED = "helion-accuracy-check"
HELION_CHECK_UNREPORTED = "helion (check not reported)"
# A tensor in Helion's specialization key: `torch.float16, torch.Size([64, 128])`.
_HELION_TENSOR = re.compile(r"torch\.(\w+), torch\.Size\(\[([0-9, ]*)\]\)")


def helion_axes(specialization_key: str, arg_names: list[str] | None = None) -> dict[str, Any]:
    """The case of a Helion specialization key: each tensor's dtype (`x.dtype`, categorical as an
    undeclared kernel's) and sizes (`x.size0`, ... as Helion keys them: exact sizes under static
    shapes, Helion's buckets otherwise). Tensors are named by `arg_names` when it names each of
    them, else `t0`, `t1`, ... in order; {} when the key shows no tensor."""
    found = _HELION_TENSOR.findall(specialization_key)
    names = arg_names if arg_names is not None and len(arg_names) == len(found) else \
        [f"t{i}" for i in range(len(found))]
    axes: dict[str, Any] = {}
    for name, (dtype, sizes) in zip(names, found):
        axes[f"{name}{DTYPE_AXIS_SUFFIX}"] = dtype
        for j, size in enumerate(x for x in sizes.split(",") if x.strip()):
            axes[f"{name}.size{j}"] = int(size)
    return axes


def accepted_helion(cache_key: str, data: str, *, kernel: str | None = None,
                    arg_names: list[str] | None = None, checked: bool | None = None,
                    by: str | None = None, host: str | None = None) -> HelionEntryIn:
    """A Helion cache entry as the store keeps it, once its text is what Helion's local cache
    writes (a JSON object with `config` and `key.fields`); RecordRejected names the first bad
    field otherwise. `kernel` is the kernel's `module.qualname` when the caller knows it (the
    entry is then listed as `helion:<kernel>`), else it is named by its source hash."""
    if not isinstance(cache_key, str) or not HELION_KEY.fullmatch(cache_key):
        raise RecordRejected("key", "expected Helion's cache key, 64 lowercase hex digits")
    if not isinstance(data, str) or not data or len(data) > HELION_MAX_DATA or "\x00" in data:
        raise RecordRejected("data", f"expected Helion's cache entry text of 1..{HELION_MAX_DATA} characters, no NUL")
    if checked is False:
        raise RecordRejected("checked", "Helion tuned this config with its accuracy check off "
                                        "(autotune_accuracy_check=False): not shared")
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise RecordRejected("data", f"not JSON: {e}") from None
    fields = doc.get("key", {}).get("fields") if isinstance(doc, dict) and isinstance(doc.get("key"), dict) else None
    if not isinstance(fields, dict):
        raise RecordRejected("data.key.fields", "expected an object (Helion's cache key fields)")
    for name in HELION_KEY_FIELDS:
        v = fields.get(name)
        if not isinstance(v, str) or not v or len(v) > (20_000 if name == "specialization_key" else 200):
            raise RecordRejected(f"data.key.fields.{name}", "expected a non-empty string")
    try:
        config = json.loads(doc["config"]) if isinstance(doc.get("config"), str) else doc.get("config")
    except ValueError as e:
        raise RecordRejected("data.config", f"not JSON: {e}") from None
    if not isinstance(config, dict):
        raise RecordRejected("data.config", "expected Helion's config, a JSON object")
    if kernel is not None and (not isinstance(kernel, str) or not kernel or len(kernel) > 290):
        raise RecordRejected("kernel", "expected the kernel's module.qualname, 1..290 characters")
    if arg_names is not None and (not isinstance(arg_names, list)
                                  or not all(isinstance(n, str) and 0 < len(n) <= 100 for n in arg_names)):
        raise RecordRejected("arg_names", "expected a list of argument names")
    key_type = doc["key"].get("type")
    return HelionEntryIn(
        cache_key=cache_key,
        kernel=f"helion:{kernel}" if kernel else f"helion:src-{fields['kernel_source_hash'][:12]}",
        hardware=fields["hardware"], specialization_key=fields["specialization_key"],
        axes=helion_axes(fields["specialization_key"], arg_names), config=config, data=data,
        kernel_source_hash=fields["kernel_source_hash"], runtime_name=fields["runtime_name"],
        backend=fields["backend"], key_type=key_type if isinstance(key_type, str) else "",
        checked_by=HELION_CHECKED if checked else HELION_CHECK_UNREPORTED,
        uploaded_by=(by or "anonymous")[:200], uploaded_from=host[:200] if host else None)


__all__ = ["RecordRejected", "accepted", "as_upload", "import_check", "accepted_helion", "helion_axes"]
