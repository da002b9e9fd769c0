"""The load script against a real `kernelsearch serve` on SQLite: every answer is right before,
during (no error, no non-2xx) and after a short bounded run, and the lookup cache follows a
record that another process improves. No timing is asserted: docs/load.md has the numbers."""
from __future__ import annotations

from trusted_records import trusted

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from svc_record import a_record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

def _loadtest():
    """docs/tools' `python -m kernelsearch_tools.loadtest`; its Python engine's spawned processes
    import it as `kernelsearch_tools.loadtest` too."""
    import kernelsearch_tools.loadtest

    return kernelsearch_tools.loadtest


@pytest.mark.parametrize("engine", ["wrk", "python"])
def test_bounded_load_run_answers_correctly(engine, tmp_path):
    if engine == "wrk" and shutil.which("wrk") is None:
        pytest.skip("Debian's wrk is not installed (apt-get install wrk)")
    lt = _loadtest()
    out = tmp_path / "load.json"
    args = lt.parse_args(["--spawn", "--engine", engine, "--requests", "600", "--clients", "4",
                          "--threads", "2", "--time-limit", "60", "--json", str(out)])
    report = lt.run(args)
    r = report["result"]
    assert r["errors"] == 0 and r["non_2xx"] == 0
    assert r["requests"] >= 600 and not r["extra"]["time_limited"]
    from importlib.metadata import entry_points

    from kernelsearch import kernels

    suite = sum(len(kernels.get_kernel(ep.name).cases)
                for ep in {ep.name: ep for ep in entry_points(group="kernelsearch.kernels")}.values())
    assert report["lookups"]["exact"] == suite >= 32 and report["lookups"]["nearest"] > 0
    assert report["lookups"]["verified_before_and_after"]


def test_load_script_refuses_a_non_loopback_target():
    lt = _loadtest()
    with pytest.raises(lt.LoadTestError, match="127.0.0.1"):
        lt.require_loopback("http://example.com:8000")
    assert lt.require_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert lt.main(["--url", "http://10.0.0.1:8000", "--database-url", "sqlite:///x"]) == 2
    # The documented entry point, `python -m kernelsearch_tools.loadtest`, from the repository root.
    out = subprocess.run([sys.executable, "-m", "kernelsearch_tools.loadtest", "--url", "http://10.0.0.1:8000",
                          "--database-url", "sqlite:///x"], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 2 and "127.0.0.1" in out.stderr, out.stderr


def test_lookup_cache_follows_a_better_record_from_another_process(sqlite_url, tmp_path):
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store

    lt = _loadtest()
    kernel, axes, device = "vision_rope3d_spatial_merge_bwd", {"seq_len": 256}, "NVIDIA H200"
    from kernelsearch import kernels

    configs = lt.synthetic_configs(kernels.get_kernel(kernel), 2)
    assert configs[0] != configs[1]
    upgrade(sqlite_url)
    store = Store(sqlite_url)
    store.upsert_best(trusted(a_record(kernel, axes, device, 20.0, configs[0])))
    server = lt.start_server(sqlite_url, tmp_path, extra_env={"KS_RECORDS_CHECK_S": "0.2"})
    try:
        q = {"kernel": kernel, "device": device, **axes}
        with httpx.Client(base_url=server.base, timeout=10) as c:
            for _ in range(20):  # warm the cache
                assert c.get("/v1/best", params=q).json()["config"] == configs[0]
            _, improved = store.upsert_best(trusted(a_record(kernel, axes, device, 10.0, configs[1])))
            assert improved
            deadline = time.monotonic() + 20
            while c.get("/v1/best", params=q).json()["config"] != configs[1]:
                assert time.monotonic() < deadline, "the cache never saw the better record"
                time.sleep(0.1)
            assert c.get("/v1/best", params=q).json()["latency_us"] == pytest.approx(10.0)
    finally:
        server.stop()
        store.close()
