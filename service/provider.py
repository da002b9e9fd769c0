"""`get_kernel`'s lookups: plug the user program's resolver (local store, then service) into
`kernels`, so a kernel called without `config` runs its tuned config."""
from __future__ import annotations

import logging

from kernelsearch.kernels.provider import set_resolver
from kernelsearch.kernels.resolve import Found, Key, Match, Near, Resolver

from .settings import ClientSettings
from .sources import client_resolver

log = logging.getLogger(__name__)


class _InstallingResolver(Resolver):
    """The resolver, and for an exact record the compiled kernel of its config installed into
    the local Triton cache before the kernel's first launch (`kernelsearch.artifacts`; the
    provider asks once per key and process)."""

    def resolve(self, key: Key, near: Near | None = None, fresh: bool = False,
                retry_s: float | None = None) -> Found | None:
        found = super().resolve(key, near=near, fresh=fresh, retry_s=retry_s)
        if found is not None and found.match is Match.EXACT:
            from kernelsearch import artifacts

            artifacts.before_first_launch(key.kernel, found)
        return found


def install_default_provider(settings: ClientSettings | None = None) -> Resolver | None:
    """Plug the settings' resolver into `kernels`; never raises (a broken setup means defaults)."""
    try:
        st = settings if settings is not None else ClientSettings()
        base = client_resolver(st, retry_s=30.0)
        resolver: Resolver | None = _InstallingResolver(base.sources, retry_s=base.retry_s)
    except Exception as exc:
        log.warning("no config resolver installed: %s", exc)
        resolver = None
    set_resolver(resolver)
    return resolver
