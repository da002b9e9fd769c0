"""Compiled kernels served with their configs (issue 34), on CPU with synthetic Triton compile
groups (the interpreter compiles no cubin): the store keeps them content-addressed beside their
record and withdraws them with it; the routes refuse shared libraries, pickles and other ELF
files, bound the size and need the writer token; a host installs a set into its Triton cache
only under its own compile fingerprint and with every hash right, else compiles."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import func, select
from svc_helpers import H200, KA, KB, record, settings_for
from trusted_records import trusted

from kernelsearch import artifacts
from kernelsearch.db.models import ArtifactBlob
from kernelsearch.db.store import Store
from kernelsearch.kernels import compiled
from kernelsearch.service.api import create_app

AUTH = {"Authorization": "Bearer t"}
ENV = {"driver": "570.1 cuda12080", "ptxas": "12.8 V12.8.93", "target": "cuda:90:32",
       "triton": "3.6.0+abc"}
FP = compiled.env_fingerprint(ENV)
KEY = hashlib.sha256(b"triton cache key").hexdigest()


def elf(machine: int = 190, e_type: int = 2, segments: tuple[int, ...] = (1,),
        body: bytes = b"cubin-body" * 10) -> bytes:
    """An ELF64 file as ptxas writes a cubin (EM_CUDA, an executable, PT_LOAD segments), or
    another ELF by its machine, type and segments (a shared library: ET_DYN, PT_DYNAMIC)."""
    head = bytearray(64)
    head[:7] = b"\x7fELF\x02\x01\x01"
    head[16:18] = e_type.to_bytes(2, "little")
    head[18:20] = machine.to_bytes(2, "little")
    head[32:40] = (64).to_bytes(8, "little")
    head[54:56] = (56).to_bytes(2, "little")
    head[56:58] = len(segments).to_bytes(2, "little")
    phdrs = b"".join(t.to_bytes(4, "little") + b"\0" * 52 for t in segments)
    return bytes(head) + phdrs + body


# The stand-in of a real compile group (the interpreter compiles no cubin): the files Triton
# 3.6 writes for the @triton.jit function `fn` (KA's is _rope_gen_bwd_kernel), named after it.
FN_A, FN_B = "_rope_gen_bwd_kernel", "_rope3d_bwd_kernel"
CUBIN = elf()


def group_files(fn: str = FN_A, key: str = KEY, **meta: Any) -> dict[str, bytes]:
    return {f"{fn}.json": json.dumps({"name": fn, "hash": key, **meta}).encode(),
            f"{fn}.cubin": CUBIN, f"{fn}.ptx": b"// ptx", f"{fn}.ttgir": b"#ttg"}


GROUP, CUBIN_NAME, PTX = f"{FN_A}.json", f"{FN_A}.cubin", f"{FN_A}.ptx"
FILES = group_files()


def b64(d: bytes) -> str:
    return base64.b64encode(d).decode()


def body(record_id: int, files: dict[str, bytes] | None = None, **kw: Any) -> dict[str, Any]:
    return {"record_id": record_id, "cache_key": KEY, "group": GROUP, "env": ENV,
            "files": {n: b64(d) for n, d in (FILES if files is None else files).items()}, **kw}


# The host's own environment, before the fixture below stands in a GPU host's.
REAL_HOST_ENVIRONMENT = compiled._host_environment


@pytest.fixture(autouse=True)
def _host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """This host: the fingerprint ENV and a fresh Triton cache of its own."""
    monkeypatch.setattr(compiled, "_host_environment", lambda: tuple(sorted(ENV.items())))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.delenv(compiled.ENV_OVERRIDE, raising=False)
    artifacts.reset()
    yield
    artifacts.reset()


@pytest.fixture
def writer(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(store.url, api_token=SecretStr("t")), store=store)) as c:
        yield c


def blobs(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ArtifactBlob)).scalar_one())


def test_upload_then_served_by_record_and_fingerprint_only(store: Store, writer: TestClient) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    r = writer.post("/v1/artifacts", json=body(rec.id), headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["env_fingerprint"] == FP
    got = writer.get("/v1/artifacts", params={"record_id": rec.id, "env_fingerprint": FP}).json()
    assert len(got) == 1 and got[0]["config"] == rec.config and got[0]["kernel"] == KA
    assert {n: base64.b64decode(f["data"]) for n, f in got[0]["files"].items()} == FILES
    assert all(f["sha256"] == hashlib.sha256(FILES[n]).hexdigest()
               for n, f in got[0]["files"].items())
    other = compiled.env_fingerprint({**ENV, "driver": "575.0"})
    assert writer.get("/v1/artifacts", params={"record_id": rec.id, "env_fingerprint": other}).json() == []
    by_key = writer.get("/v1/artifacts/by-cache-key", params={"cache_key": KEY,
                                                               "env_fingerprint": FP}).json()
    assert [s["record_id"] for s in by_key] == [rec.id]
    # Content-addressed: a second record's identical files add no blob.
    rec2, _ = store.upsert_best(trusted(record(KA, {"total_patches": 128}, 10.0)))
    assert writer.post("/v1/artifacts", json=body(rec2.id), headers=AUTH).status_code == 201
    assert blobs(store) == len(FILES)


@pytest.mark.parametrize("files, why", [
    ({**FILES, "launcher.so": b"\x7fELF"}, "shared librar"),
    ({**FILES, GROUP: b"\x80\x04\x95" + b"x" * 8}, "pickle"),
    ({**FILES, CUBIN_NAME: CUBIN[:18] + (62).to_bytes(2, "little") + CUBIN[20:]}, "not a CUDA cubin"),
    ({**FILES, "../k.ptx": b"x"}, "plain file name"),
    ({**FILES, "k.exe": b"x"}, "not a Triton compile file"),
    ({CUBIN_NAME: CUBIN}, "group"),
])
def test_refuses_code_and_malformed_sets(store: Store, writer: TestClient,
                                         files: dict[str, bytes], why: str) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    r = writer.post("/v1/artifacts", json=body(rec.id, files), headers=AUTH)
    assert r.status_code == 422 and why in r.text, r.text
    assert blobs(store) == 0


def test_writes_need_the_token_and_a_record_and_stay_bounded(store: Store, writer: TestClient) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    assert writer.post("/v1/artifacts", json=body(rec.id)).status_code == 401
    assert writer.post("/v1/artifacts", json=body(rec.id),
                       headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert writer.post("/v1/artifacts", json=body(rec.id + 99), headers=AUTH).status_code == 404
    store.put_artifacts(rec.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                        files=FILES, origin="worker")
    r = writer.post("/v1/artifacts", json=body(rec.id, {**FILES, PTX: b"// other"}), headers=AUTH)
    assert r.status_code == 409 and "worker" in r.text
    [kept] = store.artifacts_of_record(rec.id, FP)
    assert kept.origin == "worker" and kept.files == FILES
    r = writer.get("/v1/artifacts", params={"env_fingerprint": FP})
    assert r.status_code == 422
    with TestClient(create_app(settings_for(store.url, artifact_max_bytes=100),
                               store=store)) as small:
        assert small.post("/v1/artifacts", json=body(rec.id)).status_code == 413


def test_withdrawing_a_record_withdraws_its_artifacts(store: Store, writer: TestClient) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    keep, _ = store.upsert_best(trusted(record(KA, {"total_patches": 128}, 10.0)))
    writer.post("/v1/artifacts", json=body(rec.id), headers=AUTH)
    writer.post("/v1/artifacts", json=body(keep.id, {**FILES, PTX: b"// other"}), headers=AUTH)
    assert writer.delete(f"/v1/records/{rec.id}", headers=AUTH).status_code == 200
    assert writer.get("/v1/artifacts", params={"record_id": rec.id, "env_fingerprint": FP}).json() == []
    assert blobs(store) == len(FILES)  # the kept set's four; the withdrawn one's own ptx is gone
    assert len(writer.get("/v1/artifacts", params={"record_id": keep.id, "env_fingerprint": FP}).json()) == 1


def test_bulk_route_answers_the_devices_current_records(store: Store, writer: TestClient) -> None:
    a, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    b, _ = store.upsert_best(trusted(record(KB, {"seq_len": 16}, 10.0)))
    other, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0, device="NVIDIA A100")))
    for rid in (a.id, b.id, other.id):
        writer.post("/v1/artifacts", json=body(rid), headers=AUTH)
    newer, _ = store.upsert_best(trusted(record(KB, {"seq_len": 16}, 5.0)))  # supersedes b
    got = writer.get("/v1/artifacts/device", params={"device": H200, "env_fingerprint": FP}).json()
    assert sorted(s["record_id"] for s in got) == [a.id]
    assert newer.id != b.id
    got = writer.get("/v1/artifacts/device", params={"device": "NVIDIA A100", "env_fingerprint": FP,
                                                     "kernel": [KA]}).json()
    assert [s["record_id"] for s in got] == [other.id]


# -- the host side -----------------------------------------------------------------------------
def wire(files: dict[str, bytes] = FILES, **kw: Any) -> dict[str, Any]:
    return {"record_id": 1, "cache_key": KEY, "group": GROUP, "env_fingerprint": FP,
            "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "data": b64(d)}
                      for n, d in files.items()}, **kw}


def local_group() -> dict[str, bytes] | None:
    return compiled.read_group(KEY, GROUP)


def test_install_lands_where_triton_looks_and_checks_every_hash() -> None:
    from triton.runtime.cache import get_cache_manager

    bad = wire()
    bad["files"][CUBIN_NAME]["data"] = b64(CUBIN + b"tampered")
    assert artifacts.install([bad]) == 0 and local_group() is None
    assert artifacts.install([wire(env_fingerprint=compiled.env_fingerprint({"other": "1"}))]) == 0
    assert artifacts.install([wire({CUBIN_NAME: CUBIN})]) == 0  # no metadata file
    assert artifacts.install([{"cache_key": KEY}]) == 0  # malformed: ignored, never raised
    assert local_group() is None and artifacts.STATS.rejected == 4
    assert artifacts.install([wire()]) == 1
    # What triton.compiler.compile asks its cache manager for before it compiles anything.
    group = get_cache_manager(KEY).get_group(GROUP)
    assert group is not None and Path(group[CUBIN_NAME]).read_bytes() == CUBIN


def test_another_driver_or_build_is_another_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    mine = compiled.fingerprint()
    monkeypatch.setenv(compiled.ENV_OVERRIDE, json.dumps({"driver": "575.0"}))
    assert compiled.fingerprint() != mine
    assert artifacts.install([wire()]) == 0 and local_group() is None


def handle_of(tmp_path: Path, files: dict[str, bytes]) -> Any:
    """A compiled kernel as Triton hands it back (its cache key and its group's paths)."""
    paths = {}
    for n, d in files.items():
        (tmp_path / n).write_bytes(d)
        paths[n] = str(tmp_path / n)
    return type("Handle", (), {"hash": KEY, "metadata_group": paths})()


@pytest.fixture
def local_store(sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """The user's process on the local store (no service)."""
    from kernelsearch.backends import BACKENDS

    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.delenv("KS_SERVICE_URL", raising=False)
    BACKENDS.reset()
    yield sqlite_store
    BACKENDS.drain(10.0)
    BACKENDS.reset()


def test_a_host_that_shared_a_key_uploads_its_group_and_the_next_host_installs_it(
        local_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelsearch.kernels.resolve import Found, Match
    from kernelsearch.backends import BACKENDS

    rec_in = record(KA, {"total_patches": 64}, 10.0)
    artifacts.note_compiled(KA, rec_in.axes, rec_in.config, handle_of(tmp_path, FILES))
    view, _ = local_store.upsert_best(trusted(rec_in))
    artifacts.note_record(rec_in, view.id)  # the store's answer comes second: it uploads
    BACKENDS.drain(10.0)
    assert artifacts.STATS.uploaded == 1
    assert [s.record_id for s in local_store.artifacts_of_record(view.id, FP)] == [view.id]

    # A fresh host (its own empty cache) served that record installs the group before launching.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-host"))
    artifacts.reset()
    found = Found(config=view.config, match=Match.EXACT, source="store", record=view)
    artifacts.before_first_launch(KA, found)
    assert local_group() == FILES and artifacts.STATS.installed == 1


def test_under_the_interpreter_a_served_key_installs_nothing_and_says_nothing(
        local_store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """No GPU driver: nothing compiles here, so nothing is fetched or installed, and a served
    key's first launch warns of nothing (it warned "0 active drivers" on every served key)."""
    import torch

    from kernelsearch.kernels.resolve import Found, Match

    if torch.cuda.is_available():
        pytest.skip("a GPU's driver is active here: this host compiles")
    monkeypatch.setattr(compiled, "_host_environment", REAL_HOST_ENVIRONMENT)
    assert not compiled.compiles_here()
    view, _ = local_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    local_store.put_artifacts(view.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                              files=FILES, origin="worker")
    with caplog.at_level(logging.INFO):
        artifacts.before_first_launch(KA, Found(config=view.config, match=Match.EXACT,
                                                source="store", record=view))
        assert artifacts.prefetch(device=H200) == 0
        assert not artifacts.group_for_cache_key(KEY)
    assert artifacts.STATS.fetched_sets == 0 and artifacts.STATS.installed == 0
    assert local_group() is None and "failed" not in caplog.text


def test_the_cache_manager_serves_a_missed_compile_group(local_store: Store) -> None:
    from kernelsearch.triton_cache import AutotuneCacheManager
    from triton.runtime.cache import _base32

    view, _ = local_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    local_store.put_artifacts(view.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                              files=FILES, origin="worker")
    manager = AutotuneCacheManager(_base32(KEY))
    group = manager.get_group(GROUP)
    assert group is not None and Path(group[CUBIN_NAME]).read_bytes() == CUBIN
    unknown = AutotuneCacheManager(_base32(hashlib.sha256(b"other").hexdigest()))
    assert unknown.get_group(GROUP) is None


def test_prefetch_installs_the_devices_groups_in_one_go(local_store: Store) -> None:
    view, _ = local_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    local_store.put_artifacts(view.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                              files=FILES, origin="worker")
    assert artifacts.prefetch(device=H200) == 1 and local_group() == FILES


def test_a_worker_stores_the_group_its_trial_compiled(sqlite_store: Store, tmp_path: Path) -> None:
    from kernelsearch.search_space.compiled import store_compiled

    view, _ = sqlite_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    assert artifacts.install([wire()]) == 1  # the trial child's compile, in this host's cache
    ref = compiled.compiled_ref(handle_of(tmp_path, FILES))
    assert ref == {"cache_key": KEY, "group": GROUP, "env": ENV}
    assert store_compiled(sqlite_store, view.id, ref)
    [got] = sqlite_store.artifacts_of_record(view.id, FP)
    assert got.origin == "worker" and got.files == FILES
    assert not store_compiled(sqlite_store, view.id, {**ref, "group": "missing.json"})
    assert compiled.compiled_ref(handle_of(tmp_path, {**FILES, "x.so": b"\x7fELF"})) is None


def test_get_kernels_provider_installs_an_exact_records_group(local_store: Store) -> None:
    from kernelsearch.kernels.provider import lookup, set_resolver
    from kernelsearch.provider import install_default_provider

    from kernelsearch import kernels

    view, _ = local_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    local_store.put_artifacts(view.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                              files=FILES, origin="worker")
    install_default_provider()
    try:
        assert lookup(kernels.get_kernel(KA), {"total_patches": 64}, H200) == view.config
        assert local_group() == FILES
    finally:
        set_resolver(None)


def test_a_service_that_fails_is_left_alone_and_nothing_fails(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    """An unreachable service: the compile group is a miss (Triton compiles), no error, and the
    next miss does not ask again within KS_AUTOTUNE_RETRY_S."""
    from kernelsearch.backends import BACKENDS
    from kernelsearch.rest_client import Client

    asked: list[str] = []

    def down(self: Any, method: str, path: str, **kw: Any) -> Any:
        asked.append(path)
        raise OSError("connection refused")

    monkeypatch.setattr(Client, "_request", down)
    monkeypatch.setenv("KS_SERVICE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    BACKENDS.reset()
    try:
        assert artifacts.group_for_cache_key(KEY) is False
        assert artifacts.group_for_cache_key(hashlib.sha256(b"another").hexdigest()) is False
        assert asked == ["/v1/artifacts/by-cache-key"]
    finally:
        BACKENDS.reset()


def test_a_launcher_spec_is_argument_types_and_builds_triton_s_own_launcher(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The spec a set carries is data (argument types Triton knows); the launcher a host builds
    from it at install is the C source CudaLauncher generates for the same kernel, so Triton's
    first launch finds it in the cache; anything else in a spec is refused, never compiled."""
    from types import SimpleNamespace

    from triton.backends.nvidia import driver as nv

    sig = {"x": "*fp32", "n": "i32", "pair": ("*kfp16", "i64"), "BLOCK": "constexpr"}
    src = SimpleNamespace(signature=sig, constants={(3,): 64}, fn=SimpleNamespace(arg_names=list(sig)))
    handle = handle_of(tmp_path, FILES)
    handle.src = src
    spec = compiled.launcher_spec(handle)
    assert spec is not None and compiled.refusal("k.launcher", spec) is None
    for bad in (b'["i32; system(1)"]', b'{"x": "i32"}', b'["tensordesc<fp16[64]>"]', b"[[[[[\"i32\"]]]]]"):
        assert compiled.launcher_signature(bad) is None and compiled.refusal("k.launcher", bad)
    built: list[str] = []
    monkeypatch.setattr(nv, "compile_module_from_src",
                        lambda src, **kw: built.append(src) or SimpleNamespace(launch=None))
    monkeypatch.setattr(nv, "library_dirs", lambda: [])
    meta = SimpleNamespace(num_ctas=1, global_scratch_size=0, global_scratch_align=1,
                           profile_scratch_size=0, profile_scratch_align=1,
                           launch_cooperative_grid=False, launch_pdl=False)
    nv.CudaLauncher(src, meta)  # what Triton's first launch builds
    monkeypatch.setattr(compiled, "_cuda_driver", lambda: nv)
    group = compiled.group_of(handle)
    assert group is not None and group[2][f"{FN_A}.launcher"] == spec
    assert compiled.build_launchers([group[2], FILES]) == 1  # the spec-less group: Triton's launch
    assert len(built) == 2 and built[0] == built[1]
    assert artifacts.install([wire(group[2])]) == 1 and artifacts.STATS.launchers == 1


def test_a_launcher_that_fails_to_build_says_so_once_per_group(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A failed build is not silent: one WARNING naming the kernel and the error, however often
    the same group is installed; another group's failure is reported on its own."""
    from types import SimpleNamespace

    def fail(**kw: Any) -> None:
        raise RuntimeError("cc: not found")

    nv = SimpleNamespace(make_launcher=lambda *a: "/* launcher */", compile_module_from_src=fail,
                         library_dirs=lambda: [], include_dirs=[], libraries=[])
    monkeypatch.setattr(compiled, "_cuda_driver", lambda: nv)
    monkeypatch.setattr(compiled, "_LAUNCHER_FAILED", set())
    spec = b'["*fp32", "i32"]'
    a = {**FILES, f"{FN_A}.launcher": spec}
    b = {**group_files(FN_B), f"{FN_B}.launcher": spec}
    with caplog.at_level(logging.WARNING, logger=compiled.__name__):
        assert compiled.build_launchers([a]) == 0
        assert compiled.build_launchers([a, b]) == 0
    warned = [r.getMessage() for r in caplog.records if r.name == compiled.__name__]
    assert len(warned) == 2, warned
    assert FN_A in warned[0] and "RuntimeError: cc: not found" in warned[0]
    assert FN_B in warned[1]


def test_ks_prefetch_runs_in_the_background_and_a_first_launch_waits_for_it(
        local_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    view, _ = local_store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    local_store.put_artifacts(view.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                              files=FILES, origin="worker")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: H200)
    artifacts.prefetch_soon()
    assert artifacts._prefetch_future is None  # not asked for: nothing in the background
    monkeypatch.setenv(artifacts.PREFETCH_ENV, "1")
    artifacts.prefetch_soon()
    artifacts.before_first_launch(KA, view)
    assert local_group() == FILES and artifacts.STATS.installed == 1
    assert artifacts.STATS.fetched_sets == 1  # the record's own set was not asked for again


def _helion_entry(store: Store, rows: int = 64) -> str:
    """A Helion entry stored as the gate passes it; its Helion cache key."""
    from test_helion import entry
    from trusted_records import trusted_entry

    from kernelsearch.search_space.acceptance import accepted_helion

    key, data = entry(rows)
    store.put_helion_entry(trusted_entry(accepted_helion(key, data).value))
    return key


def test_a_helion_entrys_compiled_kernel_is_stored_served_and_withdrawn_with_it(
        store: Store, writer: TestClient) -> None:
    key = _helion_entry(store)
    route = f"/v1/helion/entries/{key}/artifacts"
    group = {k: v for k, v in body(1).items() if k != "record_id"}
    assert writer.post(route, json=group).status_code == 401
    r = writer.post(route, json={**group, "files": {**group["files"], "l.so": b64(b"\x7fELF")}},
                    headers=AUTH)
    assert r.status_code == 422 and "shared librar" in r.text
    other_key = hashlib.sha256(b"no such entry").hexdigest()
    assert writer.post(f"/v1/helion/entries/{other_key}/artifacts", json=group,
                       headers=AUTH).status_code == 404
    r = writer.post(route, json=group, headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["helion_key"] == key and r.json()["record_id"] is None
    [got] = writer.get(route, params={"env_fingerprint": FP}).json()
    assert {n: base64.b64decode(f["data"]) for n, f in got["files"].items()} == FILES
    assert got["kernel"].startswith("helion:") and got["device"] == "NVIDIA H200"
    other = compiled.env_fingerprint({**ENV, "triton": "3.7.0"})
    assert writer.get(route, params={"env_fingerprint": other}).json() == []
    # Not a record's: the record routes never answer it.
    assert writer.get("/v1/artifacts/by-cache-key",
                      params={"cache_key": KEY, "env_fingerprint": FP}).json() == []
    store.put_helion_artifacts(key, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                               files=FILES, origin="worker")
    r = writer.post(route, json=group, headers=AUTH)
    assert r.status_code == 409 and "worker" in r.text
    assert writer.delete(f"/v1/helion/entries/{key}").status_code == 401
    assert writer.delete(f"/v1/helion/entries/{key}", headers=AUTH).status_code == 200
    assert writer.get(route, params={"env_fingerprint": FP}).json() == []
    assert blobs(store) == 0
    assert writer.delete(f"/v1/helion/entries/{key}", headers=AUTH).status_code == 404
    # A real compile group is larger than the API's 64 KiB body bound (GPU call 43 was answered
    # 413): both upload routes take up to KS_ARTIFACT_MAX_BYTES.
    big_key = _helion_entry(store, rows=128)
    big = {**group, "files": {**group["files"], PTX: b64(b"// ptx " * 20000)}}
    r = writer.post(f"/v1/helion/entries/{big_key}/artifacts", json=big, headers=AUTH)
    assert r.status_code == 201, r.text


def test_an_artifact_set_has_exactly_one_owner(store: Store) -> None:
    from sqlalchemy.exc import IntegrityError

    from kernelsearch.db.models import ArtifactSet, utcnow

    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(ArtifactSet.__table__.insert().values(
            cache_key=KEY, env_fingerprint=FP, env=ENV, group=GROUP, origin="worker",
            created_at=utcnow()))


def test_helion_s_first_host_uploads_its_kernel_and_a_served_host_installs_it(
        local_store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_helion import entry

    from kernelsearch.backends import BACKENDS
    from kernelsearch.helion import KernelsearchBackend, _compiled_kernels

    key, data = entry(64)
    KernelsearchBackend().put(key, data)
    # Helion's bound kernel after it ran its stored config: its generated code's JITFunction
    # holds the compiled kernel Triton returned.
    jit = type("JIT", (), {"device_caches": {0: ({"spec": handle_of(tmp_path, FILES)}, None)}})()
    run = types.FunctionType((lambda: None).__code__, {"_helion_k": jit})
    bound = type("Bound", (), {"_run": run, "kernel": type("K", (), {"name": "k"})()})()
    artifacts.note_helion_put(key, lambda: _compiled_kernels(bound))
    deadline = time.monotonic() + 10
    while not local_store.artifacts_of_helion_entry(key, FP):
        assert time.monotonic() < deadline, "the group was not uploaded"
        BACKENDS.drain(0.2)
    [stored] = local_store.artifacts_of_helion_entry(key, FP)
    assert stored.files == FILES and stored.helion_key == key

    # A fresh host served the entry installs the group before Helion compiles.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-host"))
    artifacts.reset()
    assert KernelsearchBackend().get(key) == data
    assert local_group() == FILES and artifacts.STATS.installed == 1
    # Another Triton build: the entry is served, its compiled kernel is not loaded.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "other-build"))
    monkeypatch.setenv(compiled.ENV_OVERRIDE, json.dumps({"triton": "3.7.0"}))
    artifacts.reset()
    assert KernelsearchBackend().get(key) == data and local_group() is None


def test_a_helion_worker_stores_the_compiled_kernel_of_the_config_it_tuned(
        sqlite_store: Store, tmp_path: Path) -> None:
    """The worker's child runs the tuned config once on the call and hands back the compile
    groups of the Triton kernel Helion generated (`_compiled_of`); the worker stores them beside
    the entry it put, fenced by the job's lease. A config that fails to run costs the groups,
    never the entry."""
    from kernelsearch.search_space.compiled import store_helion_compiled
    from kernelsearch.service.helion_jobs import _compiled_of

    key = _helion_entry(sqlite_store)
    assert artifacts.install([wire()]) == 1  # the child's compile, in this host's Triton cache
    jit = type("JIT", (), {"device_caches": {0: ({"spec": handle_of(tmp_path, FILES)}, None)}})()
    ran: list[tuple[Any, ...]] = []

    class Bound:
        kernel = type("K", (), {"name": "k"})()
        _run = None

        def set_config(self, config: Any) -> None:
            self._run = types.FunctionType((lambda: None).__code__, {"_helion_k": jit})

        def __call__(self, *args: Any) -> None:
            ran.append(args)

    refs = _compiled_of(Bound(), {"block_sizes": [8]}, (1, 2))
    assert ran == [(1, 2)] and refs == [{"cache_key": KEY, "group": GROUP, "env": ENV}]
    assert store_helion_compiled(sqlite_store, key, refs[0])
    [stored] = sqlite_store.artifacts_of_helion_entry(key, FP)
    assert stored.files == FILES and stored.origin == "worker"

    class Broken(Bound):
        def __call__(self, *args: Any) -> None:
            raise RuntimeError("out of resources")

    assert _compiled_of(Broken(), {"block_sizes": [8]}, (1, 2)) == []
    other = hashlib.sha256(b"no such entry").hexdigest()
    assert not store_helion_compiled(sqlite_store, other, refs[0])  # no entry: nothing stored


# -- a set bound to what it claims; uploads and reads bounded ----------------------------------
@pytest.mark.parametrize("files, group, why", [
    (group_files(FN_B), f"{FN_B}.json", "not a Triton function of the record's kernel"),
    (group_files(key=hashlib.sha256(b"another kernel").hexdigest()), GROUP, "hash"),
    (group_files(num_warps=32), GROUP, "num_warps is 32"),
    ({**group_files(), "other.cubin": CUBIN}, GROUP, "every file of the group is named"),
    ({"evil.json": FILES[GROUP], CUBIN_NAME: CUBIN}, "evil.json", "kernel name"),
])
def test_a_set_is_stored_only_for_its_records_kernel_and_config(
        store: Store, writer: TestClient, files: dict[str, bytes], group: str, why: str) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    r = writer.post("/v1/artifacts", json=body(rec.id, files, group=group), headers=AUTH)
    assert r.status_code == 422 and why in r.text, r.text
    assert blobs(store) == 0
    ok = group_files(num_warps=rec.config["num_warps"], num_stages=rec.config["num_stages"])
    assert writer.post("/v1/artifacts", json=body(rec.id, ok), headers=AUTH).status_code == 201


SHARED_LIBRARY = elf(machine=62, e_type=3, segments=(1, 2))


@pytest.mark.parametrize("files, why", [
    ({**FILES, PTX: b"(lp0\nI1\naI2\na."}, "pickle"),  # protocol 0: printable text
    ({**FILES, PTX: b"]q\x00(K\x01K\x02e."}, "pickle"),  # protocol 1
    ({**FILES, CUBIN_NAME: elf(e_type=3)}, "shared object"),  # a .so's type, EM_CUDA patched in
    ({**FILES, CUBIN_NAME: elf(segments=(1, 2))}, "linked dynamically"),
    ({**FILES, PTX: SHARED_LIBRARY}, "ELF"),
    ({**FILES, PTX: b"\x7fELG" + SHARED_LIBRARY[4:]}, "binary data"),  # its magic patched
    ({**FILES, PTX: b"PK\x03\x04" + b"\0" * 26}, "zip"),
    ({**FILES, GROUP: b"{not json"}, "not JSON"),
])
def test_refuses_every_pickle_shared_library_and_zip(store: Store, writer: TestClient,
                                                     files: dict[str, bytes], why: str) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    r = writer.post("/v1/artifacts", json=body(rec.id, files), headers=AUTH)
    assert r.status_code == 422 and why in r.text, r.text
    assert blobs(store) == 0


def test_an_upload_never_replaces_another_and_record_id_is_an_integer(
        store: Store, writer: TestClient) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    assert writer.post("/v1/artifacts", json=body(str(rec.id)), headers=AUTH).status_code == 422
    assert writer.post("/v1/artifacts", json=body(rec.id), headers=AUTH).status_code == 201
    assert writer.post("/v1/artifacts", json=body(rec.id), headers=AUTH).status_code == 201  # again
    r = writer.post("/v1/artifacts", json=body(rec.id, {**FILES, PTX: b"// other"}), headers=AUTH)
    assert r.status_code == 409 and "another upload" in r.text
    [kept] = store.artifacts_of_record(rec.id, FP)
    assert kept.files == FILES


def test_workers_only_refuses_uploads_and_serves_workers_sets(store: Store) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    store.put_artifacts(rec.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                        files=FILES, origin="upload")
    with TestClient(create_app(settings_for(store.url, artifacts_from_workers_only=True),
                               store=store)) as c:
        r = c.post("/v1/artifacts", json=body(rec.id))
        assert r.status_code == 403 and "KS_ARTIFACTS_FROM_WORKERS_ONLY" in r.text
        params = {"record_id": rec.id, "env_fingerprint": FP}
        assert c.get("/v1/artifacts", params=params).json() == []
        assert c.get("/v1/artifacts/device", params={"device": H200, "env_fingerprint": FP}).json() == []
        store.put_artifacts(rec.id, cache_key=KEY, env=ENV, env_fingerprint=FP, group=GROUP,
                            files=FILES, origin="worker")
        assert [s["origin"] for s in c.get("/v1/artifacts", params=params).json()] == ["worker"]


def test_reads_need_the_read_token_and_answer_a_bounded_page(store: Store) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    keys = [hashlib.sha256(f"key {i}".encode()).hexdigest() for i in range(5)]
    for k in keys:
        store.put_artifacts(rec.id, cache_key=k, env=ENV, env_fingerprint=FP, group=GROUP,
                            files=group_files(key=k), origin="worker")
    one = sum(len(d) for d in FILES.values())
    settings = settings_for(store.url, api_token=SecretStr("t"), read_token=SecretStr("r"),
                            artifact_read_max_bytes=2 * one)
    with TestClient(create_app(settings, store=store)) as c:
        params: dict[str, Any] = {"record_id": rec.id, "env_fingerprint": FP}
        assert c.get("/v1/artifacts", params=params).status_code == 401
        assert c.get("/v1/artifacts/device", params={"device": H200, "env_fingerprint": FP}
                     ).status_code == 401
        assert c.get("/v1/artifacts", params=params, headers={"Authorization": "Bearer x"}
                     ).status_code == 401
        got: list[str] = []
        while True:
            page = c.get("/v1/artifacts", params=params, headers={"Authorization": "Bearer r"}).json()
            if not page:
                break
            assert len(page) <= 2
            got += [s["cache_key"] for s in page]
            params["after"] = page[-1]["id"]
        assert got == keys  # oldest first, every set once
        assert len(c.get("/v1/artifacts", params={"record_id": rec.id, "env_fingerprint": FP},
                         headers=AUTH).json()) == 2
    with TestClient(create_app(settings_for(store.url, read_token=SecretStr("")), store=store)) as c:
        params = {"record_id": rec.id, "env_fingerprint": FP}
        assert c.get("/v1/artifacts", params=params).status_code == 200  # empty: not set


def test_prefetch_is_bounded_before_loading_and_keeps_the_oldest(
        local_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget is applied to sizes the store sums before it reads a file, oldest set first:
    a newer upload never pushes an older set out, and nothing past the budget is loaded."""
    from kernelsearch.db.repos.artifacts import ArtifactRepo

    recs = [local_store.upsert_best(trusted(record(KA, {"total_patches": p}, 10.0)))[0]
            for p in (64, 128, 256)]
    keys = [hashlib.sha256(f"key {i}".encode()).hexdigest() for i in range(3)]
    for rec, k in zip(recs, keys):
        local_store.put_artifacts(rec.id, cache_key=k, env=ENV, env_fingerprint=FP, group=GROUP,
                                  files=group_files(key=k), origin="worker")
    loaded: list[int] = []
    views = ArtifactRepo._artifact_views
    monkeypatch.setattr(ArtifactRepo, "_artifact_views", staticmethod(
        lambda s, ids: loaded.extend(ids) or views(s, ids)))
    one = sum(len(d) for d in FILES.values())
    assert artifacts.prefetch(device=H200, max_bytes=2 * one + 10) == 2
    assert compiled.read_group(keys[0], GROUP) and compiled.read_group(keys[1], GROUP)
    assert compiled.read_group(keys[2], GROUP) is None
    assert len(loaded) == 2  # the third set's files were never read


def test_a_malformed_set_costs_only_itself_and_no_file_is_replaced(
        caplog: pytest.LogCaptureFixture) -> None:
    other = hashlib.sha256(b"other key").hexdigest()
    with caplog.at_level(logging.WARNING):
        n = artifacts.install(["junk", {"files": []}, wire(),  # type: ignore[list-item]
                               wire(group_files(key=other), cache_key=other)])
    assert n == 2 and artifacts.STATS.rejected == 2 and "malformed" in caplog.text
    assert local_group() == FILES
    # A set whose group is new but whose files are there already (Triton's own cubin of a group
    # being written) is refused: nothing in the cache is ever written over.
    from triton.runtime.cache import get_cache_manager

    third = hashlib.sha256(b"third key").hexdigest()
    get_cache_manager(third).put(b"triton's own cubin", CUBIN_NAME, binary=True)
    assert artifacts.install([wire(group_files(key=third), cache_key=third)]) == 0
    assert Path(get_cache_manager(third).get_file(CUBIN_NAME) or "").read_bytes() == b"triton's own cubin"


def test_the_services_prefetch_pages_within_the_budget_oldest_first(store: Store) -> None:
    """Through the service: each page is asked for within the budget left, and answered within
    the service's own read bound; the budget is never exceeded and the oldest sets come first."""
    recs = [store.upsert_best(trusted(record(KA, {"total_patches": p}, 10.0)))[0]
            for p in (64, 128, 256, 512)]
    keys = [hashlib.sha256(f"key {i}".encode()).hexdigest() for i in range(4)]
    for rec, k in zip(recs, keys):
        store.put_artifacts(rec.id, cache_key=k, env=ENV, env_fingerprint=FP, group=GROUP,
                            files=group_files(key=k), origin="worker")
    one = sum(len(d) for d in FILES.values())
    asked: list[dict[str, Any]] = []
    with TestClient(create_app(settings_for(store.url, artifact_read_max_bytes=one + 1),
                               store=store)) as c:
        class Service:
            def device_artifacts(self, device: str, fp: str, kernels: Any, *, after: int,
                                 max_bytes: int) -> list[dict[str, Any]]:
                asked.append({"after": after, "max_bytes": max_bytes})
                return c.get("/v1/artifacts/device", params={
                    "device": device, "env_fingerprint": fp, "after": after,
                    "max_bytes": max_bytes}).json()

        got = artifacts._prefetch_pages(Service(), None, H200, FP, None, 3 * one)
    assert [s["cache_key"] for s in got] == keys[:3]
    assert [a["max_bytes"] for a in asked] == [3 * one, 2 * one, one]


def test_a_cache_on_a_file_system_without_hard_links_still_installs_without_replacing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    assert artifacts.install([wire()]) == 1 and local_group() == FILES
    other = hashlib.sha256(b"other key").hexdigest()
    from triton.runtime.cache import get_cache_manager

    get_cache_manager(other).put(b"triton's own cubin", CUBIN_NAME, binary=True)
    assert artifacts.install([wire(group_files(key=other), cache_key=other)]) == 0
    assert Path(get_cache_manager(other).get_file(CUBIN_NAME) or "").read_bytes() == b"triton's own cubin"


def test_a_record_holds_a_bounded_number_of_uploaded_sets(store: Store) -> None:
    rec, _ = store.upsert_best(trusted(record(KA, {"total_patches": 64}, 10.0)))
    keys = [hashlib.sha256(f"key {i}".encode()).hexdigest() for i in range(3)]
    with TestClient(create_app(settings_for(store.url, artifact_max_uploads=2), store=store)) as c:
        for k in keys[:2]:
            r = c.post("/v1/artifacts", json=body(rec.id, group_files(key=k), cache_key=k))
            assert r.status_code == 201, r.text
        r = c.post("/v1/artifacts", json=body(rec.id, group_files(key=keys[2]), cache_key=keys[2]))
        assert r.status_code == 409 and "KS_ARTIFACT_MAX_UPLOADS" in r.text
    store.put_artifacts(rec.id, cache_key=keys[2], env=ENV, env_fingerprint=FP, group=GROUP,
                        files=group_files(key=keys[2]), origin="worker")  # a worker's: not bounded
    assert len(store.artifacts_of_record(rec.id, FP)) == 3
