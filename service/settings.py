"""Settings from KS_* environment variables (pydantic-settings), one object per audience:
`ClientSettings` for what runs inside a user's program (the decorator, the providers: where the
store and the service are, and the autotune policy), `Settings` for the API and the workers (all
of the client's, and the server's own). A user's program never reads the server's settings, so a
typo in one of them (KS_LEASE_SECONDS) is no concern of the decorator's."""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


LEASE_MARGIN = 3


def default_database_url() -> str:
    """SQLite in the user's data directory ($XDG_DATA_HOME/kernelsearch, else
    ~/.local/share/kernelsearch): one absolute place, so a program reads the same store from any
    working directory. `make run` sets KS_DATABASE_URL to the checkout's ./var instead."""
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return f"sqlite:///{(root / 'kernelsearch' / 'kernelsearch.db').as_posix()}"


class ClientSettings(BaseSettings):
    """What a user's program reads: the store, the service and its token, the decorator's policy."""

    model_config = SettingsConfigDict(env_prefix="KS_", extra="ignore")

    database_url: str = Field(default_factory=lambda: default_database_url(),
                              description="SQLAlchemy URL; postgresql+psycopg://... for PostgreSQL; "
                                          "default: a SQLite file in the user's data directory")
    api_token: SecretStr | None = Field(None, description="when set, writes need 'Authorization: Bearer <token>'")
    service_url: str | None = Field(None, description="when set, kernels ask this service for configs")
    provider_timeout_s: float = Field(0.5, gt=0, description="kernels' lookups give the service this long")
    autotune_fallback: Literal["tune", "first", "nearest"] = Field(
        "tune", description="@kernelsearch.autotune with no record: tune here as triton.autotune "
        "would and share the result (tune), or run the first config (first) or the nearest "
        "served one (nearest) at once while the workers tune")
    autotune_timeout_s: float = Field(0.25, ge=0, description="a new key's lookup waits this long at most")
    autotune_retry_s: float = Field(30.0, ge=0, description="a failed service is not asked again for this long")
    autotune_recheck_s: float = Field(10.0, ge=0, description="a key without a record is looked up again this often (0: never)")
    autotune_sync: Literal["none", "broadcast"] = Field(
        "none", description="broadcast: rank 0 of a torch.distributed group resolves each key for all ranks")
    autotune_submit: bool = Field(True, description="a key without a record queues a tuning job")
    autotune_prepare: bool = Field(True, description="a declaration prepares the lookups in the background")
    autotune_serve_searched: Literal["auto", "on", "off"] = Field(
        "auto", description="serve a record whose winner a worker found beyond the kernel's config "
        "list (issue 35): on, off (the list's best by the record's timings), or auto: on for "
        "declared kernels, off for @kernelsearch.autotune's undeclared ones")
    search_max_configs: int = Field(256, gt=0, le=4096, description="@kernelsearch.autotune("
                                    "search_space='derived'): at most this many configs beyond "
                                    "the list go to the workers (a seeded sample of the derived space)")
    helion_timeout_s: float = Field(2.0, gt=0, le=60, description="kernelsearch.helion: Helion's cache "
                                    "read, write or list waits this long at most (a miss costs minutes of tuning)")
    helion_on_miss: Literal["tune", "default"] = Field(
        "tune", description="kernelsearch.helion, a key the service has no entry for: Helion tunes "
        "here (tune), or runs its default config at once while a worker tunes the call's capture "
        "(default; needs KS_SERVICE_URL)")
    read_token: SecretStr | None = Field(
        None, description="when set on the service, reading compiled kernels (GET /v1/artifacts "
        "and the other artifact reads) needs 'Authorization: Bearer <token>' with this token or "
        "KS_API_TOKEN; a program without KS_API_TOKEN sends this one")
    prefetch_max_bytes: int = Field(
        256 << 20, gt=0, description="kernelsearch.prefetch() fetches at most this many bytes of "
        "compiled kernels, sized before any is fetched (oldest sets first); the service's "
        "GET /v1/artifacts/device answers at most this many in all")


def client_settings() -> ClientSettings:
    """ClientSettings for the environment as it is now, built once per distinct environment: the
    hooks ask for them on every key, and building them (reading and validating every KS_*
    variable) costs tens of milliseconds. A ValidationError is raised each time, never kept."""
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith("KS_") or k in ("HOME", "XDG_DATA_HOME")))
    return _client_settings_for(env)


@lru_cache(maxsize=8)
def _client_settings_for(env: tuple[tuple[str, str], ...]) -> ClientSettings:
    return ClientSettings()


