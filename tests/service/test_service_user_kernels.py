"""The kernel a user brings (`@kernelsearch.autotune` with no declaration) in every surface of the
service: one source identity, names of any length and script, every route and page answering
it (a 4xx saying why where it cannot serve), jobs from its stored capture."""
from __future__ import annotations

from trusted_records import trusted

import copy
import json
from dataclasses import asdict
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from svc_helpers import settings_for
from user_kernels import (CONFIGS, DEVICE, LONG, SHORT, SOURCE, axes, capture, definition, forget,
                          und_record)

from kernelsearch.db.store import Store
from kernelsearch.db.views import WORKER_VERSIONS
from kernelsearch.kernels import registry
from kernelsearch.kernels.configs import canonical, canonical_key
from kernelsearch.kernels.device import versions
from kernelsearch.kernels.undeclared import Definition
from kernelsearch.service.api import create_app


@pytest.fixture
def user_client(store: Store) -> Iterator[TestClient]:
    """A service on a store of each kind with two undeclared kernels registered as their
    decorators register them: one of a short non-ASCII name, one of a long one."""
    app = create_app(settings_for(store.url, job_modules=["módulo"]), store=store)
    try:
        with TestClient(app) as c:
            for name in (SHORT, LONG):
                got = c.post("/v1/kernels", json=definition(name))
                assert got.status_code == 201, got.text
            yield c
    finally:
        forget(SHORT, LONG)


def _best(c: TestClient, name: str, n: int) -> dict:
    got = c.get("/v1/best", params={"kernel": name, "device": DEVICE, **axes(n)})
    assert got.status_code == 200, got.text
    return got.json()


@pytest.mark.parametrize("name", [SHORT, LONG], ids=["non-ascii", "long"])
def test_a_record_of_this_code_is_the_same_version_everywhere(user_client: TestClient, store: Store,
                                                              name: str) -> None:
    """The record the decorator (or a worker, from the same definition) stores carries the
    definition's source identity: /v1/best says same_versions and the dashboard shows no drift;
    a record of other code says so in both."""
    store.ensure_device({"name": DEVICE, WORKER_VERSIONS: versions()})
    store.upsert_best(trusted(und_record(name, 1024, 10.0)))
    store.upsert_best(trusted(und_record(name, 4096, 30.0, source_hash="0the4c0de0000000")))
    same, other = _best(user_client, name, 1024), _best(user_client, name, 4096)
    assert same["match"] == "exact" and same["same_versions"] is True
    assert same["current_versions"]["source_hash"] == SOURCE == same["versions"]["source_hash"]
    assert other["match"] == "exact" and other["same_versions"] is False
    page = user_client.get("/", params={"kernel": name})
    assert page.status_code == 200, page.text
    assert "1 of 2 records were tuned under other" in page.text
    assert "kernel source 0the4c0de0000000" in page.text
    assert "size (key product)" in page.text and "work (bytes)" not in page.text
    assert f"kernel source {SOURCE}" not in page.text


def _cli(*args: str):
    from typer.testing import CliRunner

    from kernelsearch.service.cli import app

    return CliRunner().invoke(app, list(args))


