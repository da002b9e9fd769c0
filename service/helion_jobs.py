"""Helion tuning jobs: a Helion cache miss (`kernelsearch.helion` under KS_HELION_ON_MISS=default)
queues a job carrying a capture of the call, and a worker tunes it.

The job's capture (`ks_jobs.capture`, `kind: "helion"`) names the kernel by its importable
module and qualified name and holds the call's arguments (kernels.capture: shapes, strides,
dtypes, small integer contents, scalars), the Helion settings that steer its search, and
Helion's cache key with its fields. The worker checks the module is one its operator trusts
and the arguments within its bounds (service.job_policy), then, in a disposable child process
(service.job_child), imports the module, rebuilds the arguments and runs the kernel's own
autotuner (its `autotuner_fn`, the captured settings applied); it stores the entry Helion would
have written under the key, through the acceptance gate, under the job's lease. A worker whose Helion computes another key (other hardware, versions or code) fails the
job naming both keys instead of storing a config under a key it did not tune.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelsearch.db.statuses import HELION_CAPTURE
from kernelsearch.kernels.capture import (MAX_CAPTURE_BYTES, ArgCapture, Capture, CaptureError,
                                          KernelModuleUnavailable, args_from_json, import_object,
                                          rebuild)
from kernelsearch.search_space.acceptance import HELION_KEY, HELION_KEY_FIELDS, helion_axes

if TYPE_CHECKING:
    from kernelsearch.kernels.capture import CaptureBounds

    from .settings import Settings

log = logging.getLogger(__name__)

KIND = HELION_CAPTURE  # the capture's kind: what makes a job a JobKind.HELION job
VERSION = 1
SAMPLER = "helion"  # the job's sampler column: Helion's own search runs, not Optuna's
JOB_KERNEL_PREFIX = "helion:"
MAX_KERNEL_NAME = 100  # ks_kernels.name
# Helion settings that steer the search or enter its cache key, captured with the call so the
# worker searches as the user's process would have (others are the host's, or the kernel's own
# decorator's, which the worker imports with the module).
SETTINGS = ("autotune_effort", "autotune_accuracy_check", "autotune_best_of_k", "autotune_search_acf",
            "autotune_max_generations", "autotune_budget_seconds", "autotune_config_overrides",
            "autotune_ignore_errors", "autotune_rebenchmark_threshold", "autotune_cache")
# The worker computes the key and writes the entry itself: the remote caches' local halves key
# alike and need no backend there.
LOCAL_CACHE = {"RemoteAutotuneCache": "LocalAutotuneCache",
               "StrictRemoteAutotuneCache": "StrictLocalAutotuneCache"}
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,19}")


class HelionJobError(Exception):
    """A Helion job that cannot run on this worker; the message is the job's error."""


class HelionJobCrashed(HelionJobError):
    """The job's code ended its child process (or raised what is not an Exception)."""


# -- the job's capture ------------------------------------------------------------------------------
@dataclass(frozen=True)
class HelionJob:
    """A Helion job's capture, checked."""

    key: str
    module: str
    qualname: str
    args: tuple[ArgCapture, ...]
    device: str
    settings: dict[str, Any]
    key_type: str
    key_fields: dict[str, str]
    checked: bool | None = None

    @property
    def kernel(self) -> str:
        """The Helion kernel's `module.qualname`, as its entries name it."""
        return f"{self.module}.{self.qualname}"

    @property
    def job_kernel(self) -> str:
        """The job's kernel name (`helion:module.qualname`), as /jobs lists it."""
        return f"{JOB_KERNEL_PREFIX}{self.kernel}"

    @property
    def arg_names(self) -> list[str]:
        return [a.name for a in self.args if a.kind == "tensor"]

    def case(self) -> dict[str, Any]:
        """The job's one case: the call's tensors as Helion's specialization key shows them, and
        the key itself (one active job per key: identical submits are the same job)."""
        return {**helion_axes(self.key_fields["specialization_key"], self.arg_names), "helion_key": self.key}

    def as_json(self) -> dict[str, Any]:
        return {"kind": KIND, "version": VERSION, "key": self.key, "module": self.module,
                "qualname": self.qualname, "args": [a.as_json() for a in self.args],
                "device": self.device, "settings": dict(self.settings), "key_type": self.key_type,
                "key_fields": dict(self.key_fields), "checked": self.checked}


