"""How one case is tuned (`TuneOptions`), the caller's callbacks (`TuneHooks`), and the
tuner's argument error (`TuneError`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from kernelsearch.db.interfaces import Lease

from .records import REFERENCES

SAMPLERS = ("tpe", "random", "grid", "gp", "cmaes")


class TuneError(ValueError):
    """Bad arguments to the tuner (unknown sampler, bad counts), naming the argument."""


@dataclass(frozen=True)
class TuneOptions:
    """How one case is tuned; checked when built (TuneError names the bad field).

    Stopping: `n_trials` evaluated configs, `timeout_s`, `patience` evaluated trials without
    improvement, `max_rejected` rejected proposals in a row. What counts toward `n_trials`:
    without `run_tag`, every evaluated trial of the study (a resumed study counts its stored
    trials); with it, only the evaluated trials carrying that tag, so a run adds `n_trials` to the
    study, and a run resumed with the same tag (a job claimed again) counts its own trials once.
    Failed trials count: a failure is an evaluated config.

    `measure_n` None: the device's `default_repeats`. `name` overrides the study name
    (experiments). `reference` ("none", "eager", "both", "auto": both on a GPU, eager otherwise)
    measures the PyTorch references once for the record's speedups (a record that ships without
    them has none to show); `copy_bandwidth` (bytes/s) gives the roofline (measured on a GPU when
    not given). `summaries=False` skips the store's per-trial summaries. `next_case` (kernel,
    axes) is the case tuned after this one: once half of this case's budget is spent, its
    warm-start configs go to the compile-ahead pool, so its first trials find them compiled.
    `exclusive`: the caller holds the study's claim (no one else tunes it now), so trials left
    RUNNING by a dead worker, an outage or a failed job are failed before and after.
    `lease`: the job lease the study's claim was taken under (a worker's job). Every write to
    the study (asks, attributes, tells, the cleanup of RUNNING trials) then checks, in its own
    transaction, that the claim is still held under it, and LeaseLost ends the case at once
    when it is not: a worker that lost its lease never touches the new holder's trials.
    """

    n_trials: int
    sampler: str = "tpe"
    timeout_s: float | None = None
    patience: int | None = None
    max_rejected: int | None = None
    warm_start: bool = True
    seed: int | None = None
    measure_n: int | None = None
    name: str | None = None
    heartbeat_s: int = 10
    reference: str = "auto"
    copy_bandwidth: float | None = None
    write_record: bool = True
    summaries: bool = True
    next_case: tuple[str, Mapping[str, int]] | None = None
    run_tag: str | None = None
    job_id: int | None = None
    exclusive: bool = False
    lease: Lease | None = None

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise TuneError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        n = self.n_trials
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TuneError(f"n_trials: expected an int >= 0, got {n!r}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise TuneError(f"timeout_s: must be positive, got {self.timeout_s!r}")
        if self.patience is not None and self.patience < 1:
            raise TuneError(f"patience: must be >= 1, got {self.patience!r}")
        if self.measure_n is not None and self.measure_n < 1:
            raise TuneError(f"measure_n: must be >= 1, got {self.measure_n!r}")
        if self.reference not in REFERENCES:
            raise TuneError(f"reference: expected one of {', '.join(REFERENCES)}, got {self.reference!r}")


@dataclass(frozen=True)
class TuneHooks:
    """The caller's side of a running case. `progress(done, n_trials, best_us)` after every
    evaluated trial; `should_stop()` between trials ends the case; `cancel()`, asked while a
    trial runs, stops that trial at once (its child killed) and the case with "cancelled"."""

    progress: Callable[[int, int, float | None], None] | None = None
    should_stop: Callable[[], bool] | None = None
    cancel: Callable[[], bool] | None = None


__all__ = ["SAMPLERS", "TuneError", "TuneOptions", "TuneHooks"]
