"""The sources of tuned configs of a user's program behind `kernels.resolve.Resolver`: the local
store (a database, `KS_DATABASE_URL`) and the service (`KS_SERVICE_URL`), either may be off."""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from kernelsearch.kernels.resolve import Found, Key, Match, Near, SourceUnavailable, nearest_of
from kernelsearch.service.client_settings import ClientSettings

from .rest_client import Client, ClientError, ServiceUnreachable

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import ServiceStore

log = logging.getLogger(__name__)


def _timings(rec: Mapping[str, Any]) -> dict[str, Any] | None:
    """A service record's `config_timings` (JSON: an object, or absent)."""
    got = rec.get("config_timings")
    return dict(got) if isinstance(got, Mapping) else None


class ServiceSource:
    """The REST service. Every current record of a (kernel, device) is fetched once per process
    (`/v1/records`), so a program's other shapes are answered without a request each, and the
    nearest of them is still known while the service is down; `fresh` asks `/v1/best` itself."""

    name = "service"

    def __init__(self, client: Client) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._snapshots: dict[tuple[str, str], dict[tuple, dict[str, Any]]] = {}

    def close(self) -> None:
        self.client.close()

    def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """A request; None for the service's own 4xx answer (no record, unknown kernel), and
        `SourceUnavailable` for no answer or a 5xx."""
        try:
            return fn(*args, **kw)
        except ClientError as exc:
            if exc.status == 404 and exc.message.endswith("HTTP 404: Not Found"):
                # The server has no such route: not a kernelsearch service's address, and every
                # lookup would be a silent miss.
                raise SourceUnavailable(
                    f"{self.client.base_url} is not a kernelsearch service's address ({exc.message}):"
                    f" set KS_SERVICE_URL to the address `kernelsearch serve` prints, e.g. "
                    f"http://127.0.0.1:8000") from exc
            if 0 < exc.status < 500:
                return None
            fix = (": start it, or set KS_SERVICE_URL to its address"
                   if isinstance(exc, ServiceUnreachable) else "")
            raise SourceUnavailable(f"service {self.client.base_url}: {exc.message}{fix}") from exc
        except Exception as exc:  # anything else from the transport
            raise SourceUnavailable(f"service {self.client.base_url}: {exc}") from exc

    def _snapshot(self, key: Key) -> dict[tuple, dict[str, Any]]:
        sk = (key.kernel, key.device)
        with self._lock:
            got = self._snapshots.get(sk)
        if got is not None:
            return got
        records = self._call(self.client.records, kernel=key.kernel, device=key.device) or []
        snap = {tuple(sorted(r["case"].items())): r for r in records
                if isinstance(r.get("case"), dict) and isinstance(r.get("config"), dict)}
        with self._lock:
            self._snapshots[sk] = snap
        return snap

    def _remember(self, key: Key, rec: Mapping[str, Any]) -> None:
        case = rec.get("case")
        if isinstance(case, dict):
            with self._lock:
                self._snapshots.setdefault((key.kernel, key.device), {})[
                    tuple(sorted(case.items()))] = dict(rec)

    def _found(self, key: Key, rec: Mapping[str, Any], match: Match, distance: float) -> Found:
        return Found(dict(rec["config"]), match, self.name, rec.get("source_hash"), _timings(rec),
                     dict(rec.get("case") or key.axes_dict), distance, rec)

    def get(self, key: Key, near: Near | None, fresh: bool) -> Found | None:
        if not fresh:
            rec = self._snapshot(key).get(key.axes)
            if rec is not None:
                return self._found(key, rec, Match.EXACT, 0.0)
        got = self._call(self.client.best, key.kernel, key.device, **key.axes_dict)
        if got is None:
            return None
        self._remember(key, got)
        if got.get("match", "exact") == "exact":
            return self._found(key, got, Match.EXACT, 0.0)
        if near is None:
            return None
        case = got.get("case") or {}
        return self._found(key, got, Match.NEAREST, near(dict(case)))

    def known(self, key: Key, near: Near | None) -> Found | None:
        with self._lock:
            snap = dict(self._snapshots.get((key.kernel, key.device), {}))
        pick = nearest_of(key, near, snap)
        if pick is None:
            return None
        axes, dist = pick
        return self._found(key, snap[axes], Match.EXACT if axes == key.axes else Match.NEAREST,
                           dist)


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL (None: another database, or one in memory)."""
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[-1] if "///" in url else ""
    return None if not path or path.startswith(":memory:") else path


def local_store(settings: ClientSettings) -> ServiceStore | None:
    """A Store on the configured database, or None when it would only create an empty file."""
    url = settings.database_url
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is None or not Path(path).exists():
            return None
    try:
        from kernelsearch.db.store import Store

        return Store(url)
    except Exception as exc:
        from kernelsearch.db.engine import redact_url_passwords

        log.warning("local store %s not usable: %s", redact_url_passwords(url), exc)
        return None


def service_client(settings: ClientSettings, timeout: float | None = None) -> Client | None:
    """The service's client with the writer token, when KS_SERVICE_URL is set."""
    if not settings.service_url:
        return None
    secret = settings.api_token or settings.read_token  # the reader's token reads compiled kernels
    token = secret.get_secret_value() if secret else None
    return Client(settings.service_url, token=token,
                  timeout=settings.provider_timeout_s if timeout is None else timeout)