def test_export_then_import_is_a_backup_of_undeclared_kernels(user_client: TestClient, store: Store,
                                                              make_db_url, tmp_path) -> None:
    """An export carries the definitions its records need; an import restores every record into
    a fresh store (a process that never saw the kernels) and into the same one, idempotently;
    a record that cannot be imported is named while the others go in."""
    from svc_helpers import KB, record

    from kernelsearch.db.engine import upgrade

    for i, name in enumerate((SHORT, LONG)):
        store.upsert_best(trusted(und_record(name, 1024, 10.0 + i)))
        store.upsert_best(trusted(und_record(name, 1024, 8.0 + i, minutes=5)))  # supersedes: history
    store.upsert_best(trusted(record(KB, {"seq_len": 128}, 20.0)))
    backup = tmp_path / "backup.json"
    got = _cli("records", "export", "--url", store.url, "--history", str(backup))
    assert got.exit_code == 0, got.output
    doc = json.loads(backup.read_text())
    assert set(doc["kernels"]) == {SHORT, LONG} and doc["kernels"][LONG]["name"] == LONG
    forget(SHORT, LONG)  # a fresh process: only the file knows the kernels
    fresh = make_db_url("postgres" if store.url.startswith("postgresql") else "sqlite")
    upgrade(fresh)
    got = _cli("records", "import", "--url", fresh, str(backup))
    assert got.exit_code == 0, got.output
    assert "added: 5" in got.stdout and "rejected: 0" in got.stdout
    with Store(fresh) as restored:
        assert set(restored.kernel_definitions()) == {SHORT, LONG}
        mine = {(r.kernel, r.latency_median_us, r.is_current)
                for r in store.list_records(include_history=True)}
        theirs = {(r.kernel, r.latency_median_us, r.is_current)
                  for r in restored.list_records(include_history=True)}
        assert theirs == mine and len(theirs) == 5
    for url in (fresh, store.url):  # again, and into the store it came from: nothing changes
        got = _cli("records", "import", "--url", url, str(backup))
        assert got.exit_code == 0 and "added: 0" in got.stdout and "unchanged: 5" in got.stdout, got.output
    # One entry the gate refuses (a config not in the kernel's list): named, the rest go in.
    bad = copy.deepcopy(doc)
    bad["records"][1]["config"] = {"BLOCK": 96, "num_warps": 4}
    bad["records"][1]["tuned_at"] = "2026-12-01T00:00:00+00:00"
    other = make_db_url("sqlite")
    upgrade(other)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    got = _cli("records", "import", "--url", other, str(tmp_path / "bad.json"))
    assert got.exit_code == 1 and "added: 4" in got.stdout and "rejected: 1" in got.stdout
    assert f"not imported (kernel {bad['records'][1]['kernel']!r}): records[1].config" in got.stderr
    none = make_db_url("sqlite")
    upgrade(none)
    got = _cli("records", "import", "--url", none, "--all-or-nothing", str(tmp_path / "bad.json"))
    assert got.exit_code == 1 and "records[1].config" in got.stderr
    with Store(none) as nothing:
        assert nothing.list_records(include_history=True) == []


@pytest.mark.parametrize("name", [SHORT, LONG], ids=["non-ascii", "long"])
def test_every_route_knows_an_undeclared_kernel(user_client: TestClient, store: Store, name: str) -> None:
    """Each route and page that takes a kernel answers an undeclared one by its full name,
    URL-encoded in a path or a query; none answers 5xx."""
    store.upsert_best(trusted(und_record(name, 1024, 10.0)))
    seg = quote(name, safe="")
    assert name in [k["name"] for k in user_client.get("/v1/kernels").json()]
    got = user_client.get(f"/v1/kernels/{seg}")
    assert got.status_code == 200 and got.json()["name"] == name, got.text
    assert [a["name"] for a in got.json()["axes"]] == ["n", "x_ptr.dtype", "y_ptr.dtype"]
    assert user_client.get(f"/v1/kernels/{seg}/cases").json() == []
    got = user_client.get("/v1/records", params={"kernel": name})
    assert got.status_code == 200 and [r["kernel"] for r in got.json()] == [name], got.text
    case = {"kernel": name, "device": DEVICE, **axes(1024)}
    for path, params in (("/", {"kernel": name}), (f"/kernels/{seg}", {}), ("/case", case),
                         (f"/kernels/{seg}", axes(1024)), ("/jobs", {"kernel": name})):
        got = user_client.get(path, params=params)
        assert got.status_code == 200 and name in got.text, (path, got.status_code, got.text[:300])
    assert f'href="/kernels/{seg}"' in user_client.get("/", params={"kernel": name}).text
    assert user_client.get("/helion", params={"kernel": name}).status_code < 500
    # Past the bound: a 4xx naming it, never a 5xx.
    too_long = name + "x" * 1000
    got = user_client.post("/v1/kernels", json=definition(too_long))
    assert got.status_code == 422 and "name" in got.text, got.text
    assert user_client.get(f"/v1/kernels/{quote(too_long, safe='')}").status_code == 404
    assert user_client.get("/v1/best", params={**case, "kernel": too_long}).status_code == 404


def test_the_kernel_page_of_an_undeclared_kernel(user_client: TestClient, store: Store) -> None:
    """Its keys, configs and every config's time per key; no suite, bytes or float64 reference."""
    store.upsert_best(trusted(und_record(SHORT, 1024, 10.0)))
    html = user_client.get(f"/kernels/{quote(SHORT, safe='')}").text
    assert 'id="undeclared"' in html and "módulo.ядро" in html and SOURCE in html
    assert html.count("<li><code>{&#34;BLOCK&#34;:") == len(CONFIGS)
    assert 'id="config-timings"' in html and ">15 µs<" in html and "10 µs ★" in html
    for absent in ("float64 reference", "work (bytes)", "suite cases", "no PyTorch reference"):
        assert absent not in html, absent
    # No call is stored: no case is offered to a job, and the page says why.
    assert "No call of it is stored yet" in html and 'value="all"' not in html


