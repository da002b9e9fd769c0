"""The one acceptance gate for a record: every way a record reaches the store passes here first
(the upload route, `kernelsearch records import`, the tuner, `@kernelsearch.autotune` sharing).

It lives in search_space because it needs the kernel's declaration (`KernelDef`), which the db
layer must not import; the service and the tuner both sit above it. What it passes comes out as
`db.views.Accepted`, the only type the store's writing methods take; this module alone holds the
token that makes one (db cannot call the gate, so the gate hands the store its proof). The store
still applies the wire format's type and width rules (db.wire) to what it is given.

A record is refused with `RecordRejected`, naming the field, when it does not match its kernel's
declaration (known kernel, exactly its axes, a complete config the kernel accepts, launch options
in range) or breaks a physical bound (a latency faster than the device's memory allows, an error
above the kernel's tolerance, an unbounded derived figure, a time outside the project's era).
Checks the declaration cannot answer (a kernel without `bytes_moved`, a device of unknown
bandwidth) are skipped, never turned into a refusal; the floors every kernel has (a nanosecond
on any clock, a kernel launch on a GPU) always apply. An upload (a user's process, not a worker)
is held to the device's real peak bandwidth, a worker's measurement to ten times it (caches).

Helion's autotune cache entries (`kernelsearch.helion`) are not records (no latency, error or
versions; Helion's own config) and pass their own gate here, `accepted_helion`: Helion's entry
shape, under the key Helion computes from the entry's own key fields, in JSON both databases
store alike, and the check the config passed (Helion's accuracy check against its default
config) recorded as the entry's `checked_by`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from kernelsearch import kernels
from kernelsearch.db.errors import ImportRejected
from kernelsearch.db.portable import MAX_DEPTH, dotted, first_unportable
from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.db.views import _GATE_TOKEN, Accepted, HelionEntryIn, RecordIn
from kernelsearch.db.wire import InvalidRecord, validated_record
from kernelsearch.kernels.configs import canonical_key
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.kernels.errors import InvalidConfig
from kernelsearch.kernels.spec import LAUNCH_OPTIONS, KernelDef, in_choices
from kernelsearch.kernels.undeclared import DTYPE_AXIS_SUFFIX, UndeclaredKernel

# Bytes per second no device moves: 1000 TB/s, some 200 times an H200's HBM and well above any
# on-chip cache. Applies on every device, known or not (an interpreter's too).
MAX_BYTES_PER_S = 1e15
# Peak memory bandwidth (bytes/s) from the vendors' datasheets (family names bound the family's
# other models, `peak_bandwidth`). A worker's record must not claim to move its case's bytes
# faster than PEAK_MARGIN times this: the margin covers caches (a small case may sit in L2) and
# datasheet rounding. A device unlike any listed has only MAX_BYTES_PER_S.
PEAK_MEMORY_BANDWIDTH = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA GH200": 4.9e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA H100": 3.35e12,
    "NVIDIA A100-SXM4-80GB": 2.039e12,
    "NVIDIA A100-SXM4-40GB": 1.555e12,
    "NVIDIA A100": 2.039e12,
    "NVIDIA B200": 8e12,
}
PEAK_MARGIN = 10.0
# An upload's bound: the peak itself, with room for datasheet rounding only. Users' processes time
# with Triton's do_bench, which clears L2 first; the workers' records reach 93 % of a copy.
UPLOAD_PEAK_MARGIN = 1.2
# A name within this many letters of a known device's (case, spacing and punctuation aside) is
# bounded as that device: "nvidia h200x" or "NVIDIA  H200 " do not escape the H200's peak.
LOOKALIKE_EDITS = 2
# The shortest a kernel on a GPU takes from launch to end (an empty kernel times 0.51 us on the
# H200 under the workers' protocol, docs/perf-notes.md): half of that is no kernel's time. The
# interpreter's wall clock has no such floor; no clock times anything under a nanosecond.
GPU_LAUNCH_FLOOR_US = 0.25
MIN_LATENCY_US = 1e-3
# The winner's timing in config_timings is the record's median, to this relative tolerance.
TIMING_RTOL = 0.01
# A record's `work` is its kernel's (KernelDef.work), to this relative tolerance (JSON round trips).
WORK_RTOL = 1e-9
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


def _work(k: KernelDef, axes: dict[str, Any]) -> float | None:
    """The case's `work` as the kernel defines it (search_space.records.measured_record stores
    it), or None where its declaration cannot say: the check is then skipped."""
    try:
        w = float(k.work(axes))
    except Exception:  # noqa: BLE001 - a user's declaration may raise anything
        return None
    return w if math.isfinite(w) and w > 0 else None


def _tolerance(k: KernelDef, axes: dict[str, Any]) -> float | None:
    """The kernel's rtol for the case, or None where its declaration cannot say (no rtol, or a
    tolerance hook that fails): the error bound is then skipped."""
    try:
        rtol = float(k.rtol_for(axes))
    except Exception:  # noqa: BLE001 - a user's declaration may raise anything
        return None
    return rtol if math.isfinite(rtol) and rtol >= 0 else None


def device_class(name: str) -> str:
    """A device name reduced to what tells devices apart: compatibility-normalised, case-folded,
    ASCII letters and digits only ("NVIDIA  H200 " and "nvidia-h200" are one class)."""
    return re.sub(r"[^0-9a-z]", "", unicodedata.normalize("NFKC", name).casefold())


_PEAK_BY_CLASS = {device_class(n): bw for n, bw in PEAK_MEMORY_BANDWIDTH.items()}


def _edits(a: str, b: str, most: int) -> int:
    """Levenshtein distance of a and b, or most + 1 once it is known to be larger."""
    if abs(len(a) - len(b)) > most:
        return most + 1
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        if min(row) > most:
            return most + 1
    return row[-1]


def peak_bandwidth(device: str) -> float | None:
    """The peak memory bandwidth (bytes/s) a record on `device` is bounded by: a known device's,
    whatever its spelling; for a name that extends known ones ("NVIDIA H200 NVL"), the longest's;
    else for a name within LOOKALIKE_EDITS letters of known ones ("NVIDIA H800"), the nearest's,
    the highest of equally near ones; None for a device unlike any known."""
    c = device_class(device)
    if c in _PEAK_BY_CLASS:
        return _PEAK_BY_CLASS[c]
    near = [(0 if c.startswith(k) else _edits(c, k, LOOKALIKE_EDITS), -len(k), -bw)
            for k, bw in _PEAK_BY_CLASS.items()]
    edits, _, bw = min(near)  # the nearest; of equally near ones, the highest peak
    return -bw if edits <= LOOKALIKE_EDITS else None


def _latency_floor(k: KernelDef, rec: RecordIn) -> tuple[float, str]:
    """The least time (us) the record's case can take on its device, and why: its bytes at the
    device's bandwidth bound (an upload's is the peak itself) plus a kernel launch on a GPU;
    a launch alone where the kernel cannot say its bytes (an undeclared kernel); a nanosecond
    at least."""
    launch = 0.0 if rec.device == INTERPRETER_DEVICE else GPU_LAUNCH_FLOOR_US
    floor, why = max(MIN_LATENCY_US, launch), (
        f"a kernel launch on a GPU ({GPU_LAUNCH_FLOOR_US:g} us)" if launch
        else f"any clock's resolution ({MIN_LATENCY_US:g} us)")
    moved = _bytes_moved(k, rec.axes)
    if moved is None:
        return floor, why
    peak = peak_bandwidth(rec.device)
    margin = UPLOAD_PEAK_MARGIN if rec.origin == RecordOrigin.UPLOAD else PEAK_MARGIN
    limit = min(MAX_BYTES_PER_S, peak * margin) if peak else MAX_BYTES_PER_S
    whose = f"{margin:g} x {rec.device}'s peak" if peak else "any device's"
    return max(MIN_LATENCY_US, launch + moved / limit * 1e6), (
        f"the {moved:.0f} bytes this case moves at {whose} {limit / 1e12:.3g} TB/s"
        + (f" plus a launch ({launch:g} us)" if launch else ""))


def _check_timings(k: KernelDef, rec: RecordIn, floor: float, why: str) -> None:
    """Per-config timings: each keyed by a config the kernel has (an undeclared kernel's: its
    definition's), each a failure (None) or a time past the floor, and the record's config the
    fastest of them at the record's own median."""
    timings = rec.config_timings
    if not timings:
        return
    if not isinstance(timings, Mapping):
        raise RecordRejected("config_timings", "expected an object {config key: median us}")
    # An undeclared kernel's record may time the configs its call's pruner made besides the list.
    known = ({canonical_key(c) for c in (*k.space, *k.definition.pruned)}
             if isinstance(k, UndeclaredKernel) else None)
    for key, t in timings.items():
        field = f"config_timings.{key[:80]}"
        if known is not None and key not in known:
            raise RecordRejected(field, f"not a config of {k.name}'s definition")
        if known is None:
            try:
                parsed = json.loads(key)
                ok = isinstance(parsed, dict) and canonical_key(k.validate_config(parsed)) == key
            except (ValueError, InvalidConfig):
                ok = False
            if not ok:
                raise RecordRejected(field, f"not the canonical key of a config of {k.name}")
        if t is None:
            continue
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < floor:
            raise RecordRejected(field, f"{t!r} us is no timing: a finite time of at least "
                                        f"{floor:.3g} us ({why}), or null for a failed config")
    mine = timings.get(canonical_key(rec.config))
    if mine is None:
        raise RecordRejected("config_timings", "the record's config has no timing among them")
    fastest = min(t for t in timings.values() if t is not None)
    if fastest < mine:
        raise RecordRejected("config", f"the record's config took {mine:g} us, and a config of "
                                       f"its own timings {fastest:g} us: not the winner")
    if abs(mine - rec.latency_median_us) > TIMING_RTOL * mine:
        raise RecordRejected("latency_median_us", f"{rec.latency_median_us:g} us is not the "
                                                  f"config's own timing ({mine:g} us)")


def _check_physics(k: KernelDef, rec: RecordIn) -> None:
    # Positive, finite and ordered latencies are db.wire's rules, applied before.
    floor, why = _latency_floor(k, rec)
    if rec.latency_min_us < floor:
        raise RecordRejected("latency_min_us", f"{rec.latency_min_us:g} us is below {floor:.3g} us, "
                                               f"{why}: not a measurement")
    _check_timings(k, rec, floor, why)
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
    want = _work(k, rec.axes)
    if want is not None and not math.isclose(rec.work, want, rel_tol=WORK_RTOL):
        raise RecordRejected("work", f"{rec.work:g} is not the kernel's size of this case ({want:g}, "
                                     f"KernelDef.work: what \"nearest\" ranks cases by)")


def _check_time(rec: RecordIn, now: datetime) -> None:
    t = rec.tuned_at  # UTC-aware: db.wire converted it, refusing what overflows
    if not ERA_START <= t <= now + CLOCK_SKEW:
        raise RecordRejected("tuned_at", f"{t.isoformat()} is outside {ERA_START.date()} .. now "
                                         f"(+{CLOCK_SKEW} of clock skew)")


def accepted(rec: RecordIn, *, now: datetime | None = None) -> Accepted[RecordIn]:
    """`rec` normalised as the store keeps it (db.wire's rules), once it passes the gate, as the
    one type the store writes (`db.views.Accepted`, which only this module makes); RecordRejected
    names the first bad field otherwise."""
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
    return Accepted(rec, _GATE_TOKEN)


def as_upload(rec: RecordIn, *, by: str | None, host: str | None) -> RecordIn:
    """`rec` marked as uploaded by a user's process: who (a token's name, else "anonymous") and
    from which host. An upload never outranks a worker's record (db.repos.records.rank)."""
    return dataclasses.replace(rec, origin=RecordOrigin.UPLOAD, uploaded_by=(by or "anonymous")[:200],
                               uploaded_from=host[:200] if host else None)


def import_check(rec: RecordIn) -> Accepted[RecordIn]:
    """The gate as `import_records`' entry check (ImportRejected naming the field)."""
    try:
        return accepted(rec)
    except RecordRejected as e:
        raise ImportRejected(e.reason, field=e.field) from None


# Helion's cache entries (kernelsearch.helion).
HELION_KEY = re.compile(r"[0-9a-f]{64}")
HELION_MAX_DATA = 60_000  # characters: an entry is a few KB; the API's body limit is 64 KiB
# Helion 1.4's cache keys (helion.autotuner.base_cache): the cache key is the sha256 of the key
# object's repr, and an entry's `key.fields` is str() of each of the key's fields (LocalAutotuneCache
# .put). Per key type, its repr's fields in the dataclass's order. The two tuple fields' str() is
# their repr; every other one is a str, which the repr quotes, but best_of_k, an int which
# LooseAutotuneCacheKey's own repr shows only when it is not 1 and StrictAutotuneCacheKey's
# dataclass-made repr never shows (both keep it among the fields).
_LOOSE_KEY = ("specialization_key", "extra_results", "kernel_source_hash", "hardware",
              "runtime_name", "backend", "config_spec_hash", "extra_cache_key")
HELION_KEY_TYPES: dict[str, tuple[str, ...]] = {
    "LooseAutotuneCacheKey": _LOOSE_KEY,
    "StrictAutotuneCacheKey": _LOOSE_KEY + ("helion_key", "torch_key", "triton_key"),
}
_HELION_TUPLES = ("specialization_key", "extra_results")
_HELION_BEST_OF_K = "best_of_k"
HELION_KEY_FIELDS = ("specialization_key", "kernel_source_hash", "hardware", "runtime_name", "backend")
# Longest text of a field (the store's column widths; 200 for the others).
_HELION_WIDTHS = {"specialization_key": 20_000, "extra_results": 20_000, "kernel_source_hash": 128,
                  "backend": 64}
# Which check an entry's config passed. Helion's autotuner compares every candidate's outputs with
# its default config's (`autotune_accuracy_check`, on unless turned off); the backend reports the
# setting when it can see the autotuner, and an entry tuned with the check off is refused.
HELION_CHECKED = "helion-accuracy-check"
HELION_CHECK_UNREPORTED = "helion (check not reported)"
# A tensor in Helion's specialization key: `torch.float16, torch.Size([64, 128])`.
_HELION_TENSOR = re.compile(r"torch\.(\w+), torch\.Size\(\[([0-9, ]*)\]\)")
_MAX_SIZE_DIGITS = 18


def helion_axes(specialization_key: str, arg_names: list[str] | None = None) -> dict[str, Any]:
    """The case of a Helion specialization key: each tensor's dtype (`x.dtype`, categorical as an
    undeclared kernel's) and sizes (`x.size0`, ... as Helion keys them: exact sizes under static
    shapes, Helion's buckets otherwise). Tensors are named by `arg_names` when it names each of
    them, else `t0`, `t1`, ... in order; {} when the key shows no tensor. A size past 18 digits
    is no tensor's and is left out."""
    found = _HELION_TENSOR.findall(specialization_key)
    names = arg_names if arg_names is not None and len(arg_names) == len(found) else \
        [f"t{i}" for i in range(len(found))]
    axes: dict[str, Any] = {}
    for name, (dtype, sizes) in zip(names, found):
        axes[f"{name}{DTYPE_AXIS_SUFFIX}"] = dtype
        for j, size in enumerate(x.strip() for x in sizes.split(",") if x.strip()):
            if len(size) <= _MAX_SIZE_DIGITS:
                axes[f"{name}.size{j}"] = int(size)
    return axes


def _helion_json(text: str, field: str) -> Any:
    """Helion's JSON text read as both databases would store it: RecordRejected naming the field
    for text that is not JSON, nests past db.portable.MAX_DEPTH, or holds NaN, Infinity, NUL or
    a lone surrogate (SQLite keeps those, PostgreSQL refuses them)."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise RecordRejected(field, f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise RecordRejected(field, f"not JSON: {e}") from None
    problem = first_unportable(doc, (field,), max_depth=MAX_DEPTH)
    if problem:
        loc, why = problem
        raise RecordRejected(dotted(loc), why)
    return doc


def helion_cache_key(key_type: Any, fields: Any) -> str:
    """Helion's cache key of an entry's own key (`key.type` and `key.fields` of its text),
    computed as Helion computes it; RecordRejected naming the field when the key is not one
    Helion 1.4 writes."""
    if key_type not in HELION_KEY_TYPES:
        raise RecordRejected("data.key.type", f"expected one of {sorted(HELION_KEY_TYPES)} (Helion's "
                                              f"autotune cache keys), got {str(key_type)[:80]!r}")
    if not isinstance(fields, dict):
        raise RecordRejected("data.key.fields", "expected an object (Helion's cache key fields)")
    shown = HELION_KEY_TYPES[key_type]
    want = set(shown) | {_HELION_BEST_OF_K}
    if set(fields) != want:
        odd = sorted(set(fields) ^ want)
        raise RecordRejected("data.key.fields", f"{key_type} has exactly the fields {sorted(want)}; "
                                                f"not so: {[str(n)[:80] for n in odd]}")
    for name in sorted(want):
        v = fields[name]
        width = _HELION_WIDTHS.get(name, 200)
        if not isinstance(v, str) or len(v) > width:
            raise RecordRejected(f"data.key.fields.{name}", f"expected a string of at most {width} characters")
        if name in HELION_KEY_FIELDS and not v:
            raise RecordRejected(f"data.key.fields.{name}", "expected a non-empty string")
        if name in _HELION_TUPLES and not (v.startswith("(") and v.endswith(")")):
            raise RecordRejected(f"data.key.fields.{name}", "expected a tuple as Helion writes it")
    best_of_k = fields[_HELION_BEST_OF_K]
    if not re.fullmatch(r"[1-9][0-9]{0,8}", best_of_k):
        raise RecordRejected(f"data.key.fields.{_HELION_BEST_OF_K}", "expected a positive integer")
    parts = [f"{n}={fields[n] if n in _HELION_TUPLES else repr(fields[n])}" for n in shown]
    if key_type == "LooseAutotuneCacheKey" and best_of_k != "1":
        parts.append(f"{_HELION_BEST_OF_K}={best_of_k}")
    return hashlib.sha256(f"{key_type}({', '.join(parts)})".encode("utf-8")).hexdigest()


def helion_entry_key(data: str) -> str:
    """The cache key Helion stores an entry's text under, from the text's own key; RecordRejected
    naming the field when the text is not an entry Helion writes."""
    doc = _helion_json(data, "data")
    key = doc.get("key") if isinstance(doc, dict) else None
    if not isinstance(key, dict):
        raise RecordRejected("data.key", "expected an object (Helion's cache key: type and fields)")
    return helion_cache_key(key.get("type"), key.get("fields"))


def accepted_helion(cache_key: str, data: str, *, kernel: str | None = None,
                    arg_names: list[str] | None = None, checked: bool | None = None,
                    by: str | None = None, host: str | None = None,
                    origin: RecordOrigin = RecordOrigin.UPLOAD) -> Accepted[HelionEntryIn]:
    """A Helion cache entry as the store keeps it, once its text is what Helion's local cache
    writes (a JSON object with `config` and `key`) and `cache_key` is the hash of that key, as
    Helion computes it (an entry under any other key is one Helion never asks for, or a forgery);
    RecordRejected names the first bad field otherwise. `kernel` is the kernel's
    `module.qualname` when the caller knows it (the entry is then listed as `helion:<kernel>`),
    else it is named by its source hash. `origin`: a worker's tuning or an upload (a worker's
    entry is never replaced by an upload, db.repos.helion)."""
    if not isinstance(cache_key, str) or not HELION_KEY.fullmatch(cache_key):
        raise RecordRejected("key", "expected Helion's cache key, 64 lowercase hex digits")
    if not isinstance(data, str) or not data or len(data) > HELION_MAX_DATA or "\x00" in data:
        raise RecordRejected("data", f"expected Helion's cache entry text of 1..{HELION_MAX_DATA} characters, no NUL")
    if checked is False:
        raise RecordRejected("checked", "Helion tuned this config with its accuracy check off "
                                        "(autotune_accuracy_check=False): not shared")
    computed = helion_entry_key(data)
    doc = json.loads(data)  # read above: JSON, portable, an object with a key
    fields = doc["key"]["fields"]
    if computed != cache_key:
        raise RecordRejected("key", f"{cache_key} is not the hash of the entry's own key fields "
                                    f"({computed}, as Helion computes it)")
    raw = doc.get("config")
    config = _helion_json(raw, "data.config") if isinstance(raw, str) else raw
    if not isinstance(config, dict):
        raise RecordRejected("data.config", "expected Helion's config, a JSON object")
    if kernel is not None and (not isinstance(kernel, str) or not kernel or len(kernel) > 290):
        raise RecordRejected("kernel", "expected the kernel's module.qualname, 1..290 characters")
    if arg_names is not None and (not isinstance(arg_names, list)
                                  or not all(isinstance(n, str) and 0 < len(n) <= 100 for n in arg_names)):
        raise RecordRejected("arg_names", "expected a list of argument names")
    for name, v in (("kernel", kernel), *((f"arg_names[{i}]", n) for i, n in enumerate(arg_names or ()))):
        problem = first_unportable(v, (name,))
        if problem:
            raise RecordRejected(name, problem[1])
    return Accepted(HelionEntryIn(
        cache_key=cache_key,
        kernel=f"helion:{kernel}" if kernel else f"helion:src-{fields['kernel_source_hash'][:12]}",
        hardware=fields["hardware"], specialization_key=fields["specialization_key"],
        axes=helion_axes(fields["specialization_key"], arg_names), config=config, data=data,
        kernel_source_hash=fields["kernel_source_hash"], runtime_name=fields["runtime_name"],
        backend=fields["backend"], key_type=doc["key"]["type"],
        checked_by=HELION_CHECKED if checked else HELION_CHECK_UNREPORTED,
        origin=RecordOrigin(origin).value,
        uploaded_by=(by or "anonymous")[:200], uploaded_from=host[:200] if host else None),
        _GATE_TOKEN)


__all__ = ["RecordRejected", "accepted", "as_upload", "import_check", "accepted_helion", "helion_axes",
           "helion_cache_key", "helion_entry_key", "peak_bandwidth", "device_class"]
