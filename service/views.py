"""What the API and the dashboard show of records, jobs and cases, in one place.

Both render the same record (RecordOut's fields with `case`, `latency_us` and `versions`) and the
same job, and a case's size as the dashboard lists it.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from kernelsearch import kernels
from kernelsearch.kernels.device import versions as kernel_versions

# The statuses in which a job can still be cancelled (the dashboard offers its button).


def current_versions(kernel: str) -> dict[str, str | None]:
    """The versions a record of `kernel` is compared with (/v1/best's `same_versions`, the
    dashboard's drift): this process's torch and triton, and the kernel's source identity as
    its registered definition gives it (`KernelDef.source_hash`: an undeclared kernel's is the
    one its decorator and workers store with its records). KeyError for an unknown kernel."""
    v = _tool_versions()
    return {"torch": v.get("torch"), "triton": v.get("triton"),
            "source_hash": _source_hash(kernels.get_kernel(kernel))}


@lru_cache(maxsize=1)
def _tool_versions() -> dict[str, Any]:
    return dict(kernel_versions())


@lru_cache(maxsize=4096)
def _source_hash(kdef: kernels.KernelDef) -> str:
    """Costly for a declared kernel (it parses the kernel's sources), so kept per declaration:
    a definition registered again under the same name is another object, asked anew."""
    return kdef.source_hash


def case_work(kernel: str | kernels.KernelDef | None, axes: Mapping[str, Any]) -> int | None:
    """A case's size as "nearest" compares it (KernelDef.work), for listings; None where it
    cannot be known (a kernel this code no longer has, axes its size function refuses)."""
    if kernel is None:
        return None
    try:
        kdef = kernels.get_kernel(kernel) if isinstance(kernel, str) else kernel
        return int(kdef.work(axes))
    except Exception:
        return None


def record_json(record: Any) -> dict[str, Any]:
    """A record view as the API shows it (RecordOut's fields plus whatever the store adds)."""
    d = record.as_dict() if hasattr(record, "as_dict") else dict(record)
    out = dict(d)
    out.setdefault("case", d.get("axes"))
    out.setdefault("latency_us", d.get("latency_median_us"))
    out.setdefault("versions", {"torch": d.get("torch_version"),
                                "triton": d.get("triton_version"),
                                "source_hash": d.get("source_hash")})
    return jsonable(out)


def job_json(job: Any) -> dict[str, Any]:
    """A job view as the API shows it (JobOut's fields)."""
    d = job.as_dict() if hasattr(job, "as_dict") else dict(job)
    return jsonable(d)


def jsonable(d: Any) -> Any:
    """A copy of `d` made of JSON types only (datetimes as ISO 8601 text)."""
    return json.loads(json.dumps(d, default=_default))


def dumps(d: Any) -> bytes:
    """`d` as compact JSON bytes, for answers the lookup cache keeps ready to send."""
    return json.dumps(d, default=_default, separators=(",", ":")).encode()


def _default(o: Any) -> Any:
    if hasattr(o, "isoformat"):
        return o.isoformat()
    raise TypeError(f"not JSON-able: {type(o).__name__}")


def unknown_selection(store: Any, kernel: str | None, device: str | None) -> str | None:
    """Why --kernel/--device select nothing that exists (a typo), or None for a valid selection
    that merely has no records yet."""
    if kernel is not None:
        from kernelsearch.kernels import kernel_names

        stored = {r.kernel for r in store.list_records(include_history=True)}
        if kernel not in stored and kernel not in kernel_names():
            known = sorted(stored | set(kernel_names()))
            return f"--kernel: unknown kernel {kernel!r}; known: {', '.join(known) or 'none'}"
    if device is not None:
        devices = [d["name"] for d in store.list_devices()]
        if device not in devices:
            return (f"--device: no device {device!r} in the database; devices: "
                    f"{', '.join(map(repr, devices)) or 'none'}")
    return None
