"""`get_kernel`'s lookups: plug the user program's one resolver (`kernelsearch.backends`: the local
store, then the service, with the decorator's back-off) into `kernels`, so a kernel called without
`config` runs its tuned config (and an exact record's compiled kernel, `kernelsearch.artifacts`)."""
from __future__ import annotations

import logging

from kernelsearch.kernels.provider import set_resolver
from kernelsearch.kernels.resolve import Resolver
from kernelsearch.service.client_settings import ClientSettings

from . import artifacts
from .backends import BACKENDS

log = logging.getLogger(__name__)


def install_default_provider(settings: ClientSettings | None = None) -> Resolver | None:
    """Plug the backends' resolver, built from `settings` (default: the environment's), into
    `kernels`; never raises (a broken setup means defaults)."""
    try:
        BACKENDS.ensure(settings)
        resolver: Resolver | None = BACKENDS.resolver
    except Exception as exc:
        log.warning("no config resolver installed: %s", exc)
        resolver = None
    # An exact record's compiled kernel is installed before the kernel's first launch.
    set_resolver(resolver, on_exact=artifacts.before_first_launch)
    return resolver
