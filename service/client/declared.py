"""A decorated kernel's declaration (`Autotuner.declare`): the KernelDef a worker tunes when it
imports the module that declares the kernel, built from the decorator's configs and the user's
input makers, launcher and reference."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from triton.runtime.autotuner import Config

from kernelsearch.kernels.capture import jit_function_of
from kernelsearch.kernels.configs import LAUNCH_DEFAULTS, LAUNCH_OPTIONS, canonical, canonical_key
from kernelsearch.kernels.resolve import Key
from kernelsearch.kernels.runtime import runtime_of
from kernelsearch.kernels.spec import Axis, Case, KernelDef, configs_rule, params_from_configs
from kernelsearch.kernels.undeclared import DTYPE_AXIS_SUFFIX, dtype_axis

from .backends import BACKENDS, in_daemon_thread
from .launch import CAPTURE, Captured, Using
from .options import Options

MAX_AXIS = 2**31 - 1


# -- the KernelDef of a decorated kernel (the one place that adapts to kernels.spec) ---------------
@dataclass(frozen=True, eq=False)
class DecoratedKernel(KernelDef):
    """A KernelDef whose search space is a decorator's list of configs."""

    autotuner: Any = field(default=None, repr=False)
    # Arguments of the Triton kernel whose dtypes the declaration covers (others: not looked up).
    dtypes: Mapping[str, Any] = field(default_factory=dict)
    # The user's own launcher, `launch(*inputs)`, that calls the decorated kernel.
    user_launch: Callable[..., Any] | None = field(default=None, repr=False)

    @property
    def space_configs(self) -> tuple[dict[str, Any], ...]:
        """The searched configs, as records hold them, in the decorator's order (`space`)."""
        return tuple(dict(c) for c in self.space)

    def case_key_of(self, named: Mapping[str, Any]) -> Key | None:
        from kernelsearch.kernels.device import device_name

        axes: dict[str, Any] = {}
        for a in self.axes:
            if a.categorical:  # a dtype axis (`declare(dtypes={arg: [...]})`)
                dt = getattr(named.get(a.name.removesuffix(DTYPE_AXIS_SUFFIX)), "dtype", None)
                name = str(dt).removeprefix("torch.")
                if dt is None or name not in a.choices:
                    return None
                axes[a.name] = name
                continue
            v = named.get(a.name)
            if isinstance(v, bool) or not isinstance(v, int) or not a.minimum <= v <= a.maximum:
                return None
            axes[a.name] = int(v)
        for arg, dtype in self.dtypes.items():
            t = named.get(arg)
            if getattr(t, "dtype", None) != dtype:
                return None
        device = next((t.device for t in named.values() if hasattr(t, "device")), None)
        return Key(self.name, tuple(sorted(axes.items())), device_name(device))

    def configs_for_case(self, axes: Mapping[str, int]) -> list[dict[str, Any]]:
        """The space of one case: the configs the decorator's pruning keeps for its inputs."""
        tuner = self.autotuner
        if tuner._user_early_prune is None and tuner.perf_model is None:
            return [dict(c) for c in self.space_configs]
        named = self.named_args_for(axes)
        tuner.nargs = {k: v for k, v in named.items() if k in tuner.arg_names}
        try:
            extra = {k: v for k, v in named.items() if k not in tuner.arg_names}
            pruned = tuner.prune_configs(extra)
        finally:
            tuner.nargs = None
        keep = {canonical_key(c) for c in pruned}
        out = [dict(c) for c in self.space_configs if canonical_key(c) in keep]
        return out or [dict(c) for c in self.space_configs]

    def named_args_for(self, axes: Mapping[str, int]) -> dict[str, Any]:
        """The Triton kernel's named arguments for a case, captured from one launcher call that
        stops at the launch."""
        if self.user_launch is None:
            raise RuntimeError(f"{self.name}: declared without a launch to capture arguments from")
        inputs = self.empty_inputs(axes, "cpu")
        with Using(self.autotuner, CAPTURE):
            try:
                self.user_launch(*inputs)
            except Captured as got:
                return dict(got.args[0])
        raise RuntimeError(f"{self.name}: the declared launch did not call the kernel")

    def record_of(self, case: Key, config: Mapping[str, Any], timing: Any, checked: Any,
                  n_trials: int, device: Any) -> Any:
        """A record of a config tuned in a user's process: gated and timed as a worker's."""
        from kernelsearch.kernels.device import device_info, versions
        from kernelsearch.search_space.records import measured_record

        v = versions()
        return measured_record(
            self, case.axes_dict, case.device, device_info=device_info(device),
            torch_version=v["torch"], triton_version=v["triton"], config=config,
            latency_median_us=timing.median_us, latency_min_us=timing.min_us,
            latency_max_us=timing.max_us, latency_iqr_us=timing.iqr_us,
            timing_method=timing.method, rel_error=checked.max_error, n_trials=n_trials,
            study_name="tuned-here")


