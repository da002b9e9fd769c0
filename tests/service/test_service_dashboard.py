"""The dashboard: records, charts, case and job pages, live jobs with cancel; markup in data stays
text; a real browser, with screenshots under test-artifacts/."""
from __future__ import annotations

from trusted_records import trust_check, trusted

import json
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient
from svc_helpers import H200, KA, KB, LiveServer, record, settings_for

from kernelsearch import kernels
from kernelsearch.db.interfaces import Lease
from kernelsearch.db.store import Store
from kernelsearch.db.views import WORKER_VERSIONS
from kernelsearch.kernels.device import versions
from kernelsearch.service.api import create_app
from kernelsearch.service.charts import Series, make_chart, microseconds, si

XSS = '<script>document.title="pwned"</script><img src=x onerror="document.body.dataset.pwned=1">'
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = os.environ.get("KS_CHROMIUM", "/usr/bin/chromium")
TOKEN = "dash-token-0123"
CASE_128 = "/case?" + urlencode({"kernel": KB, "device": H200, "seq_len": 128})


def _fill(store: Store) -> dict[str, int]:
    # The H200's workers report this code's versions (as a worker registers its device).
    store.ensure_device({"name": H200, WORKER_VERSIONS: versions()})
    for n, lat in ((64, 9.0), (128, 20.0), (1024, 80.0), (4096, 300.0)):
        store.upsert_best(trusted(record(KB, {"seq_len": n}, lat, study_name=f"study-b-{n}")))
    # Tuned under other versions than this server's.
    store.upsert_best(trusted(record(KA, {"total_patches": 256}, 4.0, torch_version="2.9.0+old",
                             source_hash="0ldhash")))
    # Markup in every free-text field a record or a job can carry.
    store.upsert_best(trusted(record(KB, {"seq_len": 8}, 3.0, device=XSS, config={"ROWS": XSS})))
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


def _optuna_study(url: str, name: str) -> None:
    """A study of that name in Optuna's storage of the store's database, as a worker makes."""
    import optuna

    optuna.create_study(study_name=name, storage=optuna.storages.RDBStorage(url), direction="minimize")


def test_case_page_lists_every_trial(sqlite_store: Store) -> None:
    ids = _fill(sqlite_store)
    _optuna_study(sqlite_store.url, "study-b-128")
    settings = settings_for(sqlite_store.url, optuna_dashboard_url="http://127.0.0.1:8099/")
    with TestClient(create_app(settings, store=sqlite_store)) as c:
        r = c.get(CASE_128)
        assert r.status_code == 200, r.text
        html = r.text
        assert "4 trials, 2 failed" in html
        assert html.count('<tr class="failed"') == 2 and html.count('<tr class="ok') == 2
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
        assert 'id="version-drift"' in ka and "torch 2.9.0+old (the device&#39;s workers: " in ka


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
    _optuna_study(sqlite_store.url, "study-b-128")
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
        sqlite_store.upsert_best(trusted(record(KB, {"seq_len": n}, lat, speedup_eager=None,
                                        speedup_compile=None, roofline_pct=None)))
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/").text
    legend = re.findall(r'class="legend" data-series="([^"]+)"', html)
    assert legend == ["tuned"]
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 64}, 8.0, speedup_eager=None, speedup_compile=None,
                                    eager_latency_us=80.0, roofline_pct=None)))
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
    sqlite_store.import_records(json.loads(shipped.read_text()), check=trust_check)
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


# ----------------------------------------------------------------------------- kernel and jobs pages

def _esc(url: str) -> str:
    return url.replace("&", "&amp;").replace(" ", "+")


