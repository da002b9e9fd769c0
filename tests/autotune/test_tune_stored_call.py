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
