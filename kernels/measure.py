"""Timing as the benchmark times: cold L2, GPU span of the call's kernels from CUPTI, median.

Each timed call is preceded by a flush kernel of our own that writes twice the L2's size; the
profiler's device records are split at those flushes, and a call's time is the span from its
first kernel's start to its last kernel's end (memsets and copies included). Under the Triton
interpreter the same API returns wall-clock figures labelled as such, never mixed with GPU ones.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence, cast

import torch
import triton
import triton.language as tl

from .device import default_device, is_interpreter
from .spec import Axes, KernelDef

CUPTI = "cupti"
WALLCLOCK = "interpreter-wallclock"
FLUSH_KERNEL = "_ks_l2_flush"
# Timed calls per measurement. The interpreter runs a call in seconds (B: about 2-3 s), so 30 of
# them alone pass a trial's time limit; its wall-clock medians only need to rank configs roughly.
GPU_REPEATS = 30
INTERPRETER_REPEATS = 3


def default_repeats(interpreter: bool | None = None) -> int:
    """Timed calls that fit the device (`interpreter`: None asks kernels.device)."""
    if interpreter is None:
        interpreter = is_interpreter()
    return INTERPRETER_REPEATS if interpreter else GPU_REPEATS


@dataclass
class Timing:
    median_us: float
    min_us: float
    max_us: float
    q1_us: float
    q3_us: float
    n: int
    method: str
    samples_us: list[float] = field(default_factory=list, repr=False)

    @property
    def iqr_us(self) -> float:
        return self.q3_us - self.q1_us

    def as_dict(self, samples: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d["iqr_us"] = self.iqr_us
        if not samples:
            d.pop("samples_us")
        return d

    @classmethod
    def of(cls, samples_us: list[float], method: str) -> "Timing":
        s = sorted(samples_us)
        if len(s) >= 2:
            q1, _, q3 = statistics.quantiles(s, n=4, method="inclusive")
        else:
            q1 = q3 = s[0]
        return cls(median_us=statistics.median(s), min_us=s[0], max_us=s[-1], q1_us=q1, q3_us=q3,
                   n=len(s), method=method, samples_us=list(samples_us))


@triton.jit
def _ks_l2_flush(ptr, n, val, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs, val, mask=offs < n)


_flush_bufs: dict[str, torch.Tensor] = {}


def _flush(device: torch.device, i: int) -> None:
    buf = _flush_bufs.get(str(device))
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        buf = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)
        _flush_bufs[str(device)] = buf
    n = buf.numel()
    _ks_l2_flush[(triton.cdiv(n, 4096),)](buf, n, float(i), BLOCK=4096, num_warps=8)


def wallclock_us(fn: Callable[[], Any], n: int) -> list[float]:
    """`n` wall-clock spans of `fn` in microseconds, after one untimed call: the one timer where
    no GPU span exists (the Triton interpreter, the CPU)."""
    fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples


def time_call(fn: Callable[[], Any], *, n: int = 30, warmup: int = 3,
              device: torch.device | None = None, flush_l2: bool = True) -> Timing:
    """Median GPU span of `fn` over `n` calls with a cold L2 (wall clock under the interpreter)."""
    return time_calls([fn], n=n, warmup=warmup, device=device, flush_l2=flush_l2)[0]


def time_calls(fns: list[Callable[[], Any]], *, n: int = 30, warmup: int = 3,
               device: torch.device | None = None, flush_l2: bool = True) -> list[Timing]:
    """`time_call` for several callables under one profiler session (cheaper for sweeps)."""
    if n < 1:
        raise ValueError("n: need at least one timed call")
    device = device or default_device()
    if device.type != "cuda":
        return [Timing.of(wallclock_us(fn, n), WALLCLOCK) for fn in fns]
    from torch.profiler import ProfilerActivity, profile

    for fn in fns:
        for i in range(warmup):
            if flush_l2:
                _flush(device, i)
            fn()
    _flush(device, 0)
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for fn in fns:
            for i in range(n):
                _flush(device, i)
                fn()
        _flush(device, n)
        torch.cuda.synchronize(device)
    spans = _spans_us(prof, n * len(fns))
    return [Timing.of(spans[j * n:(j + 1) * n], CUPTI) for j in range(len(fns))]


def _spans_us(prof: Any, n: int) -> list[float]:
    events = []
    for e in prof.profiler.kineto_results.events():
        if "cuda" not in str(e.device_type()).lower():
            continue
        events.append((e.start_ns(), e.end_ns(), e.name()))
    events.sort()
    spans: list[float] = []
    cur: list[tuple[int, int]] = []
    seen_flush = False
    for start, end, name in events:
        if FLUSH_KERNEL in name:
            if seen_flush and cur:
                spans.append((max(e for _, e in cur) - min(s for s, _ in cur)) / 1e3)
            cur = []
            seen_flush = True
        elif seen_flush:
            cur.append((start, end))
    if len(spans) != n:
        raise RuntimeError(f"profiler returned {len(spans)} timed calls, expected {n}")
    return spans


def copy_bandwidth(device: torch.device | None = None, nbytes: int = 1 << 30, n: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written."""
    device = device or default_device()
    if device.type != "cuda":
        raise RuntimeError("copy bandwidth needs a GPU")
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    t = time_call(lambda: b.copy_(a), n=n, device=device, flush_l2=True)
    return 2 * nbytes / (t.median_us * 1e-6)


def measure_config(kernel: KernelDef, axes: Axes, config: Mapping[str, Any], *,
                   n: int | None = None, seed: int = 0, device: torch.device | None = None,
                   inputs: Sequence[torch.Tensor] | None = None) -> Timing:
    """Time the kernel with one config on the benchmark's draw for this case (`inputs`: that
    draw, already on the device, when the caller keeps it between configs; `n`: None for the
    device's `default_repeats`)."""
    device = device or default_device()
    n = n if n is not None else default_repeats(device.type != "cuda")
    cfg = kernel.validate_config(config)
    if inputs is None:
        inputs = kernel.make_inputs(axes, seed=seed, distribution="benchmark", device=device)
    return time_call(lambda: kernel.launch(*inputs, config=cfg), n=n, device=device)


def measure_reference(kernel: KernelDef, axes: Axes, *, compiled: bool = False,
                      n: int | None = None, seed: int = 0,
                      device: torch.device | None = None) -> Timing:
    """Time the eager PyTorch reference, or torch.compile of it."""
    device = device or default_device()
    n = n if n is not None else default_repeats(device.type != "cuda")
    inputs = kernel.make_inputs(axes, seed=seed, distribution="benchmark", device=device)
    fn = kernel.torch_reference
    if fn is None:
        raise ValueError(f"{kernel.name}: declares no torch_reference to time")
    if compiled:
        # A fresh compile per case, as the benchmark compiles per shape; without the reset,
        # dynamo's recompile limit silently falls back to eager after eight shapes.
        torch._dynamo.reset()
        fn = cast(Callable[..., Any], torch.compile(fn, dynamic=False))
    return time_call(lambda: fn(*inputs), n=n, device=device)
