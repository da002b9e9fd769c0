"""Search-efficiency and throughput experiments, for the GPU box (argparse, SQLite, matplotlib).

    python -m kernelsearch_tools.efficiency --out DIR [--mode search|throughput|both]
        [--kernels K,K] [--cases 2,3,4,5] [--budget-s 540] [--seeds 3] [--measure-n 30]
    python -m kernelsearch_tools.efficiency --out DIR --table EXPLORE.json [--cases ...] [--seeds 5]

search: for each kernel and case, the exhaustive grid over the space file's [reduced] subset is
measured for real (tune_case, sampler grid); every measured outcome is kept as a table. TPE with
warm start, TPE without, and random are then replayed over that same table (a tabular benchmark:
each sampler sees exactly the latencies and failures the grid measured, so their comparison has
no measurement noise between them, and several seeds cost no GPU time). Warm start draws on the
grid bests of the other cases. Reported: trials to come within 3% of the grid's best, as a
number and as a fraction of the grid's size; best-so-far plot. `--live` also runs TPE with
warm start for real on each case, to check the replay against the GPU.

search with --table: no GPU. The grid is not measured but read from a `kernelsearch_tools.explore` JSON
(every config checked against float64 and timed on every suite case). The space is the kernel's
space restricted to the largest product grid the table covers (parameters outside it fixed at the
table's single value); its configs that the space and the kernel accept are the grid, and the
table's best over them per case is the ground truth. The other cases' grid bests are written to
the (temporary) store as records, so warm start behaves as on the machine that measured the
table; then the same replay as above.

throughput: every suite case of every kernel tuned by TPE with warm start in one run, with the
wall time of each phase (compile, check, measure, waiting for compile-ahead) and in total.

Everything stops cleanly at --budget-s and writes what it has (results.json, PNG).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import hashlib
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from kernelsearch.kernels import all_kernels, get_kernel
from kernelsearch.kernels.errors import InvalidConfig
from kernelsearch.kernels.spec import config_key, in_choices, same_choice

from kernelsearch.search_space.runner import TrialOutcome, TrialRunner
from kernelsearch.search_space.space import SearchSpace, get_space
from kernelsearch.search_space.tuner import TuneOptions, make_storage, tune_case

if TYPE_CHECKING:
    from kernelsearch.db.interfaces import TuningStore

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
            table[config_key(cfg)] = out
    return table


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)


def run_search(kernels: Sequence[str], cases: Sequence[int], store: TuningStore, url: str,
               runner: TrialRunner, clock: Clock, *, seeds: int, measure_n: int, live: bool,
               replay_fraction: float, tag: str, log: Any) -> dict[str, Any]:
    """Measure the reduced space's grid of every kernel and case on the GPU, then replay."""
    out: dict[str, Any] = {"within": WITHIN, "source": "measured", "kernels": {}}
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
            res = tune_case(kname, axes, store=store, storage=url, runner=runner, space=space,
                            options=TuneOptions(n_trials=n_grid, sampler="grid", seed=0, measure_n=measure_n,
                                                name=name, timeout_s=clock.left(), warm_start=False))
            tables[_label(axes)] = _grid_table(url, name)
            kout["cases"][_label(axes)] = {"axes": axes, "grid": _grid_summary(res)}
            log(f"grid {kname} {_label(axes)}: best {res.best.latency_us} us over "
                f"{res.trials.n_complete}+{res.trials.n_failed} trials in {res.times.wall_s:.0f} s")
        replay(kname, space, kout, tables, axes_list, store, url, runner.device_info,
               runner.versions or {}, clock, seeds=seeds, measure_n=measure_n,
               replay_fraction=replay_fraction, tag=tag, log=log,
               live_runner=runner if live else None)
    return out


def _grid_summary(res: Any) -> dict[str, Any]:
    return {"best_us": res.best.latency_us, "best_config": res.best.config,
            "n_complete": res.trials.n_complete, "n_failed": res.trials.n_failed, "wall_s": res.times.wall_s,
            "stopped": res.stopped_because, "history": res.trials.history}


