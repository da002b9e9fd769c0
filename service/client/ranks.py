"""How the ranks of a torch.distributed job agree on a key's config (KS_AUTOTUNE_SYNC=broadcast):
rank 0 resolves it, every rank runs what rank 0 broadcasts."""
from __future__ import annotations

from typing import Any, Sequence

from triton.runtime.autotuner import Config

from kernelsearch.kernels.configs import canonical

from .options import Options, Source, Sync
from .resolution import Resolution, to_triton


def distributed() -> Any | None:
    """torch.distributed when a process group of more than one rank is up, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def synced_ranks(opts: Options) -> bool:
    """Whether this process's keys follow rank 0's broadcast (then never adopt a late answer)."""
    return opts.sync is Sync.BROADCAST and distributed() is not None


def from_rank0(dist: Any, res: Resolution | None, meta_names: frozenset[str],
               configs: Sequence[Config]) -> Resolution:
    """Rank 0's resolution, broadcast: every rank runs the same config for the key."""
    payload: list[Any] = [None if res is None else (canonical(res.config), res.source.value)]
    dist.broadcast_object_list(payload, src=0)
    cfg, source = payload[0]
    config = to_triton(cfg, meta_names, configs) or configs[0]
    return Resolution(config, Source(source) if res is not None else Source.RANK0,
                      provisional=False)
