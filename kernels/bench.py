"""Per-case comparison in one run: eager reference, torch.compile, the Triton kernel, roofline.

Everything in one process and one run, so the series are comparable (never across days). The
copy bandwidth that sets the roofline is measured in the same run.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


from .check import check_config
from .device import default_device, device_info, versions
from .measure import copy_bandwidth, measure_config, measure_reference
from .runtime import runtime_of
from .spec import Axes, AxisValue, KernelDef


@dataclass
class CaseBench:
    kernel: str
    case: int | None
    axes: dict[str, AxisValue]
    config: dict[str, Any]
    config_source: str
    triton: dict[str, Any]
    eager: dict[str, Any] | None
    compiled: dict[str, Any] | None
    roofline_us: float | None
    rel_error: float
    correct: bool
    default: dict[str, Any] | None = None
    pct_roofline: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def bench_cases(kernel: KernelDef, cases: Sequence[Axes], *,
                config: Mapping[str, Any] | None = None, n: int = 30, references: bool = True,
                bandwidth: float | None = None, numbers: Sequence[int | None] | None = None,
                compare_default: bool = False,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Bench `cases` of one kernel; returns a JSON-able report (per-case rows and suite means).

    With `compare_default`, the kernel's default config is timed in the same run as well.
    """
    device = default_device()
    on_gpu = device.type == "cuda"
    if bandwidth is None and on_gpu:
        bandwidth = copy_bandwidth(device)
    rows: list[CaseBench] = []
    numbers = list(numbers) if numbers is not None else [None] * len(cases)
    for given, number in zip(cases, numbers):
        axes = kernel.validate_axes(dict(given))
        if config is not None:
            cfg, source = kernel.validate_config(config), "given"
        else:
            cfg = kernel.resolve_config(axes, device)
            source = "store" if cfg != kernel.default_config else "default"
        if progress:
            progress(f"{kernel.name} {axes} {source}")
        chk = check_config(kernel, axes, cfg, device=device, seed=1234)
        t = measure_config(kernel, axes, cfg, n=n, device=device)
        stats = runtime_of(kernel).compiled_stats()
        dflt = None
        if compare_default:
            dflt = (t if cfg == kernel.default_config
                    else measure_config(kernel, axes, kernel.default_config, n=n, device=device)).as_dict()
        eager = compiled = None
        # Without a declared torch_reference there is no PyTorch path to compare with (timing
        # the float64 reference would give a meaningless speedup): the columns stay empty.
        if references and kernel.torch_reference is not None:
            eager = measure_reference(kernel, axes, n=n, device=device).as_dict()
            try:
                compiled = measure_reference(kernel, axes, compiled=True, n=n, device=device).as_dict()
            except Exception as exc:  # torch.compile needs a working toolchain; say why it is missing
                compiled = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        roof = kernel.bytes_moved(axes) / bandwidth * 1e6 if (bandwidth and on_gpu) else None
        row = CaseBench(kernel=kernel.name, case=number, axes=dict(axes), config=cfg,
                        config_source=source, triton=t.as_dict(), eager=eager, compiled=compiled,
                        roofline_us=roof, rel_error=chk.max_error, correct=chk.ok,
                        default=dflt, extra=stats)
        med = t.median_us
        if roof:
            row.pct_roofline = 100.0 * roof / med
        if eager and "median_us" in eager:
            row.speedup_eager = eager["median_us"] / med
        if compiled and "median_us" in compiled:
            row.speedup_compile = compiled["median_us"] / med
        rows.append(row)
    return {
        "kernel": kernel.name,
        "device": device_info(device),
        "versions": versions(),
        "method": rows[0].triton["method"] if rows else None,
        "n_calls": n,
        "copy_bandwidth_Bps": bandwidth,
        "references": references and kernel.torch_reference is not None,
        "no_torch_reference": kernel.torch_reference is None,
        "rows": [r.__dict__ for r in rows],
        "suite_mean_us": _means(rows),
    }


