"""A Helion tuning job's document: what a Helion cache miss (`kernelsearch.helion` under
KS_HELION_ON_MISS=default) queues, carrying a capture of the call, and what the API and a worker
check before the worker tunes it (service/helion_jobs.py). Below the server and the client alike,
so the user's process writes the document the routes read from one definition.

The job's capture (`ks_jobs.capture`, `kind: "helion"`) names the kernel by its importable
module and qualified name and holds the call's arguments (kernels.capture: shapes, strides,
dtypes, small integer contents, scalars), the Helion settings that steer its search, and
Helion's cache key with its fields.
"""
from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelsearch.db.statuses import HELION_CAPTURE
from kernelsearch.kernels.capture import (MAX_CAPTURE_BYTES, ArgCapture, Capture, CaptureError,
                                          args_from_json)

from .acceptance import HELION_KEY, HELION_KEY_FIELDS, helion_axes
from .job_policy import SubmitLimits, module_refusal, submit_bounds

if TYPE_CHECKING:
    from kernelsearch.kernels.capture import CaptureBounds

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
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_DEVICE = re.compile(r"[a-z][a-z0-9_]{0,19}")


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


def check_job(job: HelionJob, settings: SubmitLimits,
              bounds: CaptureBounds | None = None) -> str | None:
    """Why a worker must not run this job (None: it may): a module its operator does not trust,
    arguments beyond `bounds` (default: the API's). The API refuses such a submit with this
    message, and a worker fails such a job with it."""
    refused = module_refusal(job.module, settings)
    if refused is not None:
        return f"capture.module: {refused}"
    try:
        Capture(args=job.args, grids=()).check_bounds(bounds or submit_bounds(settings))
    except CaptureError as exc:
        return str(exc)
    return None


# -- the process's own Helion job -----------------------------------------------------------------
_TUNING = 0
_TUNING_LOCK = threading.Lock()


def tuning_here() -> bool:
    """Whether this process is tuning a Helion job now: its backend then never queues a job."""
    return _TUNING > 0


@contextlib.contextmanager
def tuning() -> Iterator[None]:
    """Mark this process as tuning a Helion job (a worker's child runs the job's code under it)."""
    global _TUNING
    with _TUNING_LOCK:
        _TUNING += 1
    try:
        yield
    finally:
        with _TUNING_LOCK:
            _TUNING -= 1


__all__ = ["HelionJob", "JOB_KERNEL_PREFIX", "KIND", "SAMPLER", "SETTINGS", "VERSION", "check_job",
           "parse_job", "tuning", "tuning_here"]