def _as_cases(cases: Iterable[Any], axis_names: Sequence[str]) -> tuple[Case, ...]:
    out = []
    for i, c in enumerate(cases, start=1):
        if isinstance(c, Case):
            out.append(c)
            continue
        axes = dict(c) if isinstance(c, Mapping) else dict(zip(axis_names, c))
        if set(axes) != set(axis_names):
            raise ValueError(f"cases[{i - 1}]: expected axes {list(axis_names)}, got {axes}")
        out.append(Case(number=i, axes={k: int(v) for k, v in axes.items()}))
    return tuple(out)


def declare(tuner: Any, *, name: str | None = None, launch: Callable[..., Any],
            make_inputs: Callable[..., Sequence[Any]], axes: Sequence[str | Axis],
            input_names: Sequence[str], output_names: Sequence[str],
            bytes_moved: Callable[[Mapping[str, int]], int], rtol: float,
            cases: Iterable[Any] = (), reference: Callable[..., Any] | None = None,
            torch_reference: Callable[..., Any] | None = None,
            axes_of: Callable[..., Mapping[str, int]] | None = None,
            check_inputs: Callable[..., None] | None = None,
            flops: Callable[[Mapping[str, int]], int] | None = None,
            dtypes: Mapping[str, Any] | None = None,
            output_dtypes: Callable[[Mapping[str, int]], Sequence[Any]] | None = None,
            tolerance: Callable[[Mapping[str, int]], float] | None = None,
            search_space: Sequence[Config] | None = None,
            description: str = "", benchmark_problem: str = "",
            register: bool = True, module: str | None = None) -> DecoratedKernel:
    """The KernelDef of a decorated kernel, registered so that a worker importing the calling
    module tunes it. `launch(*inputs)` is the user's own function that calls the kernel;
    `make_inputs(axes, seed=, distribution=, device=)` draws a case's inputs; `reference(*inputs)`
    gives the outputs to compare with (default: the first config's); `axes` name arguments of the
    Triton kernel whose values key a record; `dtypes` the tensor arguments' dtypes it covers (a
    list of dtypes for an argument makes a categorical axis `<arg>.dtype`, so one declaration
    serves each of them);
    `search_space` what a worker searches (default: the decorator's configs); `module` the
    module a worker imports to see the declaration (default: the caller's)."""
    kname = name or tuner.kernel_name or f"{tuner.base_fn.__module__}.{tuner.base_fn.__name__}"
    axis_defs = tuple(a if isinstance(a, Axis) else Axis(str(a), 1, MAX_AXIS) for a in axes)
    for a in axis_defs:
        if a.name not in tuner.arg_names:
            raise ValueError(f"axes: {a.name!r} is not an argument of {tuner.base_fn.__name__} "
                             f"({', '.join(tuner.arg_names)})")
    # dtypes: one dtype per argument (calls of other dtypes are not this declaration's), or a
    # list of them: a categorical axis `<arg>.dtype`, so one declaration keys each dtype's record.
    fixed_dtypes: dict[str, Any] = {}
    for arg, dt in (dtypes or {}).items():
        if arg not in tuner.arg_names:
            raise ValueError(f"dtypes: {arg!r} is not an argument of {tuner.base_fn.__name__}")
        if isinstance(dt, (list, tuple)):
            if not dt:
                raise ValueError(f"dtypes: {arg!r} lists no dtype")
            axis_defs += (Axis(dtype_axis(arg), doc=f"dtype of {arg}",
                               choices=tuple(str(d).removeprefix("torch.") for d in dt)),)
        else:
            fixed_dtypes[arg] = dt
    space = [canonical(c) for c in (search_space or [*tuner.configs, *tuner.search_space])]
    if not space:
        raise ValueError("search_space: give at least one triton.Config")
    # Every config names the same launch options, so that the kernel's validated (complete)
    # form of a config is the listed one.
    opts = [o for o in LAUNCH_OPTIONS if any(o in c for c in space)]
    space = [{**c, **{o: c.get(o, LAUNCH_DEFAULTS[o]) for o in opts}} for c in space]
    module = module or sys._getframe(1).f_globals.get("__name__", launch.__module__)
    first = tuner.configs[0]
    ref_fn = reference or tuner.reference

    def kd_launch(*inputs: Any, config: Mapping[str, Any], out: Sequence[Any] | None = None) -> tuple:
        with tuner.using(config):
            got = launch(*inputs)
        runtime_of(kdef).last_compiled = getattr(tuner, "last_launch", None)
        outs = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        if out is not None:
            for o, g in zip(out, outs):
                o.copy_(g)
            return tuple(out)
        return outs

    def first_config_reference(*inputs: Any) -> tuple:
        outs = kd_launch(*[t.clone() for t in inputs], config=canonical(first))
        return tuple(o.double() for o in outs)

    def kd_reference(*inputs: Any) -> tuple:
        if ref_fn is None:
            return first_config_reference(*inputs)
        got = ref_fn(*inputs)
        outs = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        return tuple(o.double() for o in outs)

    def kd_torch_reference(*inputs: Any) -> tuple:
        got = torch_reference(*inputs) if torch_reference is not None else ()
        return tuple(got) if isinstance(got, (tuple, list)) else (got,)

    def kd_axes_of(*inputs: Any) -> dict[str, int]:
        if axes_of is None:
            raise NotImplementedError(f"{kname}: the declaration gives no axes_of")
        return dict(axes_of(*inputs))

    kd_launch.__module__ = module
    kdef = DecoratedKernel(
        name=kname, description=description or (tuner.base_fn.__doc__ or "").strip().split("\n")[0],
        benchmark_problem=benchmark_problem, axes=axis_defs, params=params_from_configs(space),
        cases=_as_cases(cases, [a.name for a in axis_defs]), input_names=tuple(input_names),
        output_names=tuple(output_names), rtol=float(rtol), make_inputs=make_inputs,
        reference=kd_reference if ref_fn is not None else first_config_reference,
        # No torch_reference, no speedups: timing the float64 reference instead says nothing.
        torch_reference=kd_torch_reference if torch_reference is not None else None, launch=kd_launch, axes_of=kd_axes_of,
        bytes_moved=bytes_moved, check_inputs=check_inputs or (lambda *i: None),
        rules=configs_rule(space), autotuner=tuner, space=tuple(space),
        triton_kernels=(jit_function_of(tuner),),
        dtypes=fixed_dtypes, flops=flops, user_launch=launch, output_dtypes=output_dtypes,
        tolerance=tolerance)
    tuner.kernel_name = kname
    tuner.kernel_def = kdef
    if Options.from_env().prepare:
        in_daemon_thread(BACKENDS.prepare)
    if register:
        from kernelsearch.kernels.registry import register as reg

        reg(kdef, replace=True)
    return kdef
