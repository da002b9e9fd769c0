"""A config's one canonical form, and its conversions to and from `triton.Config`.

Configs are flat mappings in the shape of `triton.Config`: the kernel's meta-parameters plus the
launch options of `LAUNCH_OPTIONS`. A `triton.Config` always carries every launch option (its
defaults filled in), while a mapping may leave some out: `canonical` is the one rule between the
two (num_warps, num_stages and num_ctas always, Triton's defaults filled in; maxnreg only where it
is set), so two equal configs compare equal whichever way they were written.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

# Launch options of triton.Config: passed to the launch, not to the kernel as constexprs.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# triton.Config's own defaults (Triton 3.6).
LAUNCH_DEFAULTS: dict[str, Any] = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None}
_ALWAYS = ("num_warps", "num_stages", "num_ctas")


def config_key(config: Mapping[str, Any]) -> str:
    """A mapping's identity: the one canonical text two equal mappings share (store keys, caches)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"))


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta-parameters, launch options), as `triton.Config(kwargs, num_warps=...)` holds them."""
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    launch = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS and v is not None}
    return meta, launch


def canonical(config: Any) -> dict[str, Any]:
    """The canonical form of a `triton.Config` or a mapping: meta-parameters, num_warps,
    num_stages and num_ctas (Triton's defaults where unset), and maxnreg where it is set."""
    if isinstance(config, Mapping):
        meta, launch = split_config(config)
    else:
        meta = dict(config.kwargs)
        launch = {o: getattr(config, o, None) for o in LAUNCH_OPTIONS}
    out = dict(meta)
    for opt in LAUNCH_OPTIONS:
        v = launch.get(opt)
        if v is None:
            v = LAUNCH_DEFAULTS[opt]
        if opt in _ALWAYS or v != LAUNCH_DEFAULTS[opt]:
            out[opt] = v
    return out


def canonical_key(config: Any) -> str:
    """`config_key` of the canonical form: equal for equal configs however they were written."""
    return config_key(canonical(config))


def covers(timings: Mapping[str, Any] | None, winner: Any, configs: Iterable[Any],
           beyond: Iterable[Any] = ()) -> bool:
    """Whether a record (its `config_timings` and its winning config) covers this config list:
    it timed every config of `configs` (a failed one's None counts: it was measured), and its
    winner is one of them or of `beyond` (configs a worker searched past the list: `search_space`,
    or the configs a call's pruner made, `Definition.pruned`). A partly measured list is not
    covered. Configs are compared in canonical form, so order and spelled-out launch defaults do
    not matter. The one rule the decorator and the torch.compile hook hold a served record to."""
    if not timings:
        return False
    listed = {canonical_key(c) for c in configs}
    if not listed or not listed <= set(timings):
        return False
    return canonical_key(winner) in listed | {canonical_key(c) for c in beyond}


def from_triton_config(tc: Any) -> dict[str, Any]:
    """A `triton.Config` as a record holds it (`canonical`)."""
    return canonical(tc)


def to_triton_config(config: Mapping[str, Any], listed: Sequence[Any] = ()) -> Any:
    """A config as a `triton.Config`: the listed one where it is equal (keeping its pre_hook),
    else a new one with Triton's defaults for the launch options it does not set."""
    import triton

    key = canonical_key(config)
    for c in listed:
        if canonical_key(c) == key:
            return c
    meta, launch = split_config(canonical(config))
    return triton.Config(meta, **launch)