def _means(rows: list[CaseBench]) -> dict[str, float | None]:
    def mean(vals: list[float | None]) -> float | None:
        nums = [v for v in vals if v is not None and not math.isnan(v)]
        return statistics.fmean(nums) if nums and len(nums) == len(rows) else None

    return {
        "triton": mean([r.triton["median_us"] for r in rows]),
        "default": mean([(r.default or {}).get("median_us") for r in rows]),
        "eager": mean([(r.eager or {}).get("median_us") for r in rows]),
        "compile": mean([(r.compiled or {}).get("median_us") for r in rows]),
        "roofline": mean([r.roofline_us for r in rows]),
    }


def format_table(report: Mapping[str, Any]) -> str:
    """Plain, greppable table: one line per case, then the suite mean."""
    unit = "us" if report["method"] == "cupti" else "us(wall,interp)"
    head = (f"{'kernel':<32} {'case':>4} {'axes':<22} {'eager':>9} {'compile':>9} {'default':>9} {'triton':>9} "
            f"{'iqr':>6} {'roof':>7} {'%roof':>6} {'x_eager':>8} {'x_comp':>7} {'ok':>3}  [{unit}]")
    lines = [head]
    f = lambda v, w, p=2: f"{v:>{w}.{p}f}" if isinstance(v, (int, float)) and v is not None else f"{'-':>{w}}"
    for r in report["rows"]:
        axes = ",".join(f"{k}={v}" for k, v in r["axes"].items())
        lines.append(
            f"{r['kernel']:<32} {r['case'] if r['case'] is not None else '-':>4} {axes:<22} "
            f"{f((r['eager'] or {}).get('median_us'), 9)} {f((r['compiled'] or {}).get('median_us'), 9)} "
            f"{f((r.get('default') or {}).get('median_us'), 9)} {f(r['triton']['median_us'], 9)} {f(r['triton']['iqr_us'], 6)} {f(r['roofline_us'], 7)} "
            f"{f(r['pct_roofline'], 6, 1)} {f(r['speedup_eager'], 8, 1)} {f(r['speedup_compile'], 7, 1)} "
            f"{'yes' if r['correct'] else 'NO':>3}")
    m = report["suite_mean_us"]
    lines.append(f"{report['kernel']:<32} {'mean':>4} {'':<22} {f(m['eager'], 9)} {f(m['compile'], 9)} "
                 f"{f(m.get('default'), 9)} {f(m['triton'], 9)} {'':>6} {f(m['roofline'], 7)}")
    if report.get("references") is False and report.get("no_torch_reference"):
        lines.append(f"{report['kernel']}: no eager or compile column: the kernel declares no "
                     "torch_reference (its float64 reference is for correctness only)")
    return "\n".join(lines)


def plot(reports: Sequence[Mapping[str, Any]], path: str) -> None:
    """Latency per case on a log axis: eager, torch.compile, Triton, roofline; one panel per kernel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, len(reports), figsize=(7 * len(reports), 4.5), squeeze=False)
    for ax, rep in zip(axs[0], reports):
        rows = rep["rows"]
        xs = list(range(len(rows)))
        labels = [str(r["case"]) if r["case"] is not None else ",".join(map(str, r["axes"].values()))
                  for r in rows]
        series = [
            ("eager", [(r["eager"] or {}).get("median_us") for r in rows], "o-"),
            ("torch.compile", [(r["compiled"] or {}).get("median_us") for r in rows], "s-"),
            ("triton (default config)", [(r.get("default") or {}).get("median_us") for r in rows], "v:"),
            ("triton" + (" (tuned)" if any(r["config_source"] == "store" for r in rows) else ""),
             [r["triton"]["median_us"] for r in rows], "^-"),
            ("roofline", [r["roofline_us"] for r in rows], "k--"),
        ]
        for name, ys, style in series:
            pts = [(x, y) for x, y in zip(xs, ys) if y]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name, markersize=4)
        ax.set_yscale("log")
        ax.set_xticks(xs, labels)
        ax.set_xlabel("suite case")
        unit = "GPU span, us (CUPTI)" if rep["method"] == "cupti" else "wall clock, us (interpreter)"
        ax.set_ylabel(unit)
        ax.set_title(f"{rep['kernel']}\n{rep['device']['name']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dump(reports: Sequence[Mapping[str, Any]], path: str) -> None:
    with open(path, "w") as fh:
        json.dump({"reports": list(reports)}, fh, indent=1, default=str)