def test_kernel_page(sqlite_store: Store) -> None:
    """A kernel's axes, parameters, devices, cases with their best record per device (or none),
    a chart per device and the tune action: a form with the token, and the shell commands."""
    _fill(sqlite_store)
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 128}, 25.0, device="NVIDIA A100")))
    with TestClient(create_app(settings_for(sqlite_store.url, api_token=TOKEN), store=sqlite_store)) as c:
        r = c.get(f"/kernels/{KB}")
        assert r.status_code == 200 and "script-src 'self'" in r.headers["content-security-policy"]
        html = r.text
        assert "<code>seq_len</code>" in html and "<code>BLOCK_D</code>" in html  # axes, parameters
        devices = html[html.index('<table class="devices">'):]
        devices = devices[:devices.index("</table>")]
        assert "NVIDIA A100" in devices and H200 in devices
        assert "no worker has reported" in devices  # the A100: no worker here
        assert "torch " + versions()["torch"] in devices  # the H200's workers' report
        assert html.count("<svg") == 3  # one latency chart per device (the third: _fill's markup one)
        assert _esc(CASE_128) in html  # the best record links its case page
        cases = html[html.index('<section id="cases">'):html.index('<section id="charts">')]
        assert cases.count("<tr") == 1 + len(kernels.get_kernel(KB).cases) + 2  # head, suite, seq_len 8 and 64
        assert "no record" in cases  # suite cases without one
        assert cases.count('class="tune-link"') == cases.count("<tr") - 1
        tune = html[html.index('<section id="tune">'):]
        assert 'id="tune-form"' in tune and 'data-auth="on"' in tune and 'id="api-token"' in tune
        assert "curl -X POST http://testserver/v1/jobs" in tune and "Authorization: Bearer $KS_API_TOKEN" in tune
        assert f"kernelsearch tune {KB} --all --trials" in tune
        # A case given by its axes is preselected, and the commands tune that case only.
        one = c.get(f"/kernels/{KB}", params={"seq_len": 77}).text
        assert "<option value=\"{&#34;seq_len&#34;: 77}\" selected>" in one
        assert f"kernelsearch tune {KB} --case seq_len=77 --trials" in one
        assert "&#34;cases&#34;: [{&#34;seq_len&#34;: 77}]" in one
        assert c.get(f"/kernels/{KB}", params={"seq_len": "x"}).status_code == 422
        assert c.get("/kernels/nope").status_code == 404
        assert "no kernel" in c.get("/kernels/%3Cscript%3E").text
    # Without a service token the page queues nothing: the shell line, without a header.
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get(f"/kernels/{KB}").text
        assert 'id="tune-off"' in html and 'id="api-token"' not in html
        assert "Authorization" not in html[html.index('id="tune-curl"'):]


def test_index_links_kernel_pages_and_filters(sqlite_store: Store) -> None:
    ids = _fill(sqlite_store)
    for i in range(6):
        sqlite_store.create_job(KA, [{"total_patches": 4 + i}], 1, "random")
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/").text
        footer = html[html.index("<footer"):]
        assert f'href="/kernels/{KB}"' in footer and "/v1/kernels/" not in footer
        assert f'<a href="/kernels/{KB}">{KB}</a>' in html  # the group's heading
        # Jobs: a short summary and the newest few, the rest on /jobs.
        assert 'href="/jobs"' in html and 'href="/jobs?status=failed"' in html
        body = html[html.index('id="jobs-body"'):]
        assert body[:body.index("</tbody>")].count("<tr") == 5
        assert f'data-job="{ids["failed"]}"' not in body  # older than the five newest
        only_ka = c.get("/", params={"kernel": KA}).text
        assert f'data-kernel="{KA}"' in only_ka and f'data-kernel="{KB}"' not in only_ka
        assert c.get("/", params={"kernel": "nope"}).status_code == 404


def test_jobs_page_filters_and_pages(store: Store) -> None:
    ids = _fill(store)
    more = [store.create_job(KA, [{"total_patches": 4 + i}], 1, "random").id for i in range(52)]
    with TestClient(create_app(settings_for(store.url), store=store)) as c:
        def job_ids(html: str) -> list[int]:
            return [int(m) for m in re.findall(r'<tr data-job="(\d+)"', html)]

        first = c.get("/jobs").text
        assert "55 jobs" in first and "page 1 of 2" in first
        assert job_ids(first) == sorted(job_ids(first), reverse=True) and job_ids(first)[0] == more[-1]
        assert len(job_ids(first)) == 50 and 'href="/jobs?page=2"' in first
        second = c.get("/jobs", params={"page": 2}).text
        assert len(job_ids(second)) == 5 and ids["failed"] in job_ids(second) and 'rel="prev"' in second
        failed = c.get("/jobs", params={"status": "failed"}).text
        assert job_ids(failed) == [ids["failed"]]
        assert job_ids(c.get("/jobs", params={"kernel": KB}).text) == [ids["running"], ids["failed"]]
        assert job_ids(c.get("/jobs", params={"kernel": KB, "status": "running"}).text) == [ids["running"]]
        assert "No jobs match" in c.get("/jobs", params={"kernel": KA, "status": "failed"}).text
        assert f'href="/kernels/{KB}"' in failed  # a job's kernel links its page
        for params, status in (({"status": "bogus"}, 422), ({"page": "0"}, 422), ({"page": "x"}, 422),
                               ({"page": "3"}, 404), ({"kernel": "a\x01"}, 422)):
            r = c.get("/jobs", params=params)
            assert r.status_code == status, (params, r.status_code)