def replay(kname: str, space: SearchSpace, kout: dict[str, Any], tables: Mapping[str, Mapping],
           axes_list: Sequence[Mapping[str, int]], store: TuningStore, url: str,
           device_info: dict[str, Any], versions: dict[str, str], clock: Clock, *, seeds: int,
           measure_n: int, replay_fraction: float, tag: str, log: Any,
           live_runner: TrialRunner | None = None) -> None:
    """TPE with and without warm start and random, `seeds` times each, over every case whose
    grid is complete in `tables`; summaries go into kout["cases"][label][variant]."""
    import optuna

    n_grid = kout["grid_size"]
    n_replay = max(10, math.ceil(replay_fraction * n_grid))
    kout["n_replay"] = n_replay
    for axes in axes_list:
        lab = _label(axes)
        case = kout["cases"].get(lab)
        if case is None or case["grid"]["best_us"] is None or case["grid"]["stopped"] != "space_exhausted" and case["grid"]["n_complete"] + case["grid"]["n_failed"] < n_grid:
            continue  # a partial grid has no ground truth
        target = case["grid"]["best_us"]
        tab = TableRunner(tables[lab], space, device_info, versions)
        for variant, sampler, warm in (("tpe_warm", "tpe", True), ("tpe_cold", "tpe", False),
                                       ("random", "random", False)):
            runs = []
            for seed in range(seeds):
                if clock.left() <= 2:
                    break
                r = tune_case(kname, dict(axes), store=store, runner=tab, space=space,
                              storage=optuna.storages.InMemoryStorage(),
                              options=TuneOptions(n_trials=n_replay, sampler=sampler, seed=seed,
                                                  measure_n=measure_n,
                                                  name=f"eff{tag}/{variant}/{seed}/{kname}/{lab}",
                                                  warm_start=warm, write_record=False, timeout_s=clock.left(),
                                                  summaries=False))
                runs.append({"seed": seed, "history": r.trials.history, "warm_started": r.trials.warm_started,
                             "trials_to_within": trials_to_within(r.trials.history, target)})
            case[variant] = _summarise(runs, n_grid)
            log(f"{variant} {kname} {lab}: trials to within 3%: "
                f"{[x['trials_to_within'] for x in runs]} (grid {n_grid})")
        if live_runner is not None and clock.left() > 10:
            r = tune_case(kname, dict(axes), store=store, storage=url, runner=live_runner, space=space,
                          options=TuneOptions(n_trials=max(5, math.ceil(0.2 * n_grid)), sampler="tpe", seed=0,
                                              measure_n=measure_n,
                                              name=f"eff{tag}/live_tpe_warm/{kname}/{lab}",
                                              write_record=False, timeout_s=clock.left()))
            case["live_tpe_warm"] = {"history": r.trials.history, "best_us": r.best.latency_us,
                                     "trials_to_within": trials_to_within(r.trials.history, target),
                                     "wall_s": r.times.wall_s}


# -- the grid read from a kernelsearch_tools.explore table -----------------------------------------------
def load_table(path: str | Path) -> dict[str, Any]:
    """A `kernelsearch_tools.explore` JSON: {"device", "versions", "copy_bandwidth_Bps", "kernels": {name:
    {"cases": [{"case", "axes", "rows": [{"config", "ok", "errors", "timing", ...}]}]}}}."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("kernels"), dict) or not doc["kernels"]:
        raise ValueError(f"{path}: not a kernelsearch_tools.explore table (no 'kernels')")
    if not isinstance(doc.get("device"), dict) or not doc["device"].get("name"):
        raise ValueError(f"{path}: no 'device' with a name")
    for kname, kd in doc["kernels"].items():
        get_kernel(kname)
        if not kd.get("cases"):
            raise ValueError(f"{path}: kernel {kname} has no measured cases")
        for c in kd["cases"]:
            if "case" not in c or "axes" not in c or not isinstance(c.get("rows"), list):
                raise ValueError(f"{path}: {kname}: a case needs 'case', 'axes' and 'rows'")
    return doc


def row_outcome(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The TrialOutcome (as a dict) a table row stands for; None for a row that was not timed."""
    errs = {k: (float(v) if v is not None else math.nan) for k, v in (row.get("errors") or {}).items()}
    stats = {k: row.get(k) for k in ("n_regs", "n_spills", "shared_bytes")}
    if row.get("ok"):
        if not row.get("timing") or row["timing"].get("median_us") is None:
            return None
        return TrialOutcome(ok=True, timing=dict(row["timing"]), rel_errors=errs, **stats).as_dict()
    msg = row.get("failure") or f"wrong result against float64: relative errors {errs}"
    return TrialOutcome.failure("wrong_result", msg, rel_errors=errs, **stats).as_dict()