class Settings(ClientSettings):
    """The API's and the workers' settings: the client's, and the server's own."""

    lease_seconds: float = Field(60.0, gt=0, description="a running job whose worker is silent this long is reclaimed")
    heartbeat_seconds: float = Field(10.0, gt=0, description="how often a worker renews its lease")
    worker_id: str | None = Field(None, description="lease owner name; default host:pid")
    trial_timeout_s: float | None = Field(
        None, gt=0, description="a candidate running longer is killed; unset: 120 s on a GPU, "
                                "600 s under the Triton interpreter")
    max_trials_per_job: int = Field(2000, gt=0)
    max_cases_per_job: int = Field(64, gt=0)
    max_queued_jobs: int = Field(100, gt=0)
    helion_failed_retry_s: float = Field(
        3600.0, ge=0, description="a Helion key whose worker job failed is not queued again for this "
        "long (its misses run the default config meanwhile); 0: queued again on the next miss")
    max_body_bytes: int = Field(64 * 1024, gt=0)
    artifact_max_bytes: int = Field(
        16 << 20, gt=0, le=1 << 30, description="one compiled kernel's files (POST /v1/artifacts), "
        "in bytes; that route's body may be this much plus base64's third")
    prefetch_max_bytes: int = Field(256 << 20, gt=0, description="GET /v1/artifacts/device answers at most this many bytes of files")
    cors_origins: list[str] = Field(default_factory=list, description="empty: CORS off")
    shipped_records: str | None = Field(None, description="records export imported by `make run`")
    log_level: str = "INFO"
    worker_poll_seconds: float = Field(2.0, gt=0, description="an idle worker looks for queued jobs this often")
    capture_import_tries: int = Field(
        3, ge=1, description="a job tuning a captured call is handed back by a worker that cannot "
        "import the kernel's module, and failed (naming the module) at this claim")
    job_max_claims: int = Field(
        3, ge=1, description="a job whose worker went silent (died, hung) this many times is "
        "failed instead of claimed again: a job that kills what runs it fails alone")
    job_max_seconds: float = Field(
        6 * 3600.0, gt=0, description="a running job past this wall-clock time is failed, its "
        "trial child (or Helion job child) killed; a job's own timeout_s may be shorter")
    job_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="module prefixes (comma-separated) whose code a job "
        "may make a worker import: an undeclared kernel's definition, a Helion job; besides the "
        "installed kernelsearch.kernels plugins and KS_KERNEL_MODULES. Empty: those only")
    capture_max_bytes: int | None = Field(
        None, gt=0, description="a captured call's tensors may hold this many bytes at most "
        "(each the larger of its elements and its storage span); unset: a quarter of the "
        "device's memory (the H200's at submit, a worker's own device when it runs the job; "
        "2 GiB on the CPU)")
    capture_max_programs: int | None = Field(
        None, gt=0, description="a captured call's grid may launch this many programs at most "
        "(x*y*z, for every config); unset: 2^24 at submit and on a GPU, 2^16 on the CPU")
    measure_n: int | None = Field(None, gt=0, description="timed calls per trial (median); "
                                                       "unset: 30 on a GPU, 3 under the interpreter")
    cancel_poll_seconds: float = Field(1.0, gt=0, description="how often a worker checks that its "
                                                             "job was cancelled (the trial is then killed)")
    records_check_seconds: float = Field(0.5, gt=0, description="how often /v1/best checks that records changed")
    optuna_dashboard_url: str = Field(
        "http://127.0.0.1:8080", description="where `kernelsearch optuna-dashboard` serves; the case pages link to it")
    tune_reference: Literal["auto", "none", "eager", "both"] = Field(
        "auto", description="references a worker times for speedups; auto: both on a GPU, eager otherwise")
    db_retry_seconds: float = Field(60.0, ge=0, description="a worker retries a transient database "
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
    search_seconds: float = Field(300.0, gt=0, description="a search job's budget per key in seconds")
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

    @field_validator("job_modules", mode="before")
    @classmethod
    def _split_modules(cls, v: Any) -> Any:
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [m.strip() for m in text.split(",") if m.strip()]
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Settings":
        # A lease must outlive a missed heartbeat or two, or two live workers take the same job
        # from each other in turn (a 5 s lease with a 10 s heartbeat never finishes a trial).
        if self.lease_seconds < LEASE_MARGIN * self.heartbeat_seconds:
            raise ValueError(
                f"KS_LEASE_SECONDS ({self.lease_seconds:g}) must be at least {LEASE_MARGIN}x "
                f"KS_HEARTBEAT_SECONDS ({self.heartbeat_seconds:g}), i.e. >= "
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
            loc = ".".join(str(x) for x in err["loc"])
            name = f"KS_{loc.upper()}: " if loc else ""
            lines.append(f"{name}{err['msg'].removeprefix('Value error, ')}")
        raise SettingsError("invalid settings: " + "; ".join(lines)) from None
    try:
        parse_database_url(settings.database_url)
    except DatabaseURLError as exc:
        raise SettingsError(f"invalid settings: KS_DATABASE_URL: {exc}") from None
    return settings


@lru_cache
def get_settings() -> Settings:
    return Settings()