# ----------------------------------------------------------------------------- shipped records, drift

def _shipped() -> dict:
    return json.loads((Path(__file__).resolve().parents[2] / "service" / "data" / "h200_records.json").read_text())


def test_shipped_records_have_meaningful_study_names_and_no_dead_links(store: Store) -> None:
    doc = _shipped()
    for r in doc["records"]:
        number = kernels.get_kernel(r["kernel"]).suite_case_of(r["axes"]).number
        assert r["study_name"] == f"h200/{r['kernel']}/case{number}"
    store.import_records(doc, check=trust_check)
    first = doc["records"][0]
    url = "/case?" + urlencode({"kernel": first["kernel"], "device": first["device"], **first["axes"]})
    with TestClient(create_app(settings_for(store.url), store=store)) as c:
        html = c.get(url).text
        assert f"<code>{first['study_name']}</code>" in html and html.count(first["study_name"]) == 1
        assert "optuna-link" not in html and 'id="no-study-here"' in html  # not in this database
        _optuna_study(store.url, first["study_name"])
        html = c.get(url).text
        assert 'class="optuna-link"' in html and "no-study-here" not in html


def test_drift_is_against_the_devices_workers(store: Store) -> None:
    """Shipped H200 records are not marked while no H200 worker has reported; once one has,
    records tuned under other versions are."""
    store.import_records(_shipped(), check=trust_check)
    with TestClient(create_app(settings_for(store.url), store=store)) as c:
        assert 'class="drift"' not in c.get("/").text
        store.ensure_device({"name": H200, WORKER_VERSIONS: {"torch": "2.11.0+cu130", "triton": "3.6.0"}})
        assert 'class="drift"' not in c.get("/").text  # the same versions as the records'
        store.ensure_device({"name": H200, WORKER_VERSIONS: {"torch": "2.12.0+cu130", "triton": "3.6.0"}})
        # A record written afterwards (its device_info says nothing of versions) keeps the report.
        store.upsert_best(trusted(record(KB, {"seq_len": 5}, 3.0, torch_version="2.12.0+cu130",
                                        device_info={"name": H200, "compute_capability": "9.0"})))
        html = c.get("/").text
        assert html.count('class="drift"') == 32 and "⚠ torch 2.11.0+cu130" in html
        assert "tuned 2.11.0+cu130, the device&#39;s workers 2.12.0+cu130" in html


def test_tuner_reports_its_workers_versions() -> None:
    from kernelsearch.search_space.tuner import _with_versions

    class Runner:
        device_info = {"name": H200}
        versions = {"torch": "2.11.0", "triton": "3.6.0", "python": "3.11"}

    assert _with_versions(Runner()) == {"name": H200, WORKER_VERSIONS: {"torch": "2.11.0", "triton": "3.6.0"}}


# ----------------------------------------------------------------------------- case page, charts

def test_case_page_numbers_trials_once_marks_the_best_and_sorts(sqlite_store: Store) -> None:
    """Optuna's numbers have gaps (other cases' trials) and a case may have two studies: the
    table numbers its trials as the chart does, marks the fastest, shows each study once."""
    axes = {"seq_len": 300}
    for study, numbers, lats in (("s-a", (0, 3, 7), (40.0, None, 12.0)), ("s-b", (2, 5), (30.0, 11.0))):
        for n, lat in zip(numbers, lats):
            sqlite_store.add_trial_summary(study, KB, H200, axes, n, "complete" if lat else "fail",
                                           {"ROWS": n}, lat, None if lat else "compile_error", None)
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/case", params={"kernel": KB, "device": H200, **axes}).text
    shown = [int(n) for n in re.findall(r'<tr class="[^"]*" data-trial="(\d+)"', html)]
    assert shown == [0, 1, 2, 3, 4]
    history = html[html.index('id="history-chart"'):]
    assert sorted(int(n) for n in re.findall(r"<title>trial (\d+):", history)) == shown
    best = re.findall(r'<tr class="ok best" data-trial="(\d+)"', html)
    assert best == ["4"] and html.count("★ best") == 1  # s-b's trial 5, at 11 µs
    assert html.count("<code>s-a</code>") == 1 and html.count("<code>s-b</code>") == 1
    assert html.count('<td class="study">S') == 5  # a short tag per row, not the name
    assert 'class="trials sortable"' in html and 'data-sort="num"' in html
    assert 'data-value="11.0"' in html  # the latency sorts as a number


