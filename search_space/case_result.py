"""What tuning one case produced (`CaseResult`), grouped: the case and its study, the best
config found, trial counts, phase times and failures."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from .states import StopReason


@dataclass(frozen=True)
class CaseKey:
    """Which case was tuned, and in which study with which sampler."""

    kernel: str
    axes: dict[str, int]
    device: str
    study_name: str
    sampler: str


@dataclass(frozen=True)
class BestFound:
    """The study's best config so far, and what became of the case's record."""

    config: dict[str, Any] | None = None
    latency_us: float | None = None
    timing_method: str | None = None
    improved: bool = False
    record_id: int | None = None


@dataclass(frozen=True)
class TrialCounts:
    """How many trials, and which: this call's and the study's."""

    n_complete: int = 0
    n_failed: int = 0
    n_rejected: int = 0
    n_cached: int = 0
    n_run_now: int = 0
    # Evaluated trials that count toward n_trials (the run tag's, or the whole study's).
    n_counted: int = 0
    warm_started: int = 0
    # Latency (None for a failure) of every evaluated trial of the study, in trial order.
    history: list[float | None] = field(default_factory=list)


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds spent per phase over this call's trials, and the call's wall time."""

    compile_s: float = 0.0
    check_s: float = 0.0
    measure_s: float = 0.0
    compile_wait_s: float = 0.0
    wall_s: float = 0.0


@dataclass(frozen=True)
class Failures:
    """Failure kind -> count over this call's trials (`new_kinds`) and the whole study's
    (`kinds`); the first message of each (this call's when it has failures, else the study's)."""

    new_kinds: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    first: str | None = None


@dataclass(frozen=True)
class CaseResult:
    """What tuning one case produced; phase seconds count this call's trials only."""

    key: CaseKey
    stopped_because: StopReason
    best: BestFound = field(default_factory=BestFound)
    trials: TrialCounts = field(default_factory=TrialCounts)
    times: PhaseTimes = field(default_factory=PhaseTimes)
    failures: Failures = field(default_factory=Failures)

    def as_dict(self) -> dict[str, Any]:
        """The flat document the CLI writes (`tune --json`) and a job's reader expects: these
        keys in this order, whatever the grouping above."""
        k, b, n, t, f = self.key, self.best, self.trials, self.times, self.failures
        return copy.deepcopy({
            "kernel": k.kernel, "axes": k.axes, "device": k.device, "study_name": k.study_name,
            "sampler": k.sampler, "best_config": b.config, "best_latency_us": b.latency_us,
            "n_complete": n.n_complete, "n_failed": n.n_failed, "improved": b.improved,
            "compile_s": t.compile_s, "check_s": t.check_s, "measure_s": t.measure_s,
            "stopped_because": self.stopped_because, "n_rejected": n.n_rejected,
            "n_cached": n.n_cached, "n_run_now": n.n_run_now, "wall_s": t.wall_s,
            "compile_wait_s": t.compile_wait_s, "warm_started": n.warm_started,
            "timing_method": b.timing_method, "record_id": b.record_id, "history": n.history,
            "n_counted": n.n_counted, "new_failure_kinds": f.new_kinds,
            "failure_kinds": f.kinds, "first_failure": f.first,
        })

    def failure_summary(self) -> str:
        """Why trials failed, for a person: kinds with counts and the first message."""
        kinds = self.failures.new_kinds or self.failures.kinds
        if not kinds:
            why = {StopReason.SPACE_EXHAUSTED: "every config of the space was already tried",
                   StopReason.SAMPLER_STUCK: "the sampler only proposed rejected or known configs",
                   StopReason.N_TRIALS: "no trial was left to run"}.get(self.stopped_because,
                                                                         self.stopped_because)
            return f"no config was measured: {why}"
        scope = "this run's" if self.failures.new_kinds else "the study's"
        n = sum(kinds.values())
        parts = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        text = f"{n} of {scope} trials failed ({parts})"
        return f"{text}; first: {self.failures.first}" if self.failures.first else text


__all__ = ["CaseResult", "CaseKey", "BestFound", "TrialCounts", "PhaseTimes", "Failures"]
