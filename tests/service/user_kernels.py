"""An undeclared kernel as its decorator describes it to the service, and its records, for the
service's surface tests (named uniquely: test folders are not packages)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from kernelsearch.db.views import RecordIn
from kernelsearch.kernels import registry
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.device import versions

DEVICE = "NVIDIA H200"
SOURCE = "5eed0f5eed0f5eed"  # the decorator's source identity of the kernel (Triton's key, hashed)
CONFIGS = [canonical({"BLOCK": 64, "num_warps": 4}), canonical({"BLOCK": 128, "num_warps": 4})]
# A real library's kernel path: longer than the 100 characters a name once had, in two scripts.
LONG = ("ks_tests.vendor_library_with_a_long_name.ops.fused.attention_variants.backward_pass."
        "Kernels.módulo_ядро_" + "x" * 150)
SHORT = "módulo.ядро"


def definition(name: str, *, source_hash: str = SOURCE) -> dict[str, Any]:
    """The definition `@kernelsearch.autotune` posts to /v1/kernels for a kernel of this name."""
    module, _, qualname = name.rpartition(".")
    return {"kind": "undeclared", "name": name, "module": module, "qualname": qualname,
            "arg_names": ["x_ptr", "y_ptr", "n", "BLOCK"], "key": ["n"],
            "dtype_args": ["x_ptr", "y_ptr"], "configs": CONFIGS, "source_hash": source_hash}


def axes(n: int) -> dict[str, Any]:
    return {"n": n, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}


def und_record(name: str, n: int, latency_us: float, *, source_hash: str = SOURCE,
               minutes: float = 0.0, **kw: Any) -> RecordIn:
    """A record as the decorator or a worker stores it: the definition's source identity, this
    process's versions, a timing for every listed config."""
    v = versions()
    fields: dict[str, Any] = dict(
        kernel=name, axes=axes(n), work=float(n), device=DEVICE, torch_version=v["torch"],
        triton_version=v["triton"], source_hash=source_hash, config=dict(CONFIGS[1]),
        latency_median_us=latency_us, latency_min_us=latency_us * 0.9,
        latency_max_us=latency_us * 1.2, latency_iqr_us=latency_us * 0.05,
        timing_method="triton-do-bench", rel_error=0.0, n_trials=2, n_failed=0,
        config_timings={canonical_key(CONFIGS[0]): latency_us * 1.5,
                        canonical_key(CONFIGS[1]): latency_us},
        tuned_at=datetime.now(timezone.utc) - timedelta(minutes=60 - minutes),
        device_info={"name": DEVICE})
    fields.update(kw)
    return RecordIn(**fields)


def forget(*names: str) -> None:
    """Unregister kernels a test registered in this process."""
    for n in names:
        try:
            registry.unregister(n)
        except KeyError:
            pass


def capture(n: int) -> dict[str, Any]:
    """The call of the kernel on `n` float32 elements as the decorator captures it for a job:
    each argument's kind, and the grid of each config."""
    from kernelsearch.kernels.capture import CAPTURE_VERSION

    tensor = {"kind": "tensor", "shape": [n], "strides": [1], "dtype": "float32"}
    return {"version": CAPTURE_VERSION,
            "args": [{"name": "x_ptr", **tensor}, {"name": "y_ptr", **tensor},
                     {"name": "n", "kind": "scalar", "value": n}],
            "grids": [[max(1, n // c["BLOCK"]), 1, 1] for c in CONFIGS]}