def table_space(space: SearchSpace, keys: set[str]) -> SearchSpace:
    """`space` restricted to the largest product grid whose configs (those the space and the
    kernel accept) all have a key in `keys`. Greedy: start from every value the table holds and
    drop, one at a time, the value whose configs the table covers least (ties: the value with
    more configs, then the space's order), until the table covers the grid."""
    configs = [json.loads(k) for k in keys]
    choices: dict[str, list[Any]] = {}
    for p in space.params:
        seen = [v for v in p.choices if any(p.name in c and same_choice(c[p.name], v) for c in configs)]
        if seen:
            choices[p.name] = seen
    while True:
        sub = space.restrict(choices)
        grid = sub.grid()
        covered = [sub.key(c) in keys for c in grid]
        if grid and all(covered):
            break
        worst: tuple[tuple[float, int], str, Any] | None = None
        for name, vals in choices.items():
            if len(vals) < 2:
                continue
            for v in vals:
                hit = [cov for c, cov in zip(grid, covered) if name in c and same_choice(c[name], v)]
                if hit:
                    score = (sum(hit) / len(hit), -len(hit))
                    if worst is None or score < worst[0]:
                        worst = (score, name, v)
        if worst is None:
            raise ValueError(f"{space.kernel.name}: the table covers no product grid of the space")
        _, name, v = worst
        choices[name] = [x for x in choices[name] if not same_choice(x, v)]
    # A parameter no grid config uses (inactive everywhere) is fixed, at the kernel's default.
    for p in space.params:
        if not any(p.name in c for c in grid):
            dflt = space.kernel.param(p.name).default
            choices[p.name] = [dflt] if in_choices(dflt, p.choices) else [p.choices[0]]
    return space.restrict(choices)


def _table_record(kname: str, axes: Mapping[str, int], row: Mapping[str, Any], *, doc: Mapping[str, Any],
                  kdoc: Mapping[str, Any], n_grid: int, n_failed: int, study: str) -> Any:
    """The record a tuner would have written for this case: the grid's best row, through the
    acceptance gate as every stored record."""
    from kernelsearch.search_space.acceptance import accepted
    from kernelsearch.search_space.records import measured_record

    kdef = get_kernel(kname)
    timing = row["timing"]
    versions = doc.get("versions") or {}
    work = float(kdef.work(dict(axes)))
    value = float(timing["median_us"])
    bw = doc.get("copy_bandwidth_Bps")
    method = str(timing.get("method") or "cupti")
    errs = [float(v) for v in (row.get("errors") or {}).values()
            if v is not None and math.isfinite(float(v))]
    return accepted(measured_record(
        kdef, axes, str(doc["device"]["name"]),
        device_info=dict(doc["device"]), torch_version=str(versions.get("torch", "")),
        triton_version=str(versions.get("triton", "")),
        source_hash=str(kdoc.get("source_hash") or doc.get("source_hash") or kdef.source_hash),
        config=dict(row["config"]), latency_median_us=value,
        latency_min_us=float(timing.get("min_us", value)),
        latency_max_us=float(timing.get("max_us", value)),
        latency_iqr_us=float(timing.get("iqr_us", 0.0)), timing_method=method,
        rel_error=max(errs) if errs else 0.0, n_trials=n_grid, n_failed=n_failed,
        roofline_pct=(100.0 * (work / bw) / (value * 1e-6)) if bw and method == "cupti" else None,
        study_name=study))