def test_the_kernel_page_shows_a_failed_config_as_failed_with_its_reason(user_client: TestClient,
                                                                         store: Store) -> None:
    """A record times a config that failed (wrong_result) as null: a measurement, shown as
    failed with the reason its trial kept, not as a config left unmeasured."""
    first, second = canonical_key(CONFIGS[0]), canonical_key(CONFIGS[1])
    store.upsert_best(trusted(und_record(SHORT, 1024, 10.0, n_failed=1,
                                         config_timings={first: None, second: 10.0})))
    store.add_trial_summary("ks/study", SHORT, DEVICE, axes(1024), 0, "FAIL", dict(CONFIGS[0]),
                            None, "wrong_result", "argument 1: relative error 0.9 > 0.0001\nmore")
    html = user_client.get(f"/kernels/{quote(SHORT, safe='')}").text
    assert "failed: wrong_result: argument 1: relative error 0.9 &gt; 0.0001" in html
    assert html.count('class="config-failed"') == 1 and "10 µs ★" in html


def test_jobs_of_an_undeclared_kernel_are_4xx_when_they_cannot_be_served(user_client: TestClient,
                                                                        store: Store) -> None:
    """A job tunes one key on a call stored for it: "all", a key with no stored call, several
    keys are a 422 saying why; a job without a capture tunes on the stored one."""
    def submit(**body):
        return user_client.post("/v1/jobs", json={"kernel": SHORT, "n_trials": 2, **body})

    got = submit(cases="all")
    assert got.status_code == 422 and "no suite" in got.text and "no call of it is stored" in got.text
    got = submit(cases=[axes(1024)])
    assert got.status_code == 422 and "no call of it for this case is stored" in got.text
    first = submit(cases=[axes(1024)], capture=capture(1024))
    assert first.status_code == 202, first.text
    user_client.post(f"/v1/jobs/{first.json()['id']}/cancel")
    again = submit(cases=[axes(1024)], n_trials=3)
    assert again.status_code == 202 and again.json()["existing"] is False, again.text
    assert store.get_job(again.json()["id"]).capture == capture(1024)
    got = submit(cases=[axes(4096)])
    assert got.status_code == 422 and "n=1024, x_ptr.dtype=float32" in got.text, got.text
    got = submit(cases=[axes(1024), axes(4096)])
    assert got.status_code == 422 and "one case" in got.text
    html = user_client.get(f"/kernels/{quote(SHORT, safe='')}").text
    assert "(no call stored to tune on)" not in html and "No call of it is stored yet" not in html
    assert f"kernelsearch tune {SHORT} --case n=1024" in html
    assert user_client.get(f"/jobs/{again.json()['id']}").status_code == 200


def test_the_cli_knows_an_undeclared_kernel(user_client: TestClient, store: Store) -> None:
    """`kernels NAME`, `records list --kernel NAME` and `tune NAME` read the definitions the
    database keeps (a fresh process never saw the kernel): tune says why it cannot run rather
    than failing."""
    store.upsert_best(trusted(und_record(LONG, 1024, 10.0)))
    forget(SHORT, LONG)  # a fresh process
    url = ("--url", store.url)
    got = _cli("kernels", *url)
    assert got.exit_code == 0 and SHORT in got.stdout and LONG in got.stdout, got.output
    got = _cli("kernels", LONG, *url)
    assert got.exit_code == 0, got.output
    assert f"source: {SOURCE}" in got.stdout and "key: n\tan integer" in got.stdout
    assert got.stdout.count("config: ") == len(CONFIGS) and "problem:" not in got.stdout
    assert json.loads(_cli("kernels", SHORT, "--json", *url).stdout)["undeclared"]["name"] == SHORT
    got = _cli("records", "list", "--kernel", LONG, *url)
    assert got.exit_code == 0 and got.stdout.count(LONG) == 1, got.output
    got = _cli("bench", LONG)
    assert got.exit_code == 2 and "is an undeclared kernel" in got.output, got.output
    got = _cli("records", "delete", "--url", store.url, "--kernel", LONG, "--device", DEVICE,
               "--case", "n=1024,x_ptr.dtype=float32,y_ptr.dtype=float32")
    assert got.exit_code == 0 and "now current: none" in got.stdout, got.output
    got = _cli("tune", SHORT, "--url", store.url)
    assert got.exit_code == 2 and "no call of it is stored to tune on" in got.stderr, got.output
    store.queue_job(SHORT, [axes(1024)], 2, "grid", capture=capture(1024))
    got = _cli("tune", SHORT, "--url", store.url, "--case", "n=4096,x_ptr.dtype=float32,y_ptr.dtype=float32")
    assert got.exit_code == 2 and "cases with one: n=1024" in got.stderr, got.output
    got = _cli("tune", SHORT, "--url", store.url, "--trials", "2")
    assert got.exit_code == 2 and "kernel module 'módulo' is not usable" in got.stderr, got.output


