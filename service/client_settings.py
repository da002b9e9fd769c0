"""The settings a user's program reads (KS_* environment variables, pydantic-settings): where
the store and the service are, the autotune policy, and the limits a job or a kept call must
keep when the program queues into its local store (`JobLimits`, the service's own too). The
server's settings (service/settings.py) extend these; a user's program never reads the
server's, so a server-only value there (KS_LEASE_S) is no concern of the decorator's."""
from __future__ import annotations

import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

log = logging.getLogger(__name__)


def default_database_url() -> str:
    """SQLite in the user's data directory ($XDG_DATA_HOME/kernelsearch, else
    ~/.local/share/kernelsearch): one absolute place, so a program reads the same store from any
    working directory. `make run` sets KS_DATABASE_URL to the checkout's ./var instead."""
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return f"sqlite:///{(root / 'kernelsearch' / 'kernelsearch.db').as_posix()}"


def seconds_alias(field: str) -> AliasChoices:
    """A duration's variable: KS_<NAME>_S, and its older KS_<NAME>_SECONDS still read (with a
    warning, `warn_deprecated_names`): one suffix for seconds across the settings."""
    base = field.removesuffix("_seconds").upper()
    return AliasChoices(f"KS_{base}_S", f"KS_{base}_SECONDS", field)


def env_names(cls: type[BaseSettings], field: str) -> list[str]:
    """The variables that set `field` of `cls`, the current one first."""
    alias = cls.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return [a for a in alias.choices if isinstance(a, str) and a.startswith("KS_")]
    return [f"KS_{field.upper()}"]


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The variable that sets `field` of `cls`."""
    return env_names(cls, field)[0]


def field_of(cls: type[BaseSettings], loc: str) -> str | None:
    """The field a validation error's location names (a field's name, or one of its variables)."""
    if loc in cls.model_fields:
        return loc
    return next((f for f in cls.model_fields if loc in env_names(cls, f)), None)


def warn_deprecated_names(cls: type[BaseSettings]) -> None:
    """One WARNING per older variable name set (KS_LEASE_SECONDS for KS_LEASE_S): it is still read."""
    for field in cls.model_fields:
        current, *older = env_names(cls, field)
        for old in older:
            if old in os.environ:
                log.warning("%s is deprecated: it is read as %s, the name to use", old, current)


class ClientSettings(BaseSettings):
    """What a user's program reads: the store, the service and its token, the decorator's policy."""

    model_config = SettingsConfigDict(env_prefix="KS_", extra="ignore", populate_by_name=True)

    database_url: str = Field(default_factory=lambda: default_database_url(),
                              description="SQLAlchemy URL; postgresql+psycopg://... for PostgreSQL; "
                                          "default: a SQLite file in the user's data directory")
    api_token: SecretStr | None = Field(None, description="when set, writes need 'Authorization: Bearer <token>'")
    service_url: str | None = Field(None, description="when set, kernels ask this service for configs")
    provider_timeout_s: float = Field(
        0.5, gt=0, description="get_kernel's provider waits this long for a lookup. Each of the "
        "three lookup bounds (this, KS_AUTOTUNE_TIMEOUT_S, KS_HELION_TIMEOUT_S) is how long its "
        "caller waits; the one service client they share cuts a request at the largest")
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
        "list: on, off (the list's best by the record's timings), or auto: on for declared "
        "kernels, and for undeclared ones when the strict gate ran over the key's edges and the "
        "re-measured gain's lower bound is above 1.0")
    autotune_search_space: Literal["", "list", "derived"] = Field(
        "", description="derived: every kernel this program decorates or manages (the swap and "
        "Triton's cache manager included) sends the derived space with its captures, so workers "
        "search beyond its list without search_space= in code; list or empty: the list only")
    search_max_configs: int = Field(256, gt=0, le=4096, description="@kernelsearch.autotune("
                                    "search_space='derived'): at most this many configs beyond "
                                    "the list go to the workers (a seeded sample of the derived space)")
    helion_timeout_s: float = Field(2.0, gt=0, le=60, description="kernelsearch.helion: Helion's cache "
                                    "read, write or list waits this long at most (a miss costs minutes of tuning)")
    kernel_modules: str = Field("", description="modules (comma-separated) that declare kernels, "
                                "imported by every kernelsearch process (as --kernel-module)")
    prefetch: Literal["", "0", "1"] = Field("", description="kernelsearch.artifacts, 1: fetch "
                                            "this device's compiled kernels in the background "
                                            "at the first lookup")
    artifact_env: str | None = Field(None, description="kernelsearch.artifacts: the environment "
                                     "fingerprint's fields (JSON) instead of this host's")
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
    variable) costs tens of milliseconds. A bad value never switches kernelsearch off in a
    user's program: it is warned about once (`with_defaults`) and its default is used."""
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith("KS_") or k in ("HOME", "XDG_DATA_HOME")))
    return _client_settings_for(env)


