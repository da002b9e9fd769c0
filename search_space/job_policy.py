"""What an operator lets a job ask of a worker, checked at submit by the API and again by the
worker before it runs the job (a job queued before the rule, or under other settings, fails
with the same message).

Modules: a job makes a worker import code by name (an undeclared kernel's definition, a Helion
job). A worker imports only modules its operator trusts: those of the installed
`kernelsearch.kernels` entry-point plugins, those under a `KS_KERNEL_MODULES` entry, and those
under a `KS_JOB_MODULES` prefix; never a package's `__main__` (a script, not a kernel module).

Captures: a captured call's tensors, grids and key sizes within `CaptureBounds`: at submit the
largest device class this version knows (the H200's memory) unless KS_CAPTURE_MAX_BYTES /
KS_CAPTURE_MAX_PROGRAMS are set; on a worker its own device's.

Below the server and the client: a user's program that queues into its local store keeps the
routes' rules from this one definition.
"""
from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any, Mapping, Protocol

from kernelsearch.kernels.capture import H200_MEMORY_BYTES, CaptureBounds
from kernelsearch.kernels.registry import ENTRY_POINT_GROUP, env_modules


class SubmitLimits(Protocol):
    """The settings these rules read: `service.client_settings.JobLimits` (a user's program) and
    the server's `Settings` provide them; this layer sits below both, so it names only the fields."""

    @property
    def max_trials_per_job(self) -> int: ...
    @property
    def max_cases_per_job(self) -> int: ...
    @property
    def max_queued_jobs(self) -> int: ...
    @property
    def job_modules(self) -> list[str]: ...
    @property
    def capture_max_bytes(self) -> int | None: ...
    @property
    def capture_max_programs(self) -> int | None: ...


def trusted_prefixes(settings: SubmitLimits) -> tuple[str, ...]:
    """The module prefixes whose code a job may make a worker import."""
    plugins = [ep.module for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return tuple(dict.fromkeys([*plugins, *env_modules(), *settings.job_modules]))


def module_refusal(module: str, settings: SubmitLimits) -> str | None:
    """Why a job naming `module` is refused (None: its module is trusted); the message names the
    settings that would allow it."""
    prefixes = trusted_prefixes(settings)
    if "__main__" not in module.split(".") and any(
            module == p or module.startswith(p + ".") for p in prefixes):
        return None
    why = ("a package's __main__ is a script, never a kernel module"
           if "__main__" in module.split(".") else
           f"trusted here: {', '.join(prefixes) or 'none'}")
    return (f"module {module!r} is not one this service's workers import ({why}): the operator "
            f"allows a module by naming it, or a package above it, in KS_JOB_MODULES (or "
            f"KS_KERNEL_MODULES) on the service and its workers, or by installing it as a "
            f"kernelsearch.kernels plugin")


def submit_bounds(settings: SubmitLimits) -> CaptureBounds:
    """The bounds the API checks a capture against: the settings', else the largest device
    class this version knows (any worker may claim the job; each checks its own again)."""
    return CaptureBounds.for_device(H200_MEMORY_BYTES, max_bytes=settings.capture_max_bytes,
                                    max_programs=settings.capture_max_programs)


def worker_bounds(settings: SubmitLimits, device_info: Mapping[str, Any] | None) -> CaptureBounds:
    """The bounds on this worker's device (its trial child's report; None: the CPU)."""
    memory = (device_info or {}).get("memory_bytes")
    return CaptureBounds.for_device(int(memory) if memory else None,
                                    max_bytes=settings.capture_max_bytes,
                                    max_programs=settings.capture_max_programs)


__all__ = ["SubmitLimits", "module_refusal", "submit_bounds", "trusted_prefixes", "worker_bounds"]
