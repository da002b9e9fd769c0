"""The dashboard: records, charts, case and job pages, live jobs with cancel; markup in data stays
text; a real browser, with screenshots under test-artifacts/."""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from svc_helpers import H200, KA, KB, LiveServer, record, settings_for

from kernelsearch.db.interfaces import Lease
from kernelsearch.db.store import Store
from kernelsearch.service.api import create_app
from kernelsearch.service.charts import Series, make_chart, microseconds, si

XSS = '<script>document.title="pwned"</script><img src=x onerror="document.body.dataset.pwned=1">'
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = os.environ.get("KS_CHROMIUM", "/usr/bin/chromium")
TOKEN = "dash-token-0123"
CASE_128 = "/case?" + urlencode({"kernel": KB, "device": H200, "seq_len": 128})


def _fill(store: Store) -> dict[str, int]:
    for n, lat in ((64, 9.0), (128, 20.0), (1024, 80.0), (4096, 300.0)):
        store.upsert_best(record(KB, {"seq_len": n}, lat, study_name=f"study-b-{n}"))
    # Tuned under other versions than this server's.
    store.upsert_best(record(KA, {"total_patches": 256}, 4.0, torch_version="2.9.0+old",
                             source_hash="0ldhash"))
    # Markup in every free-text field a record or a job can carry.
    store.upsert_best(record(KB, {"seq_len": 8}, 3.0, device=XSS, config={"ROWS": XSS}))
    failed = store.create_job(KB, [{"seq_len": 128}], 5, "tpe")
    claimed = store.claim_job("test-owner", 60)
    assert claimed.id == failed.id
    for i, (state, lat) in enumerate((("complete", 30.0), ("fail", None), ("complete", 22.0),
                                      ("fail", None))):
        store.add_trial_summary("study-b-128", KB, H200, {"seq_len": 128}, i, state,
                                {"ROWS": i}, lat, None if lat else "compile_error",
                                None if lat else f"ptxas #{i}: {XSS}", job_id=failed.id)
    store.update_job_progress(Lease.of(claimed), trials_done=4, device=H200)
    store.finish_job(Lease.of(claimed), "failed", error=XSS)
    running = store.create_job(KB, [{"seq_len": 64}, {"seq_len": 1024}], 4, "tpe")
    store.update_job_progress(Lease.of(store.claim_job("test-owner", 60)), trials_done=3, device=H200,
                              current_case={"index": 1, "axes": {"seq_len": 1024}, "trials_done": 1,
                                            "n_trials": 4, "best_latency_us": 81.5},
                              best={"cases": [{"axes": {"seq_len": 64}, "best_latency_us": 8.75}]})
    queued = store.create_job(XSS, [{"seq_len": 3}], 5, "tpe")
    return {"failed": failed.id, "running": running.id, "queued": queued.id}


def test_ticks_are_si_formatted() -> None:
    assert [si(v) for v in (1, 20, 1000, 1500, 1e6)] == ["1", "20", "1k", "1.5k", "1M"]
    assert [microseconds(v) for v in (0.37, 2.5, 3.7845, 1000.0, 1234.5)] == [
        "370 ns", "2.5 µs", "3.784 µs", "1 ms", "1.234 ms"]
    c = make_chart([Series("tuned", [(0, 3.0), (1, 40_000.0), (2, 2e6)])], title="t", y_label="y",
                   y_format=microseconds)
    labels = [label for _, label in c.y_ticks]
    assert labels and not any("e+" in label or "e-" in label for label in labels), labels
    assert "1 ms" in labels and "1 s" in labels
    x = make_chart([Series("s", [(i * 1000, 1.0 + i) for i in range(6)])], title="t", y_label="y")
    assert [label for _, label in x.x_ticks][:3] == ["0", "1k", "2k"]


def test_legend_names_only_drawn_lines() -> None:
    c = make_chart([Series("tuned", [(0, 3.0), (1, 4.0)]), Series("eager reference", [(0, None), (1, None)]),
                    Series("roofline", [(0, 2.0), (1, None)])], title="t", y_label="y")
    assert [e["name"] for e in c.legend] == ["tuned", "roofline"]
    assert [p["name"] for p in c.paths] == ["tuned", "roofline"]
    # Many long names wrap onto further rows inside the plot's width, never past it.
    many = make_chart([Series("a long series name %d" % i, [(0, 1.0 + i), (1, 2.0 + i)]) for i in range(8)],
                      title="t", y_label="y", width=500)
    assert max(e["x"] for e in many.legend) < 500 and len({e["y"] for e in many.legend}) > 1
    assert many.plot[1] > c.plot[1]  # the plot starts below the legend's rows