def run_table_search(doc: Mapping[str, Any], kernels: Sequence[str], cases: Sequence[int] | None,
                     store: TuningStore, url: str, clock: Clock, *, seeds: int, measure_n: int,
                     replay_fraction: float, tag: str, log: Any) -> dict[str, Any]:
    """The search experiment over a measured `kernelsearch_tools.explore` table instead of a GPU grid."""
    import optuna

    out: dict[str, Any] = {"within": WITHIN, "source": "table", "kernels": {}}
    device_info = dict(doc["device"])
    versions = {k: str(v) for k, v in (doc.get("versions") or {}).items()}
    for kname in kernels:
        kdef = get_kernel(kname)
        kdoc = doc["kernels"][kname]
        base = get_space(kname)
        measured = {int(c["case"]): c for c in kdoc["cases"]}
        chosen = sorted(measured) if cases is None else list(cases)
        missing = [c for c in chosen if c not in measured]
        if missing:
            raise ValueError(f"{kname}: cases {missing} are not in the table (it has {sorted(measured)})")
        # Every row as an outcome under the current kernel's canonical key, per measured case.
        outcomes: dict[int, dict[str, dict[str, Any]]] = {}
        dropped = 0
        for num, c in measured.items():
            tab: dict[str, dict[str, Any]] = {}
            for row in c["rows"]:
                try:
                    key = base.key(row["config"])
                except (InvalidConfig, KeyError, TypeError):
                    dropped += 1
                    continue
                o = row_outcome(row)
                if o is not None:
                    tab.setdefault(key, {**o, "_row": row})
            outcomes[num] = tab
        common = set.intersection(*(set(t) for t in outcomes.values()))
        space = table_space(base, common)
        grid_keys = [space.key(c) for c in space.grid()]
        n_grid = len(grid_keys)
        n_rows = max(len(c["rows"]) for c in measured.values())
        kout: dict[str, Any] = {"grid_size": n_grid, "space": space.describe(), "cases": {},
                                "table_rows": n_rows, "rows_dropped": dropped}
        out["kernels"][kname] = kout
        used = {name for k in grid_keys for name in json.loads(k)}
        dims = ", ".join(f"{p.name}={list(p.choices)}" for p in space.params if p.name in used)
        log(f"{kname}: {n_rows} configs per case in the table, grid of {n_grid} ({dims})")
        tables: dict[str, dict[str, dict[str, Any]]] = {}
        axes_list = []
        for num in sorted(measured):  # every measured case: the others' bests feed warm start
            axes = kdef.validate_axes(measured[num]["axes"])
            lab = _label(axes)
            full = outcomes[num]
            table = {k: {kk: vv for kk, vv in full[k].items() if kk != "_row"} for k in grid_keys}
            name = f"eff{tag}/grid/{kname}/{lab}"
            res = tune_case(kname, axes, store=store,
                            runner=TableRunner(table, space, device_info, versions), space=space,
                            storage=optuna.storages.InMemoryStorage(),
                            options=TuneOptions(n_trials=n_grid, sampler="grid", seed=0, measure_n=measure_n,
                                                name=name, warm_start=False, write_record=False,
                                                summaries=False))
            ok = [k for k in grid_keys if table[k]["ok"]]
            if not ok:
                log(f"{kname} case {num}: no config of the grid is correct; no ground truth")
                continue
            best_key = min(ok, key=lambda k: table[k]["timing"]["median_us"])
            best_us = float(table[best_key]["timing"]["median_us"])
            if res.best.latency_us != best_us or res.trials.n_complete + res.trials.n_failed != n_grid:
                raise RuntimeError(f"{kname} case {num}: the grid replay found {res.best.latency_us} "
                                   f"us over {res.trials.n_complete + res.trials.n_failed} trials, the table "
                                   f"{best_us} us over {n_grid}")
            store.upsert_best(_table_record(kname, axes, full[best_key]["_row"], doc=doc, kdoc=kdoc,
                                            n_grid=n_grid, n_failed=res.trials.n_failed, study=name))
            if num not in chosen:
                continue
            timed = [(float(o["timing"]["median_us"]), k) for k, o in full.items() if o["ok"]]
            table_best = min(timed) if timed else None
            tables[lab] = table
            axes_list.append(axes)
            kout["cases"][lab] = {
                "axes": axes, "case": num, "grid": _grid_summary(res),
                "table_best_us": table_best[0] if table_best else None,
                "table_best_config": json.loads(table_best[1]) if table_best else None,
                "table_best_in_grid": bool(table_best and table_best[1] in table)}
            log(f"grid {kname} case {num} {lab}: best {best_us} us of {n_grid} "
                f"(table best {table_best[0] if table_best else None} us of {len(full)})")
        replay(kname, space, kout, tables, axes_list, store, url, device_info, versions, clock,
               seeds=seeds, measure_n=measure_n, replay_fraction=replay_fraction, tag=tag, log=log)
    return out


