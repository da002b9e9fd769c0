"""Messages that say what is accepted and what is missing: a float key in /v1/best, the axes
/v1/kernels lists, a 404 for a category with no record, a kernel module a worker cannot
import, `serve` on a database that does not exist."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from svc_helpers import settings_for
from test_search_jobs import NAME, _definition
from typer.testing import CliRunner

from kernelsearch.kernels import get_kernel
from kernelsearch.service.api import create_app
from kernelsearch.service.definitions import register_definition

pytestmark = pytest.mark.timeout(300)
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def test_a_float_key_says_how_it_is_written_and_kernels_lists_the_tokens(sqlite_store) -> None:
    register_definition(_definition(), sqlite_store)
    sqlite_store.save_definition(NAME, _definition())
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        got = c.get("/v1/best", params={"kernel": NAME, "device": "cpu", "n": "0.5",
                                        "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"})
        assert got.status_code == 422
        assert "n=float:0.5" in got.text, got.text
        (n,) = [a for a in c.get(f"/v1/kernels/{NAME}").json()["axes"] if a["name"] == "n"]
        assert "float:" in n["tokens"] and "float:0.5" in n["accepts"]


def test_a_missing_category_is_named_in_the_404(sqlite_store, monkeypatch) -> None:
    from svc_like import put_record

    monkeypatch.syspath_prepend(str(PLUGINS))
    axpy = importlib.import_module("ks_user_axpy")
    k = get_kernel(axpy.NAME)
    put_record(sqlite_store, k, {"n": 1024, "dtype": "float32"}, k.default_config, device="D")
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        got = c.get("/v1/best", params={"kernel": k.name, "device": "D", "n": "1024",
                                        "dtype": "float16"})
    assert got.status_code == 404
    msg = got.json()["detail"]
    assert "the category dtype=float16 has no record there" in msg
    assert "its categories with records: dtype=float32" in msg


def test_a_module_a_worker_cannot_import_names_pythonpath() -> None:
    from kernelsearch.kernels.capture import KernelModuleUnavailable, import_object

    with pytest.raises(KernelModuleUnavailable) as info:
        import_object("no_such_user_module", "k")
    assert "PYTHONPATH" in str(info.value) and "KS_KERNEL_MODULES" in str(info.value)


def test_serve_on_a_missing_sqlite_file_creates_nothing(tmp_path) -> None:
    from kernelsearch.service.cli import app

    db = tmp_path / "nowhere.db"
    got = CliRunner().invoke(app, ["serve"], env={"KS_DATABASE_URL": f"sqlite:///{db}"})
    assert got.exit_code == 2 and "kernelsearch db upgrade" in got.output
    assert not db.exists()