def test_dashboard_renders_and_escapes(sqlite_store: Store) -> None:
    _fill(sqlite_store)
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        html = r.text
        assert "<script>document.title" not in html and "<img src=x" not in html
        assert "&lt;script&gt;document.title" in html
        assert html.count("<script") == 1  # only the vendored poller
        local = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "http://" not in local and "https://" not in local  # nothing from elsewhere
        assert f"{KB}" in html and "% of roofline" in html
        assert html.count("<svg") >= 3  # one latency chart per (kernel, device)
        assert "e+0" not in html
        # The records carry no references here: the legend names no reference line.
        assert 'class="legend" data-series="tuned"' in html
        assert 'data-series="eager reference"' in html  # from the records' speedups
        # Versions: KA's record is marked, the others are the server's.
        assert "⚠ torch 2.9.0+old" in html and "kernel source 0ldhash" in html
        assert html.count('class="drift"') == 1
        assert CASE_128.replace("&", "&amp;").replace(" ", "+") in html
        # Jobs: the failed one links its failed trials; no cancel without a service token.
        assert "failed trials" in html and 'id="cancel-off"' in html and "<button" not in html
        assert c.get("/static/dashboard.js").status_code == 200
        assert c.get("/static/dashboard.css").status_code == 200


def test_case_page_lists_every_trial(sqlite_store: Store) -> None:
    ids = _fill(sqlite_store)
    settings = settings_for(sqlite_store.url, optuna_dashboard_url="http://127.0.0.1:8099/")
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        r = c.get(CASE_128)
        assert r.status_code == 200, r.text
        html = r.text
        assert "4 trials, 2 failed" in html
        assert html.count('<tr class="failed"') == 2 and html.count('<tr class="ok"') == 2
        assert "compile_error" in html and "ptxas #1: &lt;script&gt;" in html
        assert "<script>document.title" not in html
        assert "ROWS=3" in html and "22 µs" in html
        assert f'href="/jobs/{ids["failed"]}"' in html
        assert 'data-series="best so far"' in html
        # The two failed trials are crosses on the axis, and the legend names them.
        marks = html[html.index('class="x-marks"'):]
        assert marks[:marks.index("</g>")].count("<path") == 2
        assert 'class="legend" data-series="failed trial"' in html
        assert 'href="http://127.0.0.1:8099/ks/study?name=study-b-128"' in html
        assert "version-drift" not in html  # the server's versions
        failed = c.get(CASE_128 + "&failed=1").text
        assert failed.count('<tr class="failed"') == 2 and '<tr class="ok"' not in failed
        other_job = c.get(CASE_128 + f"&job={ids['running']}").text
        assert "No trials" in other_job
        ka = c.get("/case", params={"kernel": KA, "device": H200, "total_patches": 256}).text
        assert 'id="version-drift"' in ka and "torch 2.9.0+old (server " in ka


@pytest.mark.parametrize("params, status, message", [
    ({"kernel": "nope", "device": H200, "seq_len": 1}, 404, "no kernel"),
    ({"kernel": KB, "device": H200}, 422, "axes"),
    ({"kernel": KB, "device": H200, "seq_len": "x"}, 422, "axes"),
    ({"kernel": KB, "device": "a\x00b", "seq_len": 1}, 422, "control character"),
    ({"kernel": KB, "device": H200, "seq_len": 1, "job": "1e3"}, 422, "job"),
    ({"device": H200}, 422, "needs kernel"),
])
def test_case_page_bad_arguments_are_4xx(sqlite_client: TestClient, params, status, message) -> None:
    r = sqlite_client.get("/case", params=params)
    assert r.status_code == status and message in r.text


def test_job_page_shows_its_failed_trials(sqlite_store: Store) -> None:
    ids = _fill(sqlite_store)
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get(f"/jobs/{ids['failed']}").text
        assert "Failed trials (2)" in html and "All trials (4)" in html
        case_link = (CASE_128 + f"&job={ids['failed']}#trials").replace("&", "&amp;").replace(" ", "+")
        assert case_link in html
        assert "&lt;script&gt;" in html and "<script>document" not in html
        running = c.get(f"/jobs/{ids['running']}").text
        assert "seq_len=1024" in running and "8.75 µs" in running  # current case, best so far
        assert "no worker has claimed the job yet" in c.get(f"/jobs/{ids['queued']}").text
        assert c.get("/jobs/999").status_code == 404
        assert c.get("/jobs/0").status_code == 422


