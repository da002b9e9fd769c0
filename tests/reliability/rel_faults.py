"""What the fault tests share: `kernelsearch worker` processes (or the fake worker, for faults
injected inside one), polling with a bound, and the figures every fault test prints: jobs
survived, trials lost or doubled per study, history rows against Optuna's own trials."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ks_stack import Proc, kernelsearch_exe

HERE = Path(__file__).resolve().parent
# Workload A's smallest cases: about a second a trial under the interpreter.
KERNEL = "vision_rope_generation_bwd"
FINAL = ("succeeded", "failed", "cancelled")
WORKER_ENV = {
    "KS_MEASURE_N": "2", "KS_TUNE_REFERENCE": "none", "KS_WORKER_POLL_S": "0.3",
    "KS_LEASE_S": "3", "KS_HEARTBEAT_S": "0.5", "KS_LOG_LEVEL": "INFO",
    "KS_API_TOKEN": "",
}


def case(n: int) -> dict[str, int]:
    return {"total_patches": n}


@dataclass
class Procs:
    """Processes a test starts, each with a log; close() stops what is still running."""

    workdir: Path
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> Proc:
        env = {**os.environ, **WORKER_ENV, **self.env, **(extra_env or {})}
        env.pop("KS_SERVICE_URL", None)
        log = self.workdir / f"{name}.log"
        with log.open("wb") as fh:
            popen = subprocess.Popen(argv, env=env, cwd=self.workdir, stdout=fh,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, extra_env: dict[str, str] | None = None, fake: bool = False) -> Proc:
        argv = ([sys.executable, str(HERE / "fake_worker.py")] if fake
                else [kernelsearch_exe(), "worker"])
        return self.start(name, argv, {"KS_WORKER_ID": name, **(extra_env or {})})

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (rc={p.popen.poll()}) ---\n{p.tail(4000)}" for p in self.procs)

    def kill(self, proc: Proc) -> None:
        """SIGKILL the process and its trial child, as `docker kill` does."""
        os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(30)

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait(10)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, procs: Procs,
             every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out ({timeout:g} s) waiting for {what}\n{procs.logs()}"
        time.sleep(every)


def wait_final(store: Any, job_ids: list[int], timeout: float, procs: Procs) -> list[Any]:
    wait_for(lambda: all(store.get_job(j).status in FINAL for j in job_ids), timeout,
             f"jobs {job_ids} to finish", procs, every=0.3)
    return [store.get_job(j) for j in job_ids]


def study_figures(store: Any, url: str, kernel: str, axes: dict[str, int], n_trials: int) -> dict[str, Any]:
    """One case's study as Optuna holds it against the store's history rows."""
    import optuna
    from optuna.trial import TrialState

    from kernelsearch.kernels.device import INTERPRETER_DEVICE
    from kernelsearch.search_space.tuner import A_CONFIG, A_RUN, study_name

    name = study_name(kernel, axes, INTERPRETER_DEVICE)
    try:
        study = optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return {"case": axes, "evaluated": 0, "lost": n_trials, "doubled": 0, "configs": 0,
                "running": 0, "history_rows": 0, "history_matches": True}
    trials = study.get_trials(deepcopy=False)
    evaluated = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get(A_RUN)]
    configs = {json.dumps(t.user_attrs[A_CONFIG], sort_keys=True) for t in evaluated}
    rows = [r for r in store.trial_summaries(kernel, INTERPRETER_DEVICE, axes)
            if r["state"] in ("complete", "fail") and r["study_name"] == name]
    return {
        "case": axes,
        "evaluated": len(evaluated),
        "lost": max(0, n_trials - len(evaluated)),
        "doubled": max(0, len(evaluated) - n_trials) + (len(evaluated) - len(configs)),
        "configs": len(configs),
        "running": sum(t.state == TrialState.RUNNING for t in trials),
        "history_rows": len(rows),
        "repaired_rows": sum(bool((r["extra"] or {}).get("repaired")) for r in rows),
        "history_matches": sorted(r["trial_number"] for r in rows) == sorted(t.number for t in evaluated),
    }


def print_figures(title: str, figures: dict[str, Any]) -> None:
    """The figures a fault test reports (run pytest with -s to see them; -rA shows them too)."""
    print(f"\n=== {title} ===")
    for k, v in figures.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            print(f"  {k}:")
            for item in v:
                print(f"    {item}")
        else:
            print(f"  {k}: {v}")


def latency_summary(samples: list[tuple[int, float]]) -> dict[str, Any]:
    """Status counts and latency quantiles (ms) of (status, seconds) samples."""
    codes: dict[int, int] = {}
    for code, _ in samples:
        codes[code] = codes.get(code, 0) + 1
    lat = sorted(s for _, s in samples)
    if not lat:
        return {"n": 0, "codes": codes}

    def q(p: float) -> float:
        return round(1000 * lat[min(len(lat) - 1, int(p * len(lat)))], 1)

    return {"n": len(lat), "codes": codes, "p50_ms": q(0.5), "p99_ms": q(0.99),
            "max_ms": round(1000 * lat[-1], 1)}