def parse_job(doc: Any) -> HelionJob:
    """A Helion job's capture, checked; ValueError names the first bad field."""
    if not isinstance(doc, Mapping):
        raise ValueError("capture: expected an object")
    if doc.get("kind") != KIND:
        raise ValueError(f"capture.kind: expected {KIND!r}, got {doc.get('kind')!r}")
    if doc.get("version") != VERSION:
        raise ValueError(f"capture.version: expected {VERSION}, got {doc.get('version')!r}")
    if len(json.dumps(doc, default=str)) > MAX_CAPTURE_BYTES:
        raise ValueError(f"capture: more than {MAX_CAPTURE_BYTES} bytes")
    key = doc.get("key")
    if not isinstance(key, str) or not HELION_KEY.fullmatch(key):
        raise ValueError("capture.key: expected Helion's cache key, 64 lowercase hex digits")
    for name in ("module", "qualname"):
        v = doc.get(name)
        if not isinstance(v, str) or len(v) > 300 or not _DOTTED.fullmatch(v):
            raise ValueError(f"capture.{name}: expected a dotted Python name, got {v!r}")
    name_len = len(JOB_KERNEL_PREFIX) + len(doc["module"]) + 1 + len(doc["qualname"])
    if name_len > MAX_KERNEL_NAME:
        raise ValueError(f"capture.module: helion:module.qualname is {name_len} characters, "
                         f"a job's kernel name holds {MAX_KERNEL_NAME}")
    try:
        args = args_from_json(doc.get("args"))
    except CaptureError as exc:
        raise ValueError(str(exc)) from None
    device = doc.get("device")
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ValueError(f"capture.device: expected a torch device type such as 'cuda', got {device!r}")
    settings = doc.get("settings", {})
    if not isinstance(settings, Mapping):
        raise ValueError("capture.settings: expected an object of Helion settings")
    for k, v in settings.items():
        if k not in SETTINGS:
            raise ValueError(f"capture.settings.{k}: not a setting a job carries ({', '.join(SETTINGS)})")
        if not isinstance(v, (str, int, float, bool, list, dict)) and v is not None:
            raise ValueError(f"capture.settings.{k}: expected a JSON value")
    key_type = doc.get("key_type")
    if not isinstance(key_type, str) or not key_type or len(key_type) > 64:
        raise ValueError("capture.key_type: expected the name of Helion's cache key class")
    fields = doc.get("key_fields")
    if not isinstance(fields, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in fields.items()):
        raise ValueError("capture.key_fields: expected Helion's key fields, names to strings")
    for name in HELION_KEY_FIELDS:
        if not fields.get(name):
            raise ValueError(f"capture.key_fields.{name}: expected a non-empty string")
    checked = doc.get("checked")
    if checked is not None and not isinstance(checked, bool):
        raise ValueError("capture.checked: expected true, false or null")
    return HelionJob(key=key, module=doc["module"], qualname=doc["qualname"], args=args,
                     device=device, settings=dict(settings), key_type=key_type,
                     key_fields=dict(fields), checked=checked)


def check_job(job: HelionJob, settings: "Settings", bounds: "CaptureBounds | None" = None) -> str | None:
    """Why a worker must not run this job (None: it may): a module its operator does not trust,
    arguments beyond `bounds` (default: the API's). The API refuses such a submit with this
    message, and a worker fails such a job with it."""
    from .job_policy import module_refusal, submit_bounds

    refused = module_refusal(job.module, settings)
    if refused is not None:
        return f"capture.module: {refused}"
    try:
        Capture(args=job.args, grids=()).check_bounds(bounds or submit_bounds(settings))
    except CaptureError as exc:
        return str(exc)
    return None


# -- the worker's side ------------------------------------------------------------------------------
_TUNING = 0
_TUNING_LOCK = threading.Lock()
# The kernel's Settings are the module's object: one Helion job at a time per process sets them.
_JOB_LOCK = threading.Lock()


def tuning_here() -> bool:
    """Whether this process is tuning a Helion job now: its backend then never queues a job."""
    return _TUNING > 0


@contextlib.contextmanager
def _tuning() -> Iterator[None]:
    global _TUNING
    with _TUNING_LOCK:
        _TUNING += 1
    try:
        yield
    finally:
        with _TUNING_LOCK:
            _TUNING -= 1


@dataclass(frozen=True)
class TunedEntry:
    """What a worker tuned for a job: the entry text Helion writes for its key, and its config."""

    key: str
    data: str
    config: dict[str, Any]
    checked: bool | None
    hardware: str
    # The compile groups of the config as the child compiled it (kernels.compiled.compiled_ref),
    # stored beside the entry; none under the interpreter.
    compiled: list[dict[str, Any]] = field(default_factory=list)


def import_kernel(job: HelionJob) -> Any:
    """The `helion.kernel` object the job names; KernelModuleUnavailable when the module cannot
    be imported here or does not hold a Helion kernel by that name."""
    import helion

    obj = import_object(job.module, job.qualname)
    if not isinstance(obj, helion.Kernel):
        raise KernelModuleUnavailable(job.module, f"its {job.qualname} is a {type(obj).__name__}, "
                                      f"not a @helion.kernel")
    return obj


