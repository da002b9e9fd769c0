"""The decorator's settings (KS_AUTOTUNE_*) as it reads them, and the enums that name its choices."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Fallback(str, enum.Enum):
    """What a key with no served record runs: Triton's own benchmark here, then shared (the
    default: never worse than triton.autotune), or at once the first config or the nearest
    served one while the workers tune (opt-in)."""

    TUNE = "tune"
    FIRST = "first"
    NEAREST = "nearest"


class Source(str, enum.Enum):
    """Where a key's config came from (`Autotuner.sources`)."""

    STORE = "store"
    SERVICE = "service"
    NEAREST = "nearest"
    FIRST = "first"
    TUNED_HERE = "tuned_here"
    CACHED = "cached"  # Triton's own disk cache of timings (cache_results)
    RANK0 = "rank0"


class Sync(str, enum.Enum):
    """How the ranks of a torch.distributed job agree on a key's config."""

    NONE = "none"
    BROADCAST = "broadcast"


@dataclass(frozen=True)
class Options:
    """The KS_AUTOTUNE_* settings as the decorator uses them, read once per resolved key (cheap
    next to a kernel launch). Their defaults and checks are ClientSettings' alone; a bad value
    is warned about there and replaced by its default, never raised."""

    fallback: Fallback
    timeout_s: float
    retry_s: float
    recheck_s: float
    sync: Sync
    submit_jobs: bool
    prepare: bool

    @classmethod
    def from_env(cls) -> "Options":
        from kernelsearch.service.client_settings import client_settings

        st = client_settings()
        return cls(fallback=Fallback(st.autotune_fallback), timeout_s=st.autotune_timeout_s,
                   retry_s=st.autotune_retry_s, recheck_s=st.autotune_recheck_s,
                   sync=Sync(st.autotune_sync), submit_jobs=st.autotune_submit,
                   prepare=st.autotune_prepare)


POLICY_WHY = {
    Fallback.TUNE: "tuning here as triton.autotune would, then sharing the result "
                   "(KS_AUTOTUNE_FALLBACK=tune, the default)",
    Fallback.FIRST: "running the first config now (KS_AUTOTUNE_FALLBACK=first)",
    Fallback.NEAREST: "running the nearest served config, else the first, now "
                      "(KS_AUTOTUNE_FALLBACK=nearest)",
}
