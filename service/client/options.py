"""The decorator's settings (KS_AUTOTUNE_*) as it reads them, and the enums that name its choices."""
from __future__ import annotations

import enum
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


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
    """The KS_AUTOTUNE_* settings (service/settings.py's ClientSettings, a user program's own),
    read once per resolved key (cheap next to a kernel launch); a bad value is warned about and
    replaced by its default, never raised."""

    fallback: Fallback = Fallback.TUNE
    timeout_s: float = 0.25
    retry_s: float = 30.0
    recheck_s: float = 10.0
    sync: Sync = Sync.NONE
    submit_jobs: bool = True
    prepare: bool = True
    # KS_AUTOTUNE_SEARCH_SPACE: what workers may search beyond the list of every kernel this
    # program decorates or manages, where the code says nothing (search_policy.default_search_space).
    search_space: str = field(
        default_factory=lambda: os.environ.get("KS_AUTOTUNE_SEARCH_SPACE", "").strip() or "list")

    @classmethod
    def from_env(cls) -> "Options":
        from pydantic import ValidationError

        from kernelsearch.service.settings import ClientSettings as Settings
        from kernelsearch.service.settings import client_settings

        try:
            st = client_settings()
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
            for name in sorted(bad):
                log.warning("KS_%s=%r is not accepted (%s); using its default", name.upper(),
                            os.environ.get(f"KS_{name.upper()}"),
                            next(e["msg"] for e in exc.errors() if e["loc"][:1] == (name,)))
            try:
                st = Settings(**{n: Settings.model_fields[n].default for n in bad
                                 if n in Settings.model_fields})
            except ValidationError:
                return cls()
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