def _summarise(runs: list[dict[str, Any]], n_grid: int) -> dict[str, Any]:
    hits = [r["trials_to_within"] for r in runs]
    found = [h for h in hits if h is not None]
    return {"runs": runs, "n_seeds": len(runs), "n_reached": len(found),
            "median_trials_to_within": statistics.median(found) if found else None,
            "median_fraction_of_grid": (statistics.median(found) / n_grid) if found else None}


def run_throughput(kernels: Sequence[str], store: TuningStore, url: str, runner: TrialRunner,
                   clock: Clock, *, n_trials: int, measure_n: int, tag: str, log: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    phases = {"compile": 0.0, "check": 0.0, "measure": 0.0, "compile_wait": 0.0}
    rows = []
    todo = [(k, dict(c.axes)) for k in kernels for c in get_kernel(k).cases]
    # One Optuna storage for the run: opening one per case re-checks its schema every time.
    storage = make_storage(url)
    for i, (kname, axes) in enumerate(todo):
        if clock.left() <= 2:
            log(f"budget spent after {i} of {len(todo)} cases")
            break
        share = clock.left() / (len(todo) - i)
        r = tune_case(kname, axes, store=store, runner=runner, storage=storage,
                      options=TuneOptions(n_trials=n_trials, sampler="tpe", seed=0, measure_n=measure_n,
                                          warm_start=True, name=f"eff{tag}/throughput/{kname}/{_label(axes)}",
                                          timeout_s=max(1.0, share),
                                          next_case=todo[i + 1] if i + 1 < len(todo) else None))
        phases["compile"] += r.times.compile_s
        phases["check"] += r.times.check_s
        phases["measure"] += r.times.measure_s
        phases["compile_wait"] += r.times.compile_wait_s
        rows.append({"kernel": kname, "axes": axes, "best_us": r.best.latency_us,
                     "best_config": r.best.config, "n_complete": r.trials.n_complete,
                     "n_failed": r.trials.n_failed, "warm_started": r.trials.warm_started, "wall_s": r.times.wall_s,
                     "stopped": r.stopped_because, "compile_s": r.times.compile_s, "check_s": r.times.check_s,
                     "measure_s": r.times.measure_s, "compile_wait_s": r.times.compile_wait_s})
        log(f"[{i + 1}/{len(todo)}] {kname} {_label(axes)}: {r.best.latency_us} us, "
            f"{r.trials.n_complete}+{r.trials.n_failed} trials, {r.times.wall_s:.1f} s")
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
    p = argparse.ArgumentParser(prog="python -m kernelsearch_tools.efficiency", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="folder for results.json, the PNG and the DB")
    p.add_argument("--mode", choices=("search", "throughput", "both"), default="search")
    p.add_argument("--table", type=Path, default=None,
                   help="search over this kernelsearch_tools.explore JSON instead of measuring a grid (no GPU)")
    p.add_argument("--kernels", default=None,
                   help="comma-separated names (default: all, or those in --table)")
    p.add_argument("--cases", default=None,
                   help="suite case numbers for the search experiment (default: 2,3,4,5, or every "
                        "case in --table)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop everything after this long (default: 540, 3600 with --table)")
    p.add_argument("--seeds", type=int, default=None,
                   help="replays per sampler and case (default: 3, 5 with --table)")
    p.add_argument("--replay-fraction", type=float, default=0.5,
                   help="replayed samplers evaluate this fraction of the grid's size")
    p.add_argument("--measure-n", type=int, default=30, help="timed calls per trial")
    p.add_argument("--throughput-trials", type=int, default=20, help="trials per case (throughput)")
    p.add_argument("--trial-timeout", type=float, default=60.0)
    p.add_argument("--compile-workers", type=int, default=None, help="compile-ahead pool size")
    p.add_argument("--live", action="store_true", help="also run TPE with warm start for real")
    p.add_argument("--db", default=None,
                   help="database URL (default: sqlite in --out; a temporary file with --table)")
    a = p.parse_args(argv)
    table = None
    if a.table is not None:
        if a.mode != "search" or a.live:
            p.error("--table replays a measured table: --mode search only, and no --live")
        try:
            table = load_table(a.table)
        except (OSError, ValueError, KeyError) as exc:
            p.error(f"--table: {exc}")
    if a.kernels is not None:
        kernels = [k for k in a.kernels.split(",") if k]
    else:
        kernels = sorted(table["kernels"]) if table is not None else sorted(all_kernels())
    for k in kernels:
        try:
            get_kernel(k)
        except KeyError as exc:
            p.error(f"--kernels: {exc}")
        if table is not None and k not in table["kernels"]:
            p.error(f"--kernels: {k} is not in {a.table} (it has {', '.join(sorted(table['kernels']))})")
    try:
        cases = [int(c) for c in a.cases.split(",") if c] if a.cases is not None else None
    except ValueError:
        p.error("--cases: comma-separated integers")
    if cases is None and table is None:
        cases = [2, 3, 4, 5]
    if a.budget_s is None:
        a.budget_s = 3600.0 if table is not None else 540.0
    if a.seeds is None:
        a.seeds = 5 if table is not None else 3
    if a.budget_s <= 0 or a.seeds < 1 or a.measure_n < 1 or a.replay_fraction <= 0:
        p.error("--budget-s, --seeds, --measure-n and --replay-fraction must be positive")
    a.out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="ks-eff-") if table is not None and not a.db else None
    db_dir = Path(tmp.name) if tmp is not None else a.out
    url = a.db or f"sqlite:///{(db_dir / 'efficiency.db').resolve()}"
    tag = time.strftime("-%Y%m%d-%H%M%S")
    clock = Clock(a.budget_s)
    logf = (a.out / "log.txt").open("a")

    def log(msg: str) -> None:
        line = f"[{time.monotonic() - clock.t0:7.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    import optuna

    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    upgrade(url)
    store = Store(url)
    doc: dict[str, Any] = {"budget_s": a.budget_s, "args": {k: str(v) for k, v in vars(a).items()}}
    try:
        if table is not None:
            doc["device"], doc["versions"] = table["device"], table.get("versions")
            doc["table"] = {"path": str(a.table), "copy_bandwidth_Bps": table.get("copy_bandwidth_Bps"),
                            "sha256": hashlib.sha256(a.table.read_bytes()).hexdigest()}
            log(f"table {a.table}: measured on {table['device']['name']}, replay only (no GPU)")
            with _results(doc, a.out, clock, log):
                doc["search"] = run_table_search(table, kernels, cases, store, url, clock,
                                                 seeds=a.seeds, measure_n=a.measure_n,
                                                 replay_fraction=a.replay_fraction, tag=tag, log=log)
            return 0
        with TrialRunner(trial_timeout_s=a.trial_timeout, compile_workers=a.compile_workers) as runner, \
                cf.ThreadPoolExecutor(1) as bg:
            # Each space's grid (seconds of constraint checks for B) is enumerated while the
            # runner's child and compile pool start, not on the first tuned case's clock.
            todo = kernels if a.mode in ("throughput", "both") else []
            grids = bg.submit(lambda: [get_space(k).grid() for k in todo])
            runner.start()
            grids.result()
            doc["device"], doc["versions"] = runner.device_info, runner.versions
            log(f"device {runner.device_name}, compile workers {runner.compile_workers}")
            with _results(doc, a.out, clock, log):
                if a.mode in ("search", "both"):
                    doc["search"] = run_search(kernels, cases or [], store, url, runner, clock,
                                               seeds=a.seeds, measure_n=a.measure_n, live=a.live,
                                               replay_fraction=a.replay_fraction, tag=tag, log=log)
                if a.mode in ("throughput", "both"):
                    doc["throughput"] = run_throughput(kernels, store, url, runner, clock,
                                                       n_trials=a.throughput_trials,
                                                       measure_n=a.measure_n, tag=tag, log=log)
        return 0
    finally:
        store.close()
        logf.close()
        if tmp is not None:
            tmp.cleanup()


@contextlib.contextmanager
def _results(doc: dict[str, Any], out: Path, clock: Clock, log: Any) -> Iterator[None]:
    """Write results.json and the plot when the block ends, also when it ends by an error."""
    try:
        yield
    finally:
        doc["elapsed_s"] = time.monotonic() - clock.t0
        (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
        if "search" in doc:
            plot(doc["search"], out / "best_so_far.png")
        log(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    raise SystemExit(main())