def tune(job: HelionJob, worker: str, *, stop: Callable[[], bool] | None = None,
         limit_s: float | None = None) -> TunedEntry:
    """`tune_here` in a disposable child process (service.job_child): whatever the job's code
    does ends that child, never this worker. HelionJobError (Helion missing, another key, no
    Helion cache; HelionJobCrashed when the code ended the child), KernelModuleUnavailable, or
    JobChildStopped once `stop()` is true or `limit_s` passed (the child killed)."""
    from .job_child import JobChildFailed, run_in_child

    _helion_here(worker)
    try:
        got = run_in_child(_tune_in_child, job.as_json(), worker, stop=stop, limit_s=limit_s)
    except JobChildFailed as exc:
        raise HelionJobCrashed(f"the job's child process {exc} (module {job.module!r}, run in "
                               f"the child; worker {worker} lives on)") from None
    if "entry" in got:
        return TunedEntry(**got["entry"])
    if got.get("unavailable"):
        raise KernelModuleUnavailable(job.module, got["unavailable"])
    if got.get("autotune"):
        raise HelionJobError(f"Helion's autotune failed: {got['autotune']}")
    raise HelionJobError(got["error"])


def _helion_here(worker: str) -> None:
    try:
        import helion.autotuner.local_cache  # noqa: F401 - Helion's own, not the job's code
    except ImportError as exc:
        raise HelionJobError(f"Helion is not installed on worker {worker} ({exc}); install "
                             f"kernelsearch[helion] there, with the user's Helion version") from None


def _tune_in_child(doc: dict[str, Any], worker: str) -> dict[str, Any]:
    """The child's side of `tune`: its outcome as data."""
    try:
        return {"entry": asdict(tune_here(parse_job(doc), worker))}
    except KernelModuleUnavailable as exc:
        return {"unavailable": exc.why}
    except HelionJobError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - Helion's search failing fails the job
        return {"autotune": f"{type(exc).__name__}: {exc}"}


def tune_here(job: HelionJob, worker: str) -> TunedEntry:
    """Tune the job's call as Helion would have in the user's process, and the entry text its
    local cache writes; HelionJobError (Helion missing, another key, no Helion cache) or
    KernelModuleUnavailable when it cannot. Runs the job's code: call it in a child only."""
    _helion_here(worker)
    import torch
    from helion.autotuner.local_cache import LocalAutotuneCache

    kernel = import_kernel(job)
    if job.device == "cuda" and not torch.cuda.is_available():
        raise HelionJobError(f"the call ran on cuda; worker {worker} has no CUDA device")
    named = rebuild(Capture(args=job.args, grids=()), torch.device(job.device))
    args = tuple(named[a.name] for a in job.args)
    with _JOB_LOCK, _tuning():
        bound = kernel.bind(args)
        settings = bound.settings
        saved = {k: getattr(settings, k) for k in job.settings if hasattr(settings, k)}
        try:
            for k, v in job.settings.items():
                if hasattr(settings, k):
                    setattr(settings, k, LOCAL_CACHE.get(v, v) if k == "autotune_cache" else v)
            cache = settings.autotuner_fn(bound, args)
            if not isinstance(cache, LocalAutotuneCache):
                raise HelionJobError(f"{job.kernel}'s autotuner_fn gives a {type(cache).__name__}, not "
                                     f"one of Helion's autotune caches: no cache key to tune for")
            key = cache.key.stable_hash()
            if key != job.key:
                here = {k: str(v) for k, v in vars(cache.key).items()}
                differ = sorted(k for k in set(here) | set(job.key_fields)
                                if here.get(k) != job.key_fields.get(k))
                raise HelionJobError(
                    f"Helion cache key mismatch: the job is for key {job.key}, worker {worker} "
                    f"computes {key} for the same call (fields that differ: {', '.join(differ) or 'none shown'}); "
                    f"tune it on a worker with the caller's hardware and Helion, PyTorch and Triton versions")
            config = cache._run_autotune_trials()
            with tempfile.TemporaryDirectory(prefix="ks-helion-") as tmp:
                path = Path(tmp) / f"{key}.best_config"
                cache._get_local_cache_path = lambda: path  # Helion's own writer, into our file
                LocalAutotuneCache.put(cache, config)
                data = path.read_text()
            checked = getattr(settings, "autotune_accuracy_check", None)
            return TunedEntry(key=key, data=data, config=json.loads(config.to_json()),
                              checked=checked if isinstance(checked, bool) else None,
                              hardware=str(cache.key.hardware),
                              compiled=_compiled_of(bound, config, args))
        finally:
            for k, v in saved.items():
                setattr(settings, k, v)


def _compiled_of(bound: Any, config: Any, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The tuned config run once on the call, as a served host will run it: the compile groups
    of the Triton kernels Helion generated for it, to store beside the entry. None under the
    interpreter; a failure here costs the artifacts only (hosts compile as before)."""
    from kernelsearch.kernels.compiled import compiled_ref, helion_handles

    try:
        bound.set_config(config)
        bound(*args)
        return [ref for ref in map(compiled_ref, helion_handles(bound)) if ref is not None]
    except Exception as exc:  # noqa: BLE001 - the entry stands without its compiled kernel
        log.warning("%s: the tuned config's compiled kernel is not stored: %s: %s",
                    bound.kernel.name, type(exc).__name__, exc)
        return []


__all__ = ["HelionJob", "HelionJobCrashed", "HelionJobError", "KIND", "SAMPLER", "SETTINGS",
           "TunedEntry", "check_job", "parse_job", "tune", "tune_here",
           "tuning_here"]
