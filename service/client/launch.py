"""Launches of one chosen config, as Triton's benchmark runs a candidate (the config's and the
user's hooks, reset_to_zero around the launch): a config forced on every call of a block
(`Autotuner.using`, the tuner's launches), one that stops at the launch with its arguments
(a declaration's capture), and one alone that touches no shared state (the share check)."""
from __future__ import annotations

import threading
from typing import Any, Callable

from triton.runtime.autotuner import Autotuner as TritonAutotuner
from triton.runtime.autotuner import Config

FORCED = threading.local()

CAPTURE = object()  # forced "config" that stops a call at its launch with its arguments


class Captured(Exception):
    """Carries a launch's named arguments out of the user's launcher (`named_args_for`)."""



def hooked_launch(tuner: Any, config: Config, args: tuple, kwargs: dict,
                  pre: Callable[..., Any], post: Callable[..., Any]) -> Any:
    """One launch of `config` between hooks, as Triton's benchmark runs a candidate: the
    config's pre_hook, then `pre`, the launch, and `post` (told the launch's exception)."""
    current = dict(kwargs, **config.all_kwargs())
    full = {**dict(zip(tuner.arg_names, args)), **current}
    if config.pre_hook:
        config.pre_hook(full)
    pre(full)
    try:
        ret = tuner.fn.run(*args, **current)
    except Exception as exc:
        post(full, exception=exc)
        raise
    post(full, exception=None)
    return ret


def launch_alone(tuner: TritonAutotuner, config: Config, args: tuple, kwargs: dict) -> Any:
    """`hooked_launch` with the user's hooks and reset_to_zero, touching no state the autotuner
    shares with calls on other threads (its `nargs`, its restore copies): the share check runs
    in the background."""
    def pre(full: dict[str, Any]) -> None:
        if tuner.user_defined_pre_hook:
            tuner.pre_hook(full)
        for name in tuner.reset_to_zero:
            if full.get(name) is not None:
                full[name].zero_()

    def post(full: dict[str, Any], exception: BaseException | None) -> None:
        if tuner.user_defined_post_hook:
            tuner.post_hook(full, exception=exception)

    return hooked_launch(tuner, config, args, kwargs, pre, post)


def run_forced(tuner: Any, config: Config | object, args: tuple, kwargs: dict) -> Any:
    """A call under `Autotuner.using`: `hooked_launch` with the autotuner's own hooks (its
    reset_to_zero and restore_value); a captured "config" stops at the launch instead."""
    if config is CAPTURE:
        raise Captured({**dict(zip(tuner.arg_names, args)), **kwargs})
    if not isinstance(config, Config):
        raise TypeError(f"a forced launch needs a triton.Config, got {type(config).__name__}")
    outer = getattr(tuner, "nargs", None)  # a forced launch may run inside a call's resolution
    tuner.nargs = dict(zip(tuner.arg_names, args))
    try:
        ret = hooked_launch(tuner, config, args, kwargs, tuner.pre_hook, tuner.post_hook)
        tuner.best_config = config
        tuner.last_launch = ret
        return ret
    finally:
        tuner.nargs = outer  # None outside a call, as Triton keeps it


class Using:
    def __init__(self, tuner: Any, config: Config | object) -> None:
        self.tuner, self.config = tuner, config

    def __enter__(self) -> Any:
        d = getattr(FORCED, "configs", None)
        if d is None:
            d = FORCED.configs = {}
        self._prev = d.get(id(self.tuner))
        d[id(self.tuner)] = self.config
        return self.config

    def __exit__(self, *exc: object) -> None:
        d = FORCED.configs
        if self._prev is None:
            d.pop(id(self.tuner), None)
        else:
            d[id(self.tuner)] = self._prev
