"""The API's and the workers' settings (KS_* environment variables, pydantic-settings): the
client's (service/client_settings.py: what a user's program reads too) and the server's own."""
from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator

from .client_settings import (ClientSettings, JobLimits, client_settings, default_database_url,
                              env_name, field_of, job_limits, seconds_alias, warn_deprecated_names)

__all__ = ["ClientSettings", "JobLimits", "Settings", "SettingsError", "client_settings",
           "default_database_url", "get_settings", "job_limits", "load_settings"]

LEASE_MARGIN = 3


class Settings(ClientSettings, JobLimits):
    """The API's and the workers' settings: the client's, and the server's own."""

    lease_seconds: float = Field(60.0, validation_alias=seconds_alias("lease_seconds"), gt=0, description="a running job whose worker is silent this long is reclaimed")
    heartbeat_seconds: float = Field(10.0, validation_alias=seconds_alias("heartbeat_seconds"), gt=0, description="how often a worker renews its lease")
    worker_id: str | None = Field(None, description="lease owner name; default host:pid")
    trial_timeout_s: float | None = Field(
        None, gt=0, description="a candidate running longer is killed; unset: 120 s on a GPU, "
                                "600 s under the Triton interpreter")
    helion_failed_retry_s: float = Field(
        3600.0, ge=0, description="a Helion key whose worker job failed is not queued again for this "
        "long (its misses run the default config meanwhile); 0: queued again on the next miss")
    max_body_bytes: int = Field(64 * 1024, gt=0, description="a request body past this many bytes "
                                "is refused (413); POST /v1/artifacts has its own bound")
    artifact_max_bytes: int = Field(
        16 << 20, gt=0, le=1 << 30, description="one compiled kernel's files (POST /v1/artifacts), "
        "in bytes; that route's body may be this much plus base64's third")
    cors_origins: list[str] = Field(default_factory=list, description="empty: CORS off")
    log_level: str = Field("INFO", description="the service's and the workers' log level")
    worker_poll_seconds: float = Field(2.0, validation_alias=seconds_alias("worker_poll_seconds"), gt=0, description="an idle worker looks for queued jobs this often")
    capture_import_tries: int = Field(
        3, ge=1, description="a job tuning a captured call is handed back by a worker that cannot "
        "import the kernel's module, and failed (naming the module) at this claim")
    job_max_claims: int = Field(
        3, ge=1, description="a job whose worker went silent (died, hung) this many times is "
        "failed instead of claimed again: a job that kills what runs it fails alone")
    job_max_seconds: float = Field(
        6 * 3600.0, validation_alias=seconds_alias("job_max_seconds"), gt=0, description="a running job past this wall-clock time is failed, its "
        "trial child (or Helion job child) killed; a job's own timeout_s may be shorter")
    measure_n: int | None = Field(None, gt=0, description="timed calls per trial (median); "
                                                       "unset: 30 on a GPU, 3 under the interpreter")
    cancel_poll_seconds: float = Field(1.0, validation_alias=seconds_alias("cancel_poll_seconds"), gt=0, description="how often a worker checks that its "
                                                             "job was cancelled (the trial is then killed)")
    records_check_seconds: float = Field(0.5, validation_alias=seconds_alias("records_check_seconds"), gt=0, description="how often /v1/best checks that records changed")
    optuna_dashboard_url: str = Field(
        "http://127.0.0.1:8080", description="where `kernelsearch optuna-dashboard` serves; the case pages link to it")
    tune_reference: Literal["auto", "none", "eager", "both"] = Field(
        "auto", description="references a worker times for speedups; auto: both on a GPU, eager otherwise")
    db_retry_seconds: float = Field(60.0, validation_alias=seconds_alias("db_retry_seconds"), ge=0, description="a worker retries a transient database "
                                    "failure (dropped connection, restart) this long before leaving a job")
    lookup_timeout_s: float = Field(1.0, gt=0, le=30, description="/v1/best and /healthz answer "
                                    "(from the cache, or 503) within this, whatever the database does")
    lookup_threads: int = Field(8, gt=0, le=256, description="threads of /v1/best's misses and "
                                "/healthz (their own: slow reads never take them)")
    read_timeout_s: float = Field(10.0, gt=0, le=300, description="the other read routes (jobs, "
                                  "records, the dashboard, /metrics) answer 503 with Retry-After "
                                  "when the database has not answered within this")
    read_threads: int = Field(8, gt=0, le=256, description="threads of the other read routes' "
                              "database calls (a read past its bound keeps one until the "
                              "statement timeout ends it)")
    statement_timeout_s: float = Field(15.0, ge=0, le=3600, description="PostgreSQL "
                                       "statement_timeout of the API's connections (0: none); "
                                       "ends the query of a read that was answered 503")
    nearest_max_ratio: float = Field(32.0, gt=1, description="/v1/best serves a nearest record "
                                     "only when the two cases' bytes moved differ by at most "
                                     "this factor; farther: 404")
    search_trials: int = Field(64, ge=0, le=10_000, description="a search job's budget per key: "
                               "configs evaluated beyond the list's (every run of its study together)")
    search_seconds: float = Field(300.0, validation_alias=seconds_alias("search_seconds"), gt=0, description="a search job's budget per key in seconds")
    search_sampler: Literal["tpe", "random", "gp", "cmaes", "qmc"] = Field(
        "tpe", description="a search job's Optuna sampler (search_space.key_search says why tpe)")
    serve_worker: Literal["process", "thread"] = Field(
        "process", description="`kernelsearch serve`'s worker: its own process (lookups never "
        "wait behind tuning), or a thread of the API process")
    artifact_read_max_bytes: int = Field(
        32 << 20, gt=0, le=1 << 30, description="one artifact read (GET /v1/artifacts, "
        "/v1/artifacts/device, a Helion entry's) answers at most this many bytes of files (one "
        "set at least); the client pages on with ?after=<the last set's id>")
    artifacts_from_workers_only: bool = Field(
        False, description="compiled kernels come from this service's workers only: the upload "
        "routes answer 403 and every read serves workers' sets alone, so a writer token cannot "
        "make another host run a binary it chose")
    search_queue_share: float = Field(
        0.5, gt=0, le=1, description="POST /v1/search queues at most this share of the queue's "
        "remaining room (KS_MAX_QUEUED_JOBS less the queued jobs), at least one job; the answer "
        "says how many keys were left out")
    trial_max_memory_bytes: int | None = Field(
        None, gt=0, description="a trial child's data segment may grow to "
        "this many bytes (RLIMIT_DATA), past which its allocation fails and so does its trial; "
        "unset: 3/4 of the host's physical memory")
    artifact_max_uploads: int = Field(
        16, gt=0, description="a record (or Helion entry) holds at most this many uploaded "
        "compiled kernels (each its own Triton cache key); the next upload answers 409")

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        # A lease must outlive a missed heartbeat or two, or two live workers take the same job
        # from each other in turn (a 5 s lease with a 10 s heartbeat never finishes a trial).
        if self.lease_seconds < LEASE_MARGIN * self.heartbeat_seconds:
            raise ValueError(
                f"KS_LEASE_S ({self.lease_seconds:g}) must be at least {LEASE_MARGIN}x "
                f"KS_HEARTBEAT_S ({self.heartbeat_seconds:g}), i.e. >= "
                f"{LEASE_MARGIN * self.heartbeat_seconds:g}: raise the lease or heartbeat more often")
        return self


class SettingsError(ValueError):
    """KS_* settings that are invalid or contradict each other; the message names them."""


def load_settings() -> Settings:
    """The settings, or SettingsError in one line naming each bad KS_* variable (a malformed
    KS_DATABASE_URL included, its password never quoted)."""
    from pydantic import ValidationError

    from kernelsearch.db.engine import DatabaseURLError, parse_database_url

    try:
        settings = get_settings()
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = field_of(Settings, str(err["loc"][0])) if err["loc"] else None
            name = f"{env_name(Settings, field)}: " if field else ""
            lines.append(f"{name}{err['msg'].removeprefix('Value error, ')}")
        raise SettingsError("invalid settings: " + "; ".join(lines)) from None
    try:
        parse_database_url(settings.database_url)
    except DatabaseURLError as exc:
        raise SettingsError(f"invalid settings: KS_DATABASE_URL: {exc}") from None
    return settings


@lru_cache
def get_settings() -> Settings:
    warn_deprecated_names(Settings)
    return Settings()
