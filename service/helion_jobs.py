"""A worker's side of Helion tuning jobs: a Helion cache miss (`kernelsearch.helion` under
KS_HELION_ON_MISS=default) queues a job carrying a capture of the call
(search_space.helion_job: the document and its checks), and a worker tunes it.

The worker checks the module is one its operator trusts
and the arguments within its bounds (search_space.job_policy), then, in a disposable child process
(service.job_child), imports the module, rebuilds the arguments and runs the kernel's own
autotuner (its `autotuner_fn`, the captured settings applied); it stores the entry Helion would
have written under the key, through the acceptance gate, under the job's lease. A worker whose Helion computes another key (other hardware, versions or code) fails the
job naming both keys instead of storing a config under a key it did not tune.
"""
from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelsearch.kernels.capture import Capture, KernelModuleUnavailable, import_object, rebuild
from kernelsearch.search_space.helion_job import HelionJob, parse_job, tuning

log = logging.getLogger(__name__)

# The worker computes the key and writes the entry itself: the remote caches' local halves key
# alike and need no backend there.
LOCAL_CACHE = {"RemoteAutotuneCache": "LocalAutotuneCache",
               "StrictRemoteAutotuneCache": "StrictLocalAutotuneCache"}


class HelionJobError(Exception):
    """A Helion job that cannot run on this worker; the message is the job's error."""


class HelionJobCrashed(HelionJobError):
    """The job's code ended its child process (or raised what is not an Exception)."""


# -- the worker's side ------------------------------------------------------------------------------
# The kernel's Settings are the module's object: one Helion job at a time per process sets them.
_JOB_LOCK = threading.Lock()


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
    with _JOB_LOCK, tuning():
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


__all__ = ["HelionJobCrashed", "HelionJobError", "TunedEntry", "import_kernel", "tune", "tune_here"]