def test_chart_of_a_kernel_with_several_axes_labels_all_of_them(sqlite_store: Store) -> None:
    axpy = _axpy()
    for n, dtype, lat in ((4096, "float16", 5.0), (4096, "float32", 6.0), (65536, "float32", 9.0)):
        sqlite_store.upsert_best(trusted(record(axpy.name, {"n": n, "dtype": dtype}, lat)))
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/", params={"kernel": axpy.name}).text
    chart = html[html.index('id="latency-1"'):]
    ticks = re.findall(r'text-anchor="middle" font-size="11">([^<]+)</text>', chart[:chart.index("</svg>")])
    assert {"float16,4096", "float32,4096", "float32,65536"} <= set(ticks), ticks
    assert "case (dtype, n), by work" in chart


def _axpy():
    import sys

    plugins = str(Path(__file__).resolve().parents[1] / "plugins")
    if plugins not in sys.path:
        sys.path.insert(0, plugins)
    kernels.registry.load_module("ks_user_axpy")
    return kernels.get_kernel("ks_user_axpy")


# ----------------------------------------------------------------------------- no torch_reference

def test_no_speedups_without_a_torch_reference(sqlite_store: Store) -> None:
    """A kernel that declares no torch_reference has no PyTorch path to compare with: a record's
    speedups (timed on the float64 reference) are not shown."""
    axpy = _axpy()
    assert axpy.torch_reference is None
    sqlite_store.upsert_best(trusted(record(axpy.name, {"n": 4096, "dtype": "float32"}, 500.0,
                                    speedup_eager=0.001, speedup_compile=0.002, eager_latency_us=0.5)))
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 64}, 9.0, speedup_eager=3.0)))
    with TestClient(create_app(settings_for(sqlite_store.url), store=sqlite_store)) as c:
        html = c.get("/", params={"kernel": axpy.name}).text
        assert "0.00×" not in html and "no PyTorch reference" in html
        assert 'data-series="eager reference"' not in html
        case = c.get("/case", params={"kernel": axpy.name, "device": H200, "n": 4096, "dtype": "float32"}).text
        assert "0.00×" not in case and "declares no PyTorch reference" in case
        assert 'id="no-torch-reference"' in c.get(f"/kernels/{axpy.name}").text
        assert "3.00×" in c.get("/", params={"kernel": KB}).text  # a kernel with one keeps them


def test_bench_has_no_reference_columns_without_a_torch_reference() -> None:
    """`bench` of a decorated kernel declared without torch_reference: no eager or compile
    timing (it would be of the float64 reference), and the table says why."""
    import sys

    from kernelsearch.kernels.bench import bench_cases, format_table

    at = str(Path(__file__).resolve().parents[1] / "autotune")
    if at not in sys.path:
        sys.path.insert(0, at)
    import ks_at_helpers

    kdef = ks_at_helpers.KERNEL
    assert kdef.torch_reference is None
    rep = bench_cases(kdef, [{"n": 100}], config=kdef.default_config, n=1)
    row = rep["rows"][0]
    assert row["eager"] is None and row["speedup_eager"] is None and row["speedup_compile"] is None
    assert "declares no torch_reference" in format_table(rep)


