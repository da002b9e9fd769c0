"""`kernelsearch tune NAME` of an undeclared kernel: tuned here, in trial children as a worker
would, on the call stored with an earlier job of the kernel (it has no inputs of its own); the
record it stores serves the kernel like a worker's."""
from __future__ import annotations

import os

import pytest
import torch
from at_env import HERE
from typer.testing import CliRunner

from kernelsearch.kernels import registry
from kernelsearch.kernels.capture import CAPTURE_VERSION
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch import identity
from kernelsearch.service.cli import app

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("isolated_client")]
N = 200


def test_tune_runs_on_the_stored_call(sqlite_store, monkeypatch) -> None:
    import ks_undeclared_user as u

    x = torch.randn(N)
    named = {"x_ptr": x, "y_ptr": torch.empty_like(x), "n": N}
    und = identity.undeclared_kernel(u.scale_kernel, named)
    sqlite_store.save_definition(und.name, und.definition.as_json())
    tensor = {"kind": "tensor", "shape": [N], "strides": [1], "dtype": "float32"}
    call = {"version": CAPTURE_VERSION, "grids": [[-(-N // c.kwargs["BLOCK"]), 1, 1] for c in u.CONFIGS],
            "args": [{"name": "x_ptr", **tensor}, {"name": "y_ptr", **tensor},
                     {"name": "n", "kind": "scalar", "value": N}]}
    case = {"n": N, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    sqlite_store.queue_job(und.name, [case], 3, "grid", capture=call)
    registry.unregister(und.name)  # a fresh process: the database knows the kernel
    # Trial children import the user's module as a worker does.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    got = CliRunner().invoke(app, ["tune", und.name, "--url", sqlite_store.url, "--trials", "3",
                                   "--sampler", "grid", "--no-warm-start"])
    assert got.exit_code == 0, got.output
    (rec,) = sqlite_store.list_records(kernel=und.name)
    assert rec.axes == case and rec.device == INTERPRETER_DEVICE
    assert rec.source_hash == und.definition.source_hash and len(rec.config_timings) == 3


def _tuned_once(sqlite_store, monkeypatch, *extra: str):
    """The stored call's kernel tuned once by `kernelsearch tune` (`extra` arguments added)."""
    import ks_undeclared_user as u

    x = torch.randn(N)
    named = {"x_ptr": x, "y_ptr": torch.empty_like(x), "n": N}
    und = identity.undeclared_kernel(u.scale_kernel, named)
    if not sqlite_store.kernel_captures(und.name):
        sqlite_store.save_definition(und.name, und.definition.as_json())
        tensor = {"kind": "tensor", "shape": [N], "strides": [1], "dtype": "float32"}
        call = {"version": CAPTURE_VERSION,
                "grids": [[-(-N // c.kwargs["BLOCK"]), 1, 1] for c in u.CONFIGS],
                "args": [{"name": "x_ptr", **tensor}, {"name": "y_ptr", **tensor},
                         {"name": "n", "kind": "scalar", "value": N}]}
        sqlite_store.queue_job(und.name, [CASE], 3, "grid", capture=call)
    registry.unregister(und.name)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    got = CliRunner().invoke(app, ["tune", und.name, "--url", sqlite_store.url, "--trials", "3",
                                   "--sampler", "grid", "--no-warm-start", *extra])
    assert got.exit_code == 0, got.output
    return und.name


CASE = {"n": N, "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}


def _study_trials(url: str, name: str) -> list:
    import optuna

    from kernelsearch.search_space.tuner import study_name

    return optuna.load_study(study_name=study_name(name, CASE, INTERPRETER_DEVICE),
                             storage=url).trials


def test_tune_fresh_measures_every_config_again(sqlite_store, monkeypatch) -> None:
    """Without --fresh a second run adds to the study (the grid is done: nothing re-runs, a
    failed trial never would); with it the study starts anew and every config runs again."""
    name = _tuned_once(sqlite_store, monkeypatch)
    first = {t.number: t.datetime_start for t in _study_trials(sqlite_store.url, name)}
    assert len(first) == 3
    _tuned_once(sqlite_store, monkeypatch, "--fresh")
    again = _study_trials(sqlite_store.url, name)
    assert len(again) == 3 and all(t.datetime_start > max(first.values()) for t in again)


def test_a_withdrawn_record_stays_withdrawn_until_a_new_measurement(sqlite_store,
                                                                   monkeypatch) -> None:
    """`records delete` resets the record's study: the next tune measures every config again
    rather than re-making the record from the trials that made it."""
    name = _tuned_once(sqlite_store, monkeypatch)
    (rec,) = sqlite_store.list_records(kernel=name)
    before = max(t.datetime_start for t in _study_trials(sqlite_store.url, name))
    got = CliRunner().invoke(app, ["records", "delete", str(rec.id), "--url", sqlite_store.url])
    assert got.exit_code == 0, got.output
    assert sqlite_store.list_records(kernel=name) == []
    with pytest.raises(KeyError):
        _study_trials(sqlite_store.url, name)
    _tuned_once(sqlite_store, monkeypatch)
    assert len(sqlite_store.list_records(kernel=name)) == 1
    trials = _study_trials(sqlite_store.url, name)
    assert len(trials) == 3 and all(t.datetime_start > before for t in trials)
