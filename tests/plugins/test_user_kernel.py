"""A user's kernel through the public contract: found, searched, tuned, stored and served with no
edit to the package, its dtype kept apart, and its source identity following its jit helpers."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

HERE = Path(__file__).resolve().parent
FP16 = {"n": 96, "dtype": "float16"}


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.update(extra)
    return env


def test_found_in_a_fresh_process_through_KS_KERNEL_MODULES():
    code = "import kernelsearch; print(' '.join(kernelsearch.kernel_names()))"
    out = subprocess.run([sys.executable, "-c", code], env=_env(KS_KERNEL_MODULES="ks_user_axpy"),
                         capture_output=True, text=True, timeout=120, check=True)
    assert "ks_user_axpy" in out.stdout.split()
    bare = subprocess.run([sys.executable, "-c", code], env=_env(KS_KERNEL_MODULES=""),
                          capture_output=True, text=True, timeout=120, check=True)
    assert "ks_user_axpy" not in bare.stdout.split()


def test_a_module_that_fails_to_import_is_named(tmp_path, monkeypatch):
    from kernelsearch.kernels import registry

    (tmp_path / "ks_broken_plugin.py").write_text("raise RuntimeError('no CUDA toolkit here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.PluginLoadError, match="ks_broken_plugin.*no CUDA toolkit"):
        registry.load_module("ks_broken_plugin")
    with pytest.raises(registry.UnknownKernel, match="ks_broken_plugin"):
        registry.get_kernel("ks_broken_kernel")


def test_space_is_exactly_the_declared_configs():
    import ks_user_axpy

    from kernelsearch.kernels.spec import from_triton_config
    from kernelsearch.search_space.space import load_space

    grid = load_space(ks_user_axpy.NAME).grid()
    assert grid == [ks_user_axpy.KERNEL.validate_config(from_triton_config(c))
                    for c in ks_user_axpy.CONFIGS]
    meta, launch = ks_user_axpy.KERNEL.meta_parameters(grid[2]), ks_user_axpy.KERNEL.launch_options(grid[2])
    assert meta == {"BLOCK": 128} and launch == {"num_warps": 4, "num_stages": 2, "num_ctas": 1}


def test_dtype_is_part_of_the_case_and_checked():
    import ks_user_axpy

    k = ks_user_axpy.KERNEL
    assert k.validate_axes({"n": "96", "dtype": "float32"}) == {"n": 96, "dtype": "float32"}
    with pytest.raises(ValueError, match="axis 'dtype' must be one of"):
        k.validate_axes({"n": 96, "dtype": "float64"})
    with pytest.raises(ValueError, match="axis 'n' must be an integer"):
        k.validate_axes({"n": "1_000", "dtype": "float16"})
    assert k.distance(FP16, {"n": 96, "dtype": "float32"}) == float("inf")
    assert k.distance(FP16, {"n": 192, "dtype": "float16"}) == pytest.approx(
        k.distance(FP16, {"n": 48, "dtype": "float16"}))
    assert k.rtol_for(FP16) > k.rtol_for({"n": 96, "dtype": "float32"})


def test_tuned_stored_and_served_without_crossing_dtypes(ss_store):
    import ks_user_axpy

    from kernelsearch.search_space.runner import TrialRunner
    from kernelsearch.search_space.tuner import TuneOptions, tune_case
    from kernelsearch.service.api import create_app
    from kernelsearch.service.settings import Settings

    store, url = ss_store
    with TrialRunner(trial_timeout_s=60, compile_workers=0) as r:
        assert "ks_user_axpy" in r.registered_modules  # the child learns the kernel from its module
        res = tune_case(ks_user_axpy.NAME, FP16, store=store, storage=url, runner=r,
                        options=TuneOptions(n_trials=3, sampler="grid", seed=0, measure_n=2))
    assert res.trials.n_complete == 3 and res.trials.n_failed == 0
    (rec,) = store.list_records(ks_user_axpy.NAME)
    assert rec.axes == FP16 and rec.source_hash == ks_user_axpy.KERNEL.source_hash
    app = create_app(Settings(database_url=url), store=store)
    with TestClient(app) as c:
        q = {"kernel": ks_user_axpy.NAME, "device": rec.device}
        exact = c.get("/v1/best", params={**q, "n": 96, "dtype": "float16"})
        assert exact.status_code == 200 and exact.json()["match"] == "exact"
        near = c.get("/v1/best", params={**q, "n": 1000, "dtype": "float16"})  # within KS_NEAREST_MAX_RATIO
        assert near.status_code == 200 and near.json()["match"] == "nearest"
        other = c.get("/v1/best", params={**q, "n": 96, "dtype": "float32"})
        assert other.status_code == 404, other.text
        bad = c.get("/v1/best", params={**q, "n": 96, "dtype": "int8"})
        assert bad.status_code == 422 and "dtype" in bad.text


def _load_variant(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_source_identity_follows_the_jit_functions_a_kernel_calls(tmp_path):
    """Triton's JIT cache key covers called jit functions: an edit to a shared helper is a new
    identity for every record of the kernel, while an unrelated edit to the module is not."""
    from kernelsearch.kernels import registry

    src = (HERE / "ks_user_axpy.py").read_text()
    same = src.replace('NAME = "ks_user_axpy"', 'NAME = "ks_user_axpy_copy"')
    helper = src.replace('NAME = "ks_user_axpy"', 'NAME = "ks_user_axpy_edit"').replace(
        "return a * x + y", "return y + a * x")
    assert helper != same
    (tmp_path / "ks_axpy_same.py").write_text(same + "\nUNRELATED = 1\n")
    (tmp_path / "ks_axpy_helper.py").write_text(helper)
    try:
        a = _load_variant(tmp_path / "ks_axpy_same.py", "ks_axpy_same").KERNEL.source_hash
        b = _load_variant(tmp_path / "ks_axpy_helper.py", "ks_axpy_helper").KERNEL.source_hash
    finally:
        registry.unregister("ks_user_axpy_copy")
        registry.unregister("ks_user_axpy_edit")
    import ks_user_axpy

    assert a == ks_user_axpy.KERNEL.source_hash
    assert b != a


def test_a_job_whose_kernel_cannot_be_imported_fails_and_the_worker_lives(ss_store, tmp_path,
                                                                          monkeypatch):
    from kernelsearch.service.settings import Settings
    from kernelsearch.service.worker import Worker

    store, url = ss_store
    (tmp_path / "ks_broken_job_plugin.py").write_text(
        textwrap.dedent("""\
            import nonexistent_dependency_of_the_plugin
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KS_KERNEL_MODULES", "ks_broken_job_plugin,ks_user_axpy")
    bad = store.create_job("ks_broken_job_kernel", [{"n": 8}], 1, "grid")
    good = store.create_job("ks_user_axpy", [{"n": 64, "dtype": "float32"}], 1, "grid")
    worker = Worker(Settings(database_url=url, trial_timeout_s=60), store)
    try:
        assert worker.run_one() and worker.run_one()
    finally:
        worker.close()
    failed = store.get_job(bad.id)
    assert failed.status == "failed"
    assert "ks_broken_job_plugin" in failed.error and "nonexistent_dependency" in failed.error
    assert store.get_job(good.id).status == "succeeded"


def test_cli_loads_a_kernel_module_and_names_one_that_fails():
    cli = [sys.executable, "-m", "kernelsearch.service.cli"]
    ok = subprocess.run([*cli, "--kernel-module", "ks_user_axpy", "kernels", "ks_user_axpy", "--json"],
                        env=_env(), capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    import json

    doc = json.loads(ok.stdout)
    assert [a["name"] for a in doc["axes"]] == ["n", "dtype"]
    assert {p["name"]: p["launch_option"] for p in doc["params"]}["num_warps"] is True
    bad = subprocess.run([*cli, "--kernel-module", "ks_no_such_module", "kernels"], env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "ks_no_such_module" in bad.stderr