def _fits(page) -> bool:
    """No part of the page is wider than the window (nothing to scroll sideways for)."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.browser
def test_kernel_jobs_and_case_pages_in_headless_chromium(sqlite_store: Store) -> None:
    """The kernel page (tune from it with the token), the jobs page (filter) and a case page
    (sort its trials) as a person uses them, with screenshots under test-artifacts/."""
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    ids = _fill(sqlite_store)
    sqlite_store.import_records(_shipped(), check=trust_check)
    app = create_app(settings_for(sqlite_store.url, api_token=TOKEN), store=sqlite_store)
    ARTIFACTS.mkdir(exist_ok=True)
    with LiveServer(app) as server, sync_api.sync_playwright() as pw:
        browser = _browser(pw, server)
        try:
            page, errors, outside = _guarded_page(browser, server)
            page.goto(f"{server.url}/")
            page.locator(f"footer a[href='/kernels/{KB}']").click()
            page.wait_for_selector("#tune-form")
            assert page.locator("#charts svg").count() >= 2
            assert _fits(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard-kernel.png"), full_page=True)
            # A suite case without a record: its tune link preselects it, the commands follow.
            row = page.locator("#cases tbody tr", has_text="no record").first
            row.locator("a.tune-link").click()
            page.wait_for_selector("#tune-case")
            chosen = page.locator("#tune-case").input_value()
            assert chosen != "all" and "--case seq_len=" in page.locator("#tune-cli").inner_text()
            page.fill("#tune-trials", "7")
            page.select_option("#tune-sampler", "random")
            assert "--trials 7 --sampler random" in page.locator("#tune-cli").inner_text()
            assert '"n_trials": 7' in page.locator("#tune-curl").inner_text()
            page.fill("#api-token", "")
            page.click("#tune-submit")
            page.locator("#tune-status", has_text="Enter the API token").wait_for(timeout=10_000)
            n_before = sqlite_store.count_jobs()
            page.fill("#api-token", TOKEN)
            with page.expect_response(lambda r: r.url.endswith("/v1/jobs") and r.request.method == "POST") as answer:
                page.click("#tune-submit")
            assert answer.value.status == 202
            page.locator("#tune-status a").wait_for(timeout=10_000)
            assert sqlite_store.count_jobs() == n_before + 1
            job = sqlite_store.list_jobs(limit=1)[0]
            assert job.n_trials == 7 and job.sampler == "random" and job.cases == [json.loads(chosen)]
            page.screenshot(path=str(ARTIFACTS / "dashboard-kernel-tuned.png"), full_page=True)

            # The jobs page: the new job on top; the filter keeps the failed one.
            page.locator("#tune-status a").click()
            page.goto(f"{server.url}/jobs")
            page.wait_for_selector("body[data-jobs-polled]", timeout=15_000)
            assert page.locator("#jobs-body tr").first.get_attribute("data-job") == str(job.id)
            page.select_option("select[name=status]", "failed")
            page.click("#jobs-filter button")
            page.wait_for_url("**/jobs?status=failed*")
            page.wait_for_selector("body[data-jobs-polled]", timeout=15_000)
            assert [r.get_attribute("data-job") for r in page.locator("#jobs-body tr").all()] == [str(ids["failed"])]
            assert _fits(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard-jobs.png"), full_page=True)

            # A shipped case page: one numbering, the best marked, sorted by latency on a click.
            first = _shipped()["records"][0]
            page.goto(f"{server.url}/case?" + urlencode({"kernel": first["kernel"], "device": H200,
                                                         **first["axes"]}))
            assert page.locator("tr.best").count() == 1 and page.locator("a.optuna-link").count() == 0
            numbers = page.locator("#trials tbody tr").evaluate_all("rs => rs.map(r => +r.dataset.trial)")
            assert numbers == list(range(len(numbers))) and len(numbers) == first["n_trials"]
            page.locator("#trials th", has_text="latency").click()
            lat = page.locator("#trials tbody tr td:nth-child(4)").evaluate_all(
                "ts => ts.map(t => t.dataset.value).filter(v => v !== '').map(Number)")
            assert lat == sorted(lat) and len(lat) > 1
            assert page.locator("#trials tbody tr").first.get_attribute("class") == "ok best"
            page.locator("#trials th", has_text="latency").click()
            lat = page.locator("#trials tbody tr td:nth-child(4)").evaluate_all(
                "ts => ts.map(t => t.dataset.value).filter(v => v !== '').map(Number)")
            assert lat == sorted(lat, reverse=True)
            assert _fits(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard-case-sorted.png"), full_page=True)
            assert not errors, errors
            assert not outside, outside
        finally:
            browser.close()