def test_a_kernel_another_process_registered_is_known(client: TestClient, store: Store) -> None:
    """A definition stored after this service started (by another service process, or an
    import) is read on the first request that names the kernel."""
    forget(SHORT)
    try:
        store.save_definition(SHORT, definition(SHORT))
        store.upsert_best(trusted(und_record(SHORT, 1024, 10.0)))
        assert _best(client, SHORT, 1024)["same_versions"] is True
        assert client.get(f"/v1/kernels/{quote(SHORT, safe='')}").status_code == 200
        from kernelsearch.service import definitions

        for path, params in ((f"/kernels/{quote(SHORT, safe='')}", {}),
                             ("/v1/records", {"kernel": SHORT})):
            forget(SHORT)  # again unknown here: read again, once the throttle allows
            definitions._reloaded.clear()
            assert client.get(path, params=params).status_code == 200, path
    finally:
        forget(SHORT)


def test_a_long_kernel_names_a_study_its_columns_hold() -> None:
    """A study's name holds the kernel's: past the columns' width it keeps a readable prefix
    and a hash of the whole, stable and distinct for kernels that differ only at the end."""
    from kernelsearch.search_space.tuner import STUDY_NAME_CHARS, study_name

    a, b = (study_name(LONG + tail, axes(1024), DEVICE) for tail in ("_a", "_b"))
    assert len(a) == len(b) == STUDY_NAME_CHARS and a != b
    assert a.startswith(f"ks/{LONG[:100]}") and a == study_name(LONG + "_a", axes(1024), DEVICE)
    assert study_name(SHORT, axes(8), DEVICE).startswith(f"ks/{SHORT}/n=8,")


def test_a_key_of_floats_strings_dtypes_and_a_pruners_config_is_stored_and_served(
        user_client: TestClient, store: Store) -> None:
    """A kernel keyed on a float, a string, a Triton dtype and None, tuned on a config its pruner
    made (a constexpr the list lacks), as the decorator uploads it: stored through the REST
    API, served exactly from query text, and never served "nearest" across another float."""
    name = "corpus_like.scaled_act"
    made = canonical({"BLOCK": 64, "EVEN": True, "num_warps": 4})
    defn = Definition.from_json({**definition(name), "arg_names": [
        "x_ptr", "y_ptr", "n", "scale", "ACT", "OUT", "opt", "BLOCK", "EVEN"],
        "key": ["n", "scale", "ACT", "OUT", "opt"]}).with_pruned([made, CONFIGS[0]])
    assert [canonical_key(c) for c in defn.pruned] == [canonical_key(made)]
    key = {"n": 96, "scale": "float:0.5", "ACT": "str:relu", "OUT": "tl:fp16", "opt": "none",
           "x_ptr.dtype": "float32", "y_ptr.dtype": "float32"}
    try:
        assert user_client.post("/v1/kernels", json=defn.as_json()).status_code == 201
        rec = und_record(name, 96, 10.0, axes=key, config=made, config_timings={
            canonical_key(made): 10.0, canonical_key(CONFIGS[0]): 15.0})
        doc = json.loads(json.dumps({**asdict(rec), "tuned_at": rec.tuned_at.isoformat()}))
        got = user_client.post("/v1/records", json=doc)
        assert got.status_code == 201, got.text
        # A listed config (no EVEN) is still one of the kernel's, EVEN completed at its default.
        assert registry.get_kernel(name).validate_config(CONFIGS[1])["EVEN"] is True
        q = {"kernel": name, "device": DEVICE, **key}
        best = user_client.get("/v1/best", params=q)
        assert best.status_code == 200, best.text
        assert best.json()["match"] == "exact" and best.json()["config"]["EVEN"] is True
        other = user_client.get("/v1/best", params={**q, "scale": "float:2.0"})
        assert other.status_code == 404, other.text
        bad = user_client.get("/v1/best", params={**q, "scale": "0.5"})
        assert bad.status_code == 422 and "scale" in bad.text
    finally:
        forget(name)
