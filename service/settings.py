"""Every setting of the service, read from KS_* environment variables (pydantic-settings)."""
from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KS_", extra="ignore")

    database_url: str = Field("sqlite:///var/kernelsearch.db",
                              description="SQLAlchemy URL; postgresql+psycopg://... for PostgreSQL")
    api_token: SecretStr | None = Field(None, description="when set, writes need 'Authorization: Bearer <token>'")
    lease_seconds: float = Field(60.0, gt=0, description="a running job whose worker is silent this long is reclaimed")
    heartbeat_seconds: float = Field(10.0, gt=0, description="how often a worker renews its lease")
    service_url: str | None = Field(None, description="when set, kernels ask this service for configs")
    worker_id: str | None = Field(None, description="lease owner name; default host:pid")
    trial_timeout_s: float | None = Field(
        None, gt=0, description="a candidate running longer is killed; unset: 120 s on a GPU, "
                                "600 s under the Triton interpreter")
    max_trials_per_job: int = Field(2000, gt=0)
    max_cases_per_job: int = Field(64, gt=0)
    max_queued_jobs: int = Field(100, gt=0)
    max_body_bytes: int = Field(64 * 1024, gt=0)
    cors_origins: list[str] = Field(default_factory=list, description="empty: CORS off")
    shipped_records: str | None = Field(None, description="records export imported by `make run`")
    log_level: str = "INFO"
    provider_timeout_s: float = Field(0.5, gt=0, description="kernels' lookups give the service this long")
    worker_poll_seconds: float = Field(2.0, gt=0, description="an idle worker looks for queued jobs this often")
    measure_n: int | None = Field(None, gt=0, description="timed calls per trial (median); "
                                                       "unset: 30 on a GPU, 3 under the interpreter")
    cancel_poll_seconds: float = Field(1.0, gt=0, description="how often a worker checks that its "
                                                             "job was cancelled (the trial is then killed)")
    records_check_seconds: float = Field(0.5, gt=0, description="how often /v1/best checks that records changed")
    optuna_dashboard_url: str = Field(
        "http://127.0.0.1:8080", description="where `kernelsearch optuna-dashboard` serves; the case pages link to it")
    tune_reference: Literal["auto", "none", "eager", "both"] = Field(
        "auto", description="references a worker times for speedups; auto: both on a GPU, eager otherwise")


@lru_cache
def get_settings() -> Settings:
    return Settings()
