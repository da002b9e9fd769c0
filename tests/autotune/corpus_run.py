"""The corpus (corpus_pkg) run as a user program, every entry in this one process:

    corpus_run.py triton OUT.pt     plain `triton.autotune` (kernelsearch never imported)
    corpus_run.py ks OUT.pt         the decorator swapped: `triton.autotune = kernelsearch.autotune`
                                    before the package is imported; the environment names the
                                    service or store
    corpus_run.py faults OUT.pt SPEC.json
                                    swapped, the whole corpus once per fault: SPEC maps a fault's
                                    name to the KS_* environment it runs under

OUT.pt gets each entry's output tensors; the last stdout line is JSON: per entry (per fault and
entry for `faults`) the error that reached the call (a traceback, or null), the sources its
autotuners report and how many configs this process benchmarked. Under the interpreter Triton's
own autotuner has no benchmarker: plain mode gets a wall-clock one (what the swapped decorator
uses there)."""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import triton
from triton.runtime.autotuner import Autotuner as TritonAutotuner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus_pkg import ENTRIES  # noqa: E402  (names only: no kernel is imported yet)

BENCHED = [0]


def _counting(real):
    def _bench(self, *args, **kwargs):
        BENCHED[0] += 1
        return real(self, *args, **kwargs)
    return _bench


def _wallclock(fn, quantiles=None, **_kw):
    fn()
    t0 = time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1e3
    return [ms, ms, ms] if quantiles else ms


def _serialize_interpreter_launches() -> None:
    """The interpreter runs one launch at a time (its grid state is global, and a second thread's
    launch fails "x >= grid_dim[0]"), as a GPU stream serializes them: the autotuners' own code
    still runs in every thread at once."""
    import threading

    from triton.runtime.interpreter import InterpretedFunction

    lock, real = threading.Lock(), InterpretedFunction.run

    def run(self, *args, **kwargs):
        with lock:
            return real(self, *args, **kwargs)
    InterpretedFunction.run = run


def _tuners(module) -> list[TritonAutotuner]:
    return [v for v in vars(module).values() if isinstance(v, TritonAutotuner)]


def _run_entry(name: str) -> tuple[dict, dict]:
    """One entry's outputs and its summary; any exception that reaches the call is recorded."""
    BENCHED[0] = 0
    try:
        module = importlib.import_module(f"corpus_pkg.{name}")
        out = module.run()
        error = None
    except BaseException:  # noqa: BLE001  (anything that reaches the user's call)
        module, out, error = sys.modules.get(f"corpus_pkg.{name}"), {}, traceback.format_exc()
    sources = sorted(s.value for t in (_tuners(module) if module else [])
                     for s in getattr(t, "sources", {}).values())
    return out, {"error": error, "sources": sources, "benched": BENCHED[0]}


def _corpus() -> tuple[dict, dict]:
    outs, summary = {}, {}
    for name in ENTRIES:
        outs[name], summary[name] = _run_entry(name)
    return outs, summary


def _drain() -> None:
    from kernelsearch.backends import BACKENDS

    BACKENDS.drain(30)


def _forget_all() -> None:
    """A fresh process's view for the next fault: no key resolved, no connection, no down state."""
    from kernelsearch.backends import BACKENDS

    for name in ENTRIES:
        module = sys.modules.get(f"corpus_pkg.{name}")
        for t in (_tuners(module) if module else []):
            t.forget()
    BACKENDS.reset()


def main() -> int:
    mode, out_path = sys.argv[1], Path(sys.argv[2])
    TritonAutotuner._bench = _counting(TritonAutotuner._bench)
    _serialize_interpreter_launches()
    if mode == "triton":
        TritonAutotuner.do_bench = property(lambda self: self._do_bench or _wallclock)
        outs, summary = _corpus()
    else:
        import kernelsearch

        triton.autotune = kernelsearch.autotune
        if mode == "ks":
            outs, summary = _corpus()
            _drain()
        else:
            spec = json.loads(Path(sys.argv[3]).read_text())
            outs, summary = {}, {}
            for fault, env in spec.items():
                for k in [k for k in os.environ if k.startswith("KS_")]:
                    del os.environ[k]
                os.environ.update(env)
                _forget_all()
                outs[fault], summary[fault] = _corpus()
                _drain()
    torch.save(outs, out_path)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
