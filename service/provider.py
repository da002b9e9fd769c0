"""Config providers that connect `kernels` to the store: the local database or the service.

A kernel called without `config` asks `kernels.provider.lookup`, which asks the provider plugged
in here. Nothing in this module lets a lookup fail a user's call: the service being down means
the nearest case this process already knows, then the local store, then the kernel's default.
A provider answers None only when a working store has no record; a failure raises
(`ProviderUnavailable` or the store's own error), so `kernels.provider` never caches it as a miss.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from kernelsearch.kernels import get_kernel, set_provider
from kernelsearch.kernels import provider as kprovider
from kernelsearch.kernels.provider import ProviderUnavailable

from .client import Client, ClientError
from .settings import ClientSettings
from .views import case_work

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import RecordRepository

log = logging.getLogger(__name__)


class StoreProvider:
    """Answers from a database through `db.store.Store.find_best` (exact case, else nearest)."""

    def __init__(self, store: RecordRepository) -> None:
        self.store = store

    def best_config(self, kernel: str, axes: Mapping[str, int], device: str) -> dict[str, Any] | None:
        """The store's record; a store error propagates (kernels.provider logs it and does not
        cache it: the database may come back)."""
        kdef = get_kernel(kernel)
        found = self.store.find_best(kernel, device, dict(axes),
                                     distance=lambda other, _w: kdef.distance(axes, other))
        if found is None:
            return None
        record, match = found
        config = dict(record.config)
        return config


class ServiceProvider:
    """Asks the REST service with a short timeout; remembers what it learnt for when it is down.

    After a failure the service is not asked again for `retry_after_s` seconds, so a dead service
    costs one timeout, not one per call. While it is down the answer is the nearest case (in work)
    among the records this process has seen for that kernel and device, then `fallback`.
    """

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 0.5,
                 fallback: Any | None = None, retry_after_s: float = 30.0) -> None:
        self.url = url
        self.client = Client(url, token=token, timeout=timeout)
        self.fallback = fallback
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._degraded = False
        # (kernel, device) -> {axes tuple: (work, config)}: every record this process was told of.
        self._known: dict[tuple[str, str], dict[tuple, tuple[int, dict[str, Any]]]] = {}
        self._listed: set[tuple[str, str]] = set()

    def close(self) -> None:
        self.client.close()

    def best_config(self, kernel: str, axes: Mapping[str, int], device: str) -> dict[str, Any] | None:
        axes = dict(axes)
        if time.monotonic() >= self._down_until:
            try:
                return self._ask(kernel, axes, device)
            except ClientError as exc:
                if 0 < exc.status < 500:
                    return None  # the service is up and has no answer (no record, bad axes)
                log.warning("kernelsearch service %s unavailable (%s); using local fallback",
                            self.url, exc.message)
                with self._lock:
                    self._down_until = time.monotonic() + self.retry_after_s
                    self._degraded = True
        return self._offline(kernel, axes, device)

    def _ask(self, kernel: str, axes: dict[str, int], device: str) -> dict[str, Any]:
        got = self.client.best(kernel, device, **axes)
        config = dict(got["config"])
        answer = config
        key = (kernel, device)
        with self._lock:
            recovered, self._degraded = self._degraded, False
            known = self._known.setdefault(key, {})
            case = got.get("case") or axes
            known[tuple(sorted(case.items()))] = (case_work(kernel, case), config)
            first = key not in self._listed
            self._listed.add(key)
        if recovered:
            # Answers cached by `kernels` while we were down were fallbacks: ask again from now on.
            kprovider.clear_cache()
        if first:
            self._learn(kernel, device)
        return answer

    def _learn(self, kernel: str, device: str) -> None:
        """Remember every record of this kernel and device, so a later outage still has neighbours."""
        try:
            records = self.client.records(kernel=kernel, device=device)
        except ClientError:
            return
        with self._lock:
            known = self._known.setdefault((kernel, device), {})
            for r in records:
                case = r.get("case")
                if isinstance(case, dict) and isinstance(r.get("config"), dict):
                    try:
                        known[tuple(sorted(case.items()))] = (case_work(kernel, case), dict(r["config"]))
                    except (KeyError, TypeError, ValueError):
                        continue

    def _offline(self, kernel: str, axes: dict[str, int], device: str) -> dict[str, Any] | None:
        with self._lock:
            known = dict(self._known.get((kernel, device), {}))
        if known:
            exact = known.get(tuple(sorted(axes.items())))
            if exact is not None:
                return dict(exact[1])
            kdef = get_kernel(kernel)
            dist, case = min((kdef.distance(axes, dict(c)), c) for c in known)
            if not math.isfinite(dist):
                return None
            return dict(known[case][1])
        if self.fallback is not None:
            got = self.fallback.best_config(kernel, axes, device)  # its failure propagates
            if got is not None:
                return got
        # Nothing known while the service is down: not an answer to remember.
        raise ProviderUnavailable(f"service {self.url} unavailable and no local answer for {kernel}")


def _local_store(settings: ClientSettings) -> RecordRepository | None:
    """A Store on the configured database, or None when it would only create an empty file."""
    url = settings.database_url
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1] if "///" in url else ""
        if not path or path.startswith(":memory:") or not Path(path).exists():
            return None
    try:
        from kernelsearch.db.store import Store

        return Store(url)
    except Exception as exc:
        from kernelsearch.db.engine import redact_url_passwords

        log.warning("local store %s not usable: %s", redact_url_passwords(url), exc)
        return None


def make_provider(settings: ClientSettings) -> StoreProvider | ServiceProvider | None:
    """The provider the settings ask for: the service when KS_SERVICE_URL is set, else the local db."""
    local = _local_store(settings)
    fallback = StoreProvider(local) if local is not None else None
    if settings.service_url:
        token = settings.api_token.get_secret_value() if settings.api_token else None
        return ServiceProvider(settings.service_url, token=token,
                               timeout=settings.provider_timeout_s, fallback=fallback)
    return fallback


def install_default_provider(settings: ClientSettings | None = None) -> StoreProvider | ServiceProvider | None:
    """Plug the right provider into `kernels`; never raises (a broken setup means defaults)."""
    try:
        provider = make_provider(settings if settings is not None else ClientSettings())
    except Exception as exc:
        log.warning("no config provider installed: %s", exc)
        provider = None
    set_provider(provider)
    return provider
