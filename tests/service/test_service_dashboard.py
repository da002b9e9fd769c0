"""The dashboard: records, charts, history and jobs; markup in data stays text; a real browser."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from svc_helpers import H200, KA, KB, LiveServer, record, settings_for

from kernelsearch.db.store import Store
from kernelsearch.service.api import create_app

XSS = '<script>document.title="pwned"</script><img src=x onerror="document.body.dataset.pwned=1">'
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = os.environ.get("KS_CHROMIUM", "/usr/bin/chromium")


def _fill(store: Store) -> None:
    for n, lat in ((64, 9.0), (128, 20.0), (1024, 80.0), (4096, 300.0)):
        store.upsert_best(record(KB, {"seq_len": n}, lat))
    store.upsert_best(record(KA, {"total_patches": 256}, 4.0))
    # Markup in every free-text field a record or a job can carry.
    store.upsert_best(record(KB, {"seq_len": 8}, 3.0, device=XSS, config={"ROWS": XSS}))
    for i, (state, lat) in enumerate((("complete", 30.0), ("fail", None), ("complete", 22.0))):
        store.add_trial_summary("study-b-128", KB, H200, {"seq_len": 128}, i, state,
                                {"ROWS": i}, lat, None if lat else "compile_error",
                                None if lat else XSS)
    store.create_job(KB, [{"seq_len": 2}], 5, "tpe")
    store.create_job(XSS, [{"seq_len": 3}], 5, "tpe")
    claimed = store.claim_job("test-owner", 60)
    store.update_job_progress(claimed.id, "test-owner", trials_done=2, device=XSS)
    store.finish_job(claimed.id, "test-owner", "failed", error=XSS)


def test_dashboard_renders_and_escapes(sqlite_store: Store) -> None:
    _fill(sqlite_store)
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        r = c.get("/", params={"kernel": KB, "device": H200, "seq_len": 128})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        html = r.text
        assert "<script>document.title" not in html and "<img src=x" not in html
        assert "&lt;script&gt;document.title" in html
        assert html.count("<script") == 1  # only the vendored poller
        local = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "http://" not in local and "https://" not in local  # nothing from elsewhere
        assert f"{KB}" in html and "% of roofline" in html
        assert html.count("<svg") >= 3  # one latency chart per (kernel, device), plus history
        assert "3 trials, 1 failed" in html
        assert 'data-series="best so far"' in html
        assert c.get("/static/dashboard.js").status_code == 200
        assert c.get("/static/dashboard.css").status_code == 200


def test_dashboard_empty(sqlite_store: Store) -> None:
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/").text
        assert "No tuned records yet" in html and "No jobs yet" in html


@pytest.mark.browser
def test_dashboard_in_headless_chromium(sqlite_store: Store) -> None:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    _fill(sqlite_store)
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    ARTIFACTS.mkdir(exist_ok=True)
    with LiveServer(app) as server, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            outside: list[str] = []
            page.on("request", lambda req: None if req.url.startswith(server.url)
                    else outside.append(req.url))
            page.goto(f"{server.url}/?kernel={KB}&device={H200}&seq_len=128")
            # The poller replaced the jobs table from /v1/jobs.
            page.wait_for_selector("body[data-jobs-polled]", timeout=15_000)
            assert page.title() == "kernelsearch"
            assert page.evaluate("document.body.dataset.pwned") is None
            assert page.locator("table.records").count() >= 3
            assert page.locator("#history svg circle").count() >= 2
            job_rows = page.locator("#jobs-body tr")
            assert job_rows.count() == 2
            failed = page.locator("#jobs-body tr.status-failed td.error")
            assert failed.inner_text().startswith("<script>")  # shown as text, not run
            # A new job appears without reloading the page.
            sqlite_store.create_job(KA, [{"total_patches": 4}], 1, "random")
            deadline = time.monotonic() + 15
            while job_rows.count() != 3:
                assert time.monotonic() < deadline, "the jobs table never refreshed"
                page.wait_for_timeout(200)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            assert not errors, errors
            assert not outside, outside
        finally:
            browser.close()
