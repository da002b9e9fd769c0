"""How tuning a case stopped and how the tuner marks its trials, as str enums: the tuner writes
them and the worker reads them back (a job's case summaries), so a misspelt one fails the type
check. A member is its own value (`StopReason.TIMEOUT == "timeout"`; JSON and f-strings see
"timeout"). Apart from the tuner, so that reading them does not import Optuna.
"""
from __future__ import annotations

import enum


class StopReason(enum.StrEnum):
    """Why tuning a case stopped (CaseResult.stopped_because; a job's case summary stores the
    value)."""

    N_TRIALS = "n_trials"
    TIMEOUT = "timeout"
    PATIENCE = "patience"
    CANCELLED = "cancelled"
    SPACE_EXHAUSTED = "space_exhausted"
    SAMPLER_STUCK = "sampler_stuck"

    @property
    def cut_short(self) -> bool:
        """The case was stopped from outside (cancelled, or out of time) before the tuner was
        done with it: a job stops there and does not count the case as fully tuned."""
        return self in CUT_SHORT



# The reasons `StopReason.cut_short` is true for; a stored case summary's plain string is in it
# too when it names one of them.
CUT_SHORT: frozenset[str] = frozenset({StopReason.CANCELLED, StopReason.TIMEOUT})

class TrialMark(enum.StrEnum):
    """What the tuner marks an Optuna trial with (its A_STATE attribute): measured, failed when
    run, rejected by the space before running, or answered from an earlier trial of the same
    config (CACHED_ + the state of that trial)."""

    OK = "ok"
    FAIL = "fail"
    REJECTED = "rejected"
    CACHED_OK = "cached_ok"
    CACHED_FAIL = "cached_fail"
