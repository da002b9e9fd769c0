"""What a key runs (a `Resolution`) and a record's config as this decorator runs it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from triton.runtime.autotuner import Config

from kernelsearch.kernels.configs import LAUNCH_OPTIONS, to_triton_config
from kernelsearch.kernels.resolve import Found

from .options import Source


# -- configs as records hold them -------------------------------------------------------------------
def to_triton(config: Mapping[str, Any], meta_names: frozenset[str],
              listed: Sequence[Config] = ()) -> Config | None:
    """A record's config as a triton.Config (the listed one when equal, keeping its pre_hook);
    None when its meta-parameters are not this kernel's (a record of another version)."""
    if {k for k in config if k not in LAUNCH_OPTIONS} != set(meta_names):
        return None
    return to_triton_config(config, listed)


@dataclass
class Resolution:
    config: Config
    source: Source
    # A nearest record or a fallback: looked up again every recheck_s until a tuned record lands.
    provisional: bool
    next_check: float = 0.0
    pending: bool = False
    found: Found | None = None
    # A key tuned here: its first launch's compiled kernel was handed to kernelsearch.artifacts.
    noted: bool = False