@lru_cache(maxsize=8)
def _client_settings_for(env: tuple[tuple[str, str], ...]) -> ClientSettings:
    try:
        return ClientSettings()
    except ValidationError as exc:
        return with_defaults(ClientSettings, exc)


S = TypeVar("S", bound=BaseSettings)


def accepted_text(cls: type[BaseSettings], name: str) -> str:
    """What field `name` of `cls` accepts, in words a user can act on."""
    field = cls.model_fields[name]
    ann = field.annotation
    if get_origin(ann) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(ann))
    if ann is bool:
        return "true or false (1/0, yes/no, on/off)"
    if ann in (int, float) or set(get_args(ann)) & {int, float}:
        kind = "an integer" if ann is int else "a number"
        bounds = [f"{op} {getattr(m, attr)}" for m in field.metadata
                  for attr, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
                  if getattr(m, attr, None) is not None]
        return " ".join([kind, " and ".join(bounds)]).strip()
    return "a valid value"


def with_defaults(cls: type[S], exc: ValidationError) -> S:
    """`cls` with each field `exc` refused set to its default, one WARNING per such field naming
    the variable, its value, what it accepts and what is used instead. Raises `exc` again when a
    refusal is not one field's (the server's cross-field checks)."""
    bad: dict[str, str] = {}
    for err in exc.errors():
        name = field_of(cls, str(err["loc"][0])) if err.get("loc") else None
        if name is None:
            raise exc
        bad.setdefault(name, err["msg"])
    defaults = {n: cls.model_fields[n].get_default(call_default_factory=True) for n in bad}
    for name in bad:
        var = next((v for v in env_names(cls, name) if v in os.environ), env_name(cls, name))
        shown = "(hidden)" if isinstance(defaults[name], SecretStr) or name == "api_token" \
            else repr(os.environ.get(var, ""))
        used = "unset" if defaults[name] is None else repr(defaults[name])
        log.warning("%s=%s is not accepted (accepted: %s); using the default, %s", var, shown,
                    accepted_text(cls, name), used)
    return cls(**defaults)


class JobLimits(BaseSettings):
    """What a job or a kept call may ask of the workers: checked by the service's routes, and by
    a user's program that queues into its local store (the same rules, whoever queues)."""

    model_config = SettingsConfigDict(env_prefix="KS_", extra="ignore", populate_by_name=True)

    max_trials_per_job: int = Field(2000, gt=0, description="a job may ask for at most this many trials")
    max_cases_per_job: int = Field(64, gt=0, description="a job may tune at most this many cases")
    max_queued_jobs: int = Field(100, gt=0, description="a new job is refused (429) while this many are queued")
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


def job_limits() -> JobLimits:
    """JobLimits for the environment as it is now (a bad value: warned about, its default used)."""
    try:
        return JobLimits()
    except ValidationError as exc:
        return with_defaults(JobLimits, exc)