def test_dashboard_empty(sqlite_store: Store) -> None:
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/").text
        assert "No tuned records yet" in html and "No jobs yet" in html


def _browser(pw, server):
    return pw.chromium.launch(
        executable_path=CHROMIUM, headless=True,
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--no-first-run",
              "--disable-dev-shm-usage"])


def _guarded_page(browser, server):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    outside: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda req: None if req.url.startswith(server.url) else outside.append(req.url))
    return page, errors, outside


@pytest.mark.browser
def test_dashboard_in_headless_chromium(sqlite_store: Store) -> None:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    ids = _fill(sqlite_store)
    app = create_app(settings_for(sqlite_store.url, api_token=TOKEN), store=sqlite_store)
    ARTIFACTS.mkdir(exist_ok=True)
    with LiveServer(app) as server, sync_api.sync_playwright() as pw:
        browser = _browser(pw, server)
        try:
            page, errors, outside = _guarded_page(browser, server)
            page.goto(f"{server.url}/")
            # The poller replaced the jobs table from /v1/jobs.
            page.wait_for_selector("body[data-jobs-polled]", timeout=15_000)
            assert page.title() == "kernelsearch"
            assert page.evaluate("document.body.dataset.pwned") is None
            assert page.locator("table.records").count() >= 3
            # Charts fill the page's width.
            width = page.evaluate("document.querySelector('main').clientWidth")
            svg = page.locator("#latency-1 svg").bounding_box()
            assert svg["width"] > 0.9 * (width - 40), (svg, width)
            ticks = page.locator("#latency-1 svg text").evaluate_all("els => els.map(e => e.textContent)")
            assert "µs" in " ".join(ticks), ticks
            assert not [t for t in ticks if re.search(r"\de[+-]\d", t)], ticks
            rows = page.locator("#jobs-body tr")
            assert rows.count() == 3
            failed = page.locator(f"#jobs-body tr[data-job='{ids['failed']}']")
            assert failed.locator("td.error").inner_text().startswith("<script>")  # text, not run
            running = page.locator(f"#jobs-body tr[data-job='{ids['running']}']")
            assert "seq_len=1024" in running.inner_text() and "8.75 µs" in running.inner_text()
            assert re.search(r"\d+ s", running.locator("td").nth(7).inner_text())
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)

            # Cancel: refused without the token and with a wrong one, done with the right one.
            queued = page.locator(f"#jobs-body tr[data-job='{ids['queued']}']")
            status = page.locator("#cancel-status")
            for typed, code, said in (("", 401, "refused"), (TOKEN + "x", 401, "refused"),
                                      (TOKEN, 200, "cancelled")):
                page.fill("#api-token", typed)
                with page.expect_response(lambda r: r.url.endswith("/cancel")) as answer:
                    queued.locator("button.cancel").click()
                assert answer.value.status == code, typed
                page.locator("#cancel-status", has_text=said).wait_for(timeout=10_000)
                if code != 200:
                    assert sqlite_store.get_job(ids["queued"]).status == "queued"
            assert "cancelled" in status.inner_text()
            assert sqlite_store.get_job(ids["queued"]).status == "cancelled"
            page.wait_for_selector(f"#jobs-body tr.status-cancelled[data-job='{ids['queued']}']",
                                   timeout=10_000)
            assert page.locator(f"#jobs-body tr[data-job='{ids['queued']}'] button").count() == 0
            # A new job appears without reloading the page.
            sqlite_store.create_job(KA, [{"total_patches": 4}], 1, "random")
            deadline = time.monotonic() + 15
            while rows.count() != 4:
                assert time.monotonic() < deadline, "the jobs table never refreshed"
                page.wait_for_timeout(200)
            page.screenshot(path=str(ARTIFACTS / "dashboard-jobs-cancelled.png"), full_page=True)

            # The failed job's link leads to its failed trials, and from there to the case page.
            page.locator(f"#jobs-body tr[data-job='{ids['failed']}'] a.failed-trials").click()
            page.wait_for_selector("#failed table.trials")
            assert page.locator("#failed tr.failed").count() == 2
            page.screenshot(path=str(ARTIFACTS / "dashboard-job-failed.png"), full_page=True)
            page.locator("#failed tr.failed a").first.click()
            page.wait_for_selector("#trials table.trials")
            assert page.locator("#trials tr.failed").count() == 2
            assert page.locator("#history svg circle").count() >= 2
            page.goto(f"{server.url}{CASE_128}")
            assert page.locator("#trials tbody tr").count() == 4
            assert page.locator("a.optuna-link").count() == 1
            page.screenshot(path=str(ARTIFACTS / "dashboard-case.png"), full_page=True)
            page.goto(f"{server.url}/case?" + urlencode({"kernel": KA, "device": H200,
                                                         "total_patches": 256}))
            assert page.locator("#version-drift").is_visible()
            page.screenshot(path=str(ARTIFACTS / "dashboard-case-drift.png"), full_page=True)
            assert not errors, errors
            assert not outside, outside
        finally:
            browser.close()


