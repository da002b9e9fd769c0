"""What one trial produced (`TrialOutcome`), and the trial that was stopped on request
(`TrialCancelled`)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from kernelsearch.kernels.errors import FailureKind


class TrialCancelled(Exception):
    """The trial in flight was stopped on request (its job was cancelled): no outcome of the
    config, which a resumed study evaluates again."""


@dataclass
class TrialOutcome:
    """What one trial produced: a measured latency or a typed failure, plus phase times."""

    ok: bool
    failure_kind: str | None = None
    message: str = ""
    # median_us, min_us, max_us, q1_us, q3_us, iqr_us, n, method (empty on failure)
    timing: dict[str, Any] = field(default_factory=dict)
    rel_errors: dict[str, float] = field(default_factory=dict)
    n_regs: int | None = None
    n_spills: int | None = None
    shared_bytes: int | None = None
    compile_s: float = 0.0
    check_s: float = 0.0
    measure_s: float = 0.0
    # Seconds the runner waited for the compile-ahead pool before the trial started.
    compile_wait_s: float = 0.0
    # The compiled kernel (kernels.compiled.compiled_ref): its group is stored with the record.
    compiled: dict[str, Any] | None = None

    @property
    def latency_us(self) -> float | None:
        return self.timing.get("median_us") if self.ok else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # NaN is not JSON: a NaN relative error (unwritten output) becomes None.
        d["rel_errors"] = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                           for k, v in self.rel_errors.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrialOutcome":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def failure(cls, kind: FailureKind | str, message: str, **kw: Any) -> "TrialOutcome":
        return cls(ok=False, failure_kind=FailureKind(kind).value, message=message, **kw)


__all__ = ["TrialOutcome", "TrialCancelled"]
