"""Search-efficiency and throughput experiments, for the GPU box (argparse, SQLite, matplotlib).

    python -m search_space.efficiency --out DIR [--mode search|throughput|both]
        [--kernels K,K] [--cases 2,3,4,5] [--budget-s 540] [--seeds 3] [--measure-n 30]

search: for each kernel and case, the exhaustive grid over the space file's [reduced] subset is
measured for real (tune_case, sampler grid); every measured outcome is kept as a table. TPE with
warm start, TPE without, and random are then replayed over that same table (a tabular benchmark:
each sampler sees exactly the latencies and failures the grid measured, so their comparison has
no measurement noise between them, and several seeds cost no GPU time). Warm start draws on the
grid bests of the other cases. Reported: trials to come within 3% of the grid's best, as a
number and as a fraction of the grid's size; best-so-far plot. `--live` also runs TPE with
warm start for real on each case, to check the replay against the GPU.

throughput: every suite case of every kernel tuned by TPE with warm start in one run, with the
wall time of each phase (compile, check, measure, waiting for compile-ahead) and in total.

Everything stops cleanly at --budget-s and writes what it has (results.json, PNG).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from kernels import KERNELS, get_kernel

from .runner import TrialOutcome, TrialRunner
from .space import SearchSpace, get_space
from .tuner import tune_case

WITHIN = 0.03


class TableRunner:
    """Answers trials from the outcomes the grid measured (same interface as TrialRunner)."""

    compile_workers = 0

    def __init__(self, table: Mapping[str, dict[str, Any]], space: SearchSpace,
                 device_info: dict[str, Any], versions: dict[str, str]):
        self.table, self.space = table, space
        self.device_info, self.versions = device_info, versions
        self.device_name = str(device_info["name"])

    def start(self) -> None:
        return None

    def prefetch(self, *a: Any, **k: Any) -> int:
        return 0

    def copy_bandwidth(self) -> float | None:
        return None

    def close(self) -> None:
        return None

    def run(self, kernel: str, axes: Mapping[str, int], config: Mapping[str, Any], **kw: Any) -> TrialOutcome:
        got = self.table.get(self.space.key(config))
        if got is None:
            return TrialOutcome.failure("invalid_config", "config not measured by the grid")
        return TrialOutcome.from_dict({**got, "compile_s": 0.0, "check_s": 0.0, "measure_s": 0.0})


def trials_to_within(history: Sequence[float | None], target: float, within: float = WITHIN) -> int | None:
    """1-based number of evaluated trials until the best so far is within `within` of target."""
    best = math.inf
    for i, v in enumerate(history, 1):
        if v is not None:
            best = min(best, v)
        if best <= target * (1 + within):
            return i
    return None


def best_so_far(history: Sequence[float | None]) -> list[float | None]:
    out, best = [], math.inf
    for v in history:
        if v is not None:
            best = min(best, v)
        out.append(best if math.isfinite(best) else None)
    return out


def _label(axes: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in axes.items())


def _grid_table(url: str, name: str) -> dict[str, dict[str, Any]]:
    import optuna

    study = optuna.load_study(study_name=name, storage=url)
    table = {}
    for t in study.get_trials(deepcopy=False):
        cfg, out = t.user_attrs.get("ks_config"), t.user_attrs.get("ks_outcome")
        if t.user_attrs.get("ks_evaluated") and cfg is not None and out is not None:
            table[json.dumps(cfg, sort_keys=True)] = out
    return table


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)


def run_search(kernels: Sequence[str], cases: Sequence[int], store: Any, url: str,
               runner: TrialRunner, clock: Clock, *, seeds: int, measure_n: int, live: bool,
               replay_fraction: float, tag: str, log: Any) -> dict[str, Any]:
    import optuna

    out: dict[str, Any] = {"within": WITHIN, "kernels": {}}
    for kname in kernels:
        kdef = get_kernel(kname)
        space = get_space(kname).reduced()
        n_grid = space.size()
        kout: dict[str, Any] = {"grid_size": n_grid, "space": space.describe(), "cases": {}}
        out["kernels"][kname] = kout
        axes_list = [dict(kdef.case(c).axes) for c in cases]
        tables: dict[str, dict] = {}
        for axes in axes_list:  # the grid, measured for real
            if clock.left() <= 5:
                log(f"budget spent before the grid of {kname} {_label(axes)}")
                break
            name = f"eff{tag}/grid/{kname}/{_label(axes)}"
            res = tune_case(kname, axes, store=store, storage_url=url, n_trials=n_grid,
                            sampler="grid", runner=runner, seed=0, measure_n=measure_n,
                            space=space, name=name, timeout_s=clock.left(), warm_start=False)
            tables[_label(axes)] = _grid_table(url, name)
            kout["cases"][_label(axes)] = {
                "axes": axes, "grid": {"best_us": res.best_latency_us, "best_config": res.best_config,
                                        "n_complete": res.n_complete, "n_failed": res.n_failed,
                                        "wall_s": res.wall_s, "stopped": res.stopped_because,
                                        "history": res.history}}
            log(f"grid {kname} {_label(axes)}: best {res.best_latency_us} us over "
                f"{res.n_complete}+{res.n_failed} trials in {res.wall_s:.0f} s")
        n_replay = max(10, math.ceil(replay_fraction * n_grid))
        for axes in axes_list:
            lab = _label(axes)
            case = kout["cases"].get(lab)
            if case is None or case["grid"]["best_us"] is None or case["grid"]["stopped"] != "space_exhausted" and case["grid"]["n_complete"] + case["grid"]["n_failed"] < n_grid:
                continue  # a partial grid has no ground truth
            target = case["grid"]["best_us"]
            tab = TableRunner(tables[lab], space, runner.device_info, runner.versions or {})
            for variant, sampler, warm in (("tpe_warm", "tpe", True), ("tpe_cold", "tpe", False),
                                           ("random", "random", False)):
                runs = []
                for seed in range(seeds):
                    if clock.left() <= 2:
                        break
                    r = tune_case(kname, axes, store=store, storage_url=url, n_trials=n_replay,
                                  sampler=sampler, runner=tab, seed=seed, measure_n=measure_n,
                                  space=space, name=f"eff{tag}/{variant}/{seed}/{kname}/{lab}",
                                  warm_start=warm, write_record=False, timeout_s=clock.left(),
                                  storage=optuna.storages.InMemoryStorage(), summaries=False)
                    runs.append({"seed": seed, "history": r.history, "warm_started": r.warm_started,
                                 "trials_to_within": trials_to_within(r.history, target)})
                case[variant] = _summarise(runs, n_grid)
                log(f"{variant} {kname} {lab}: trials to within 3%: "
                    f"{[x['trials_to_within'] for x in runs]} (grid {n_grid})")
            if live and clock.left() > 10:
                r = tune_case(kname, axes, store=store, storage_url=url,
                              n_trials=max(5, math.ceil(0.2 * n_grid)), sampler="tpe", runner=runner,
                              seed=0, measure_n=measure_n, space=space,
                              name=f"eff{tag}/live_tpe_warm/{kname}/{lab}", write_record=False,
                              timeout_s=clock.left())
                case["live_tpe_warm"] = {"history": r.history, "best_us": r.best_latency_us,
                                         "trials_to_within": trials_to_within(r.history, target),
                                         "wall_s": r.wall_s}
    return out


def _summarise(runs: list[dict[str, Any]], n_grid: int) -> dict[str, Any]:
    hits = [r["trials_to_within"] for r in runs]
    found = [h for h in hits if h is not None]
    return {"runs": runs, "n_seeds": len(runs), "n_reached": len(found),
            "median_trials_to_within": statistics.median(found) if found else None,
            "median_fraction_of_grid": (statistics.median(found) / n_grid) if found else None}


def run_throughput(kernels: Sequence[str], store: Any, url: str, runner: TrialRunner,
                   clock: Clock, *, n_trials: int, measure_n: int, tag: str, log: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    phases = {"compile": 0.0, "check": 0.0, "measure": 0.0, "compile_wait": 0.0}
    rows = []
    todo = [(k, dict(c.axes)) for k in kernels for c in get_kernel(k).cases]
    for i, (kname, axes) in enumerate(todo):
        if clock.left() <= 2:
            log(f"budget spent after {i} of {len(todo)} cases")
            break
        share = clock.left() / (len(todo) - i)
        r = tune_case(kname, axes, store=store, storage_url=url, n_trials=n_trials, sampler="tpe",
                      runner=runner, seed=0, measure_n=measure_n, warm_start=True,
                      name=f"eff{tag}/throughput/{kname}/{_label(axes)}", timeout_s=max(1.0, share))
        phases["compile"] += r.compile_s
        phases["check"] += r.check_s
        phases["measure"] += r.measure_s
        phases["compile_wait"] += r.compile_wait_s
        rows.append({"kernel": kname, "axes": axes, "best_us": r.best_latency_us,
                     "best_config": r.best_config, "n_complete": r.n_complete,
                     "n_failed": r.n_failed, "warm_started": r.warm_started, "wall_s": r.wall_s,
                     "stopped": r.stopped_because, "compile_s": r.compile_s, "check_s": r.check_s,
                     "measure_s": r.measure_s, "compile_wait_s": r.compile_wait_s})
        log(f"[{i + 1}/{len(todo)}] {kname} {_label(axes)}: {r.best_latency_us} us, "
            f"{r.n_complete}+{r.n_failed} trials, {r.wall_s:.1f} s")
    wall = time.monotonic() - t0
    return {"n_cases": len(rows), "n_cases_planned": len(todo), "wall_s": wall,
            "phase_s": phases, "other_s": wall - sum(phases.values()), "cases": rows,
            "compile_workers": runner.compile_workers}


def plot(search: Mapping[str, Any], path: Path) -> None:
    """Best-so-far over trials, as a ratio to the grid's best, median over cases and seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(search["kernels"])
    fig, axs = plt.subplots(1, max(1, len(ks)), figsize=(6 * max(1, len(ks)), 4), squeeze=False)
    for ax, kname in zip(axs[0], ks):
        kd = search["kernels"][kname]
        for variant in ("tpe_warm", "tpe_cold", "random", "grid"):
            curves = []
            for case in kd["cases"].values():
                target = case["grid"]["best_us"]
                if not target or variant not in case:
                    continue
                runs = case[variant]["runs"] if variant != "grid" else [case["grid"]]
                for r in runs:
                    curves.append([(b / target) if b else None for b in best_so_far(r["history"])])
            if not curves:
                continue
            n = max(len(c) for c in curves)
            med = []
            for i in range(n):
                vals = [c[min(i, len(c) - 1)] for c in curves if c and c[min(i, len(c) - 1)] is not None]
                med.append(statistics.median(vals) if vals else float("nan"))
            ax.plot(range(1, n + 1), med, label=variant)
        ax.axhline(1 + WITHIN, color="grey", linestyle="--", linewidth=0.8, label="grid best +3%")
        ax.axvline(0.2 * kd["grid_size"], color="grey", linestyle=":", linewidth=0.8,
                   label="20% of the grid")
        ax.set_xscale("log")
        ax.set_title(f"{kname} (grid {kd['grid_size']})", fontsize=9)
        ax.set_xlabel("evaluated trials")
        ax.set_ylabel("best so far / grid best (median)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m search_space.efficiency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="folder for results.json, the PNG and the DB")
    p.add_argument("--mode", choices=("search", "throughput", "both"), default="search")
    p.add_argument("--kernels", default=",".join(sorted(KERNELS)), help="comma-separated names")
    p.add_argument("--cases", default="2,3,4,5", help="suite case numbers for the search experiment")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop everything after this long")
    p.add_argument("--seeds", type=int, default=3, help="replays per sampler and case")
    p.add_argument("--replay-fraction", type=float, default=0.5,
                   help="replayed samplers evaluate this fraction of the grid's size")
    p.add_argument("--measure-n", type=int, default=30, help="timed calls per trial")
    p.add_argument("--throughput-trials", type=int, default=20, help="trials per case (throughput)")
    p.add_argument("--trial-timeout", type=float, default=60.0)
    p.add_argument("--compile-workers", type=int, default=None, help="compile-ahead pool size")
    p.add_argument("--live", action="store_true", help="also run TPE with warm start for real")
    p.add_argument("--db", default=None, help="database URL (default: sqlite in --out)")
    a = p.parse_args(argv)
    kernels = [k for k in a.kernels.split(",") if k]
    for k in kernels:
        get_kernel(k)
    try:
        cases = [int(c) for c in a.cases.split(",") if c]
    except ValueError:
        p.error("--cases: comma-separated integers")
    if a.budget_s <= 0 or a.seeds < 1 or a.measure_n < 1:
        p.error("--budget-s, --seeds and --measure-n must be positive")
    a.out.mkdir(parents=True, exist_ok=True)
    url = a.db or f"sqlite:///{(a.out / 'efficiency.db').resolve()}"
    tag = time.strftime("-%Y%m%d-%H%M%S")
    clock = Clock(a.budget_s)
    logf = (a.out / "log.txt").open("a")

    def log(msg: str) -> None:
        line = f"[{time.monotonic() - clock.t0:7.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    import optuna

    from db.engine import upgrade
    from db.store import Store

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    upgrade(url)
    store = Store(url)
    doc: dict[str, Any] = {"budget_s": a.budget_s, "args": {k: str(v) for k, v in vars(a).items()}}
    with TrialRunner(trial_timeout_s=a.trial_timeout, compile_workers=a.compile_workers) as runner:
        runner.start()
        doc["device"], doc["versions"] = runner.device_info, runner.versions
        log(f"device {runner.device_name}, compile workers {runner.compile_workers}")
        try:
            if a.mode in ("search", "both"):
                doc["search"] = run_search(kernels, cases, store, url, runner, clock,
                                           seeds=a.seeds, measure_n=a.measure_n, live=a.live,
                                           replay_fraction=a.replay_fraction, tag=tag, log=log)
            if a.mode in ("throughput", "both"):
                doc["throughput"] = run_throughput(kernels, store, url, runner, clock,
                                                   n_trials=a.throughput_trials,
                                                   measure_n=a.measure_n, tag=tag, log=log)
        finally:
            doc["elapsed_s"] = time.monotonic() - clock.t0
            (a.out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
            if "search" in doc:
                plot(doc["search"], a.out / "best_so_far.png")
            log(f"wrote {a.out / 'results.json'}")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
