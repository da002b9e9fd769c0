"""`get_kernel`'s lookups: plug the user program's resolver (local store, then service) into
`kernels`, so a kernel called without `config` runs its tuned config."""
from __future__ import annotations

import logging

from kernelsearch.kernels.provider import set_resolver
from kernelsearch.kernels.resolve import Resolver

from kernelsearch.service.settings import ClientSettings
from .sources import client_resolver

log = logging.getLogger(__name__)


def install_default_provider(settings: ClientSettings | None = None) -> Resolver | None:
    """Plug the settings' resolver into `kernels`; never raises (a broken setup means defaults)."""
    try:
        st = settings if settings is not None else ClientSettings()
        resolver: Resolver | None = client_resolver(st, retry_s=30.0)
    except Exception as exc:
        log.warning("no config resolver installed: %s", exc)
        resolver = None
    set_resolver(resolver)
    return resolver