@pytest.mark.browser
def test_no_cancel_button_without_a_service_token(sqlite_store: Store) -> None:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    ids = _fill(sqlite_store)
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    with LiveServer(app) as server, sync_api.sync_playwright() as pw:
        browser = _browser(pw, server)
        try:
            page, errors, _ = _guarded_page(browser, server)
            page.goto(f"{server.url}/")
            page.wait_for_selector("body[data-jobs-polled]", timeout=15_000)
            assert page.locator("#cancel-off").is_visible()
            assert page.locator("button.cancel").count() == 0
            assert sqlite_store.get_job(ids["queued"]).status == "queued"
            assert not errors, errors
        finally:
            browser.close()


def test_best_so_far_is_drawn_as_steps() -> None:
    c = make_chart([Series("best", [(0, 30.0), (1, 30.0), (2, 22.0)], step=True, dots=False)],
                   title="t", y_label="y", log_y=False)
    (line,) = c.paths[0]["lines"]
    pts = [tuple(map(float, p.split(","))) for p in line.split()]
    # Each change of value is a vertical drop at its trial, never a diagonal.
    assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(pts, pts[1:])), pts


def test_records_chart_legend_skips_missing_references(sqlite_store: Store) -> None:
    """Records shipped without speedups draw no reference lines, so the legend names none."""
    for n, lat in ((64, 9.0), (128, 20.0)):
        sqlite_store.upsert_best(record(KB, {"seq_len": n}, lat, speedup_eager=None,
                                        speedup_compile=None, roofline_pct=None))
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/").text
    legend = re.findall(r'class="legend" data-series="([^"]+)"', html)
    assert legend == ["tuned"]
    sqlite_store.upsert_best(record(KB, {"seq_len": 64}, 8.0, speedup_eager=None, speedup_compile=None,
                                    eager_latency_us=80.0, roofline_pct=None))
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/").text
    assert re.findall(r'class="legend" data-series="([^"]+)"', html) == ["tuned", "eager reference"]
    assert "10.00×" in html  # the speedup computed from the reference


@pytest.mark.browser
def test_shipped_records_in_headless_chromium(sqlite_store: Store) -> None:
    """The records the service ships, as a new user first sees them: every legend entry names a
    drawn line, ticks in SI, each case page reachable."""
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    import json

    shipped = Path(__file__).resolve().parents[2] / "service" / "data" / "h200_records.json"
    sqlite_store.import_records(json.loads(shipped.read_text()))
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    ARTIFACTS.mkdir(exist_ok=True)
    with LiveServer(app) as server, sync_api.sync_playwright() as pw:
        browser = _browser(pw, server)
        try:
            page, errors, outside = _guarded_page(browser, server)
            page.goto(f"{server.url}/")
            for chart in page.locator("figure.chart svg").all():
                legend = chart.locator("g.legend").evaluate_all("gs => gs.map(g => g.dataset.series)")
                drawn = chart.locator("g.series").evaluate_all(
                    "gs => gs.filter(g => g.querySelector('polyline, circle')).map(g => g.dataset.series)")
                assert legend == drawn and "tuned" in legend, (legend, drawn)
                ticks = chart.locator("text").evaluate_all("ts => ts.map(t => t.textContent)")
                assert not [t for t in ticks if re.search(r"\de[+-]\d", t)], ticks
            page.screenshot(path=str(ARTIFACTS / "dashboard-shipped.png"), full_page=True)
            page.locator("table.records a").first.click()
            page.wait_for_selector("#trials")
            page.screenshot(path=str(ARTIFACTS / "dashboard-shipped-case.png"), full_page=True)
            assert not errors, errors
            assert not outside, outside
        finally:
            browser.close()
