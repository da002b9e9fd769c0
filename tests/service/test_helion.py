"""kernelsearch.helion, Helion's RemoteCacheBackend: get/put/list against a live service and the
local store, a service that is down or never answers, the acceptance gate, the dashboard, and
Helion's own RemoteAutotuneCache tuning a real Helion kernel on the CPU through it."""
from __future__ import annotations

from trusted_records import trusted_entry

import asyncio
import hashlib
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fastapi import Request, Response
from fastapi.testclient import TestClient
from svc_helpers import LiveServer, free_port, settings_for

helion = pytest.importorskip("helion")

import helion.language as hl  # noqa: E402
from helion.autotuner import FiniteSearch  # noqa: E402
from helion.autotuner.base_cache import LooseAutotuneCacheKey, StrictAutotuneCacheKey  # noqa: E402
from helion.autotuner.remote_cache import RemoteAutotuneCache  # noqa: E402

from kernelsearch.db.store import Store  # noqa: E402
from kernelsearch.backends import BACKENDS  # noqa: E402
from kernelsearch.helion import KernelsearchBackend  # noqa: E402
from kernelsearch.search_space.acceptance import HELION_CHECK_UNREPORTED, HELION_CHECKED  # noqa: E402
from kernelsearch.service.api import create_app  # noqa: E402
from kernelsearch.rest_client import Client, InvalidRequest, Unauthorized  # noqa: E402

TOKEN = "tok"


def spec(rows: int = 64) -> str:
    """Helion's specialization key (as str() writes it) of two fp16 [rows, 128] tensors."""
    t = f"(torch.float16, torch.Size([{rows}, 128]), (128, 1), frozenset())"
    return f"({t}, {t}, 'cuda', None, False)"


SPEC = spec()


class _Shown:
    """A key field shown as given: Helion's tuples (of torch dtypes and sizes) as their text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def helion_key(key_type: type = LooseAutotuneCacheKey, spec_text: str = SPEC,
               hardware: str = "NVIDIA H200", **kw: object) -> tuple[str, dict[str, str]]:
    """Helion's own cache key (`stable_hash`) and the key fields its local cache writes."""
    key = key_type(specialization_key=_Shown(spec_text), extra_results=_Shown("()"),
                   kernel_source_hash="ab" * 32, hardware=hardware, runtime_name="12.8",
                   backend="triton", config_spec_hash="cd" * 32, extra_cache_key="", **kw)
    return key.stable_hash(), {k: str(v) for k, v in vars(key).items()}


def entry(rows: int, hardware: str = "NVIDIA H200", block: int | None = None,
          config: str | None = None) -> tuple[str, str]:
    """A Helion cache key and entry text, in the shape Helion's LocalAutotuneCache writes: the
    key of tensors of `rows` rows, the config's first block `block` (else `rows`)."""
    key, fields = helion_key(spec_text=spec(rows), hardware=hardware)
    block = rows if block is None else block
    data = json.dumps({"config": config or json.dumps({"block_sizes": [block, 32], "num_warps": 4}, indent=2),
                       "key": {"type": "LooseAutotuneCacheKey", "fields": fields},
                       "flat_config": json.dumps([block, 32, 4])}, indent=2)
    return key, data


@pytest.fixture(autouse=True)
def _fresh_connection() -> Iterator[None]:
    BACKENDS.reset()
    yield
    BACKENDS.reset()


@pytest.fixture
def server(sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    app = create_app(settings_for(sqlite_store.url, api_token=TOKEN), store=sqlite_store)
    with LiveServer(app) as s:
        monkeypatch.setenv("KS_SERVICE_URL", s.url)
        monkeypatch.setenv("KS_API_TOKEN", TOKEN)
        yield s


def test_get_put_list_round_trip_against_the_service(server: LiveServer) -> None:
    backend = KernelsearchBackend()
    (k1, d1), (k2, d2) = entry(64), entry(128)
    assert backend.get(k1) is None
    backend.put(k1, d1)
    backend.put(k2, d2)
    assert backend.get(k1) == d1 and backend.get(k2) == d2  # the exact text Helion stored
    assert list(backend.list(10)) == [d2, d1]  # newest first
    assert list(backend.list(1)) == [d2]
    k3, d3 = entry(64, hardware="NVIDIA B200")
    backend.put(k3, d3)
    with Client(server.url) as c:
        assert [e["data"] for e in c.helion_list(10, hardware="NVIDIA H200")] == [d2, d1]
        got = c.helion_get(k1)
    assert got is not None
    # Put outside Helion's cache class: named by the kernel's source hash, check not reported.
    assert got["kernel"] == "helion:src-" + "ab" * 6 and got["checked_by"] == HELION_CHECK_UNREPORTED
    assert got["hardware"] == "NVIDIA H200" and got["config"] == {"block_sizes": [64, 32], "num_warps": 4}
    assert got["axes"] == {"t0.dtype": "float16", "t0.size0": 64, "t0.size1": 128,
                           "t1.dtype": "float16", "t1.size0": 64, "t1.size1": 128}
    assert got["uploaded_by"] == "api-token"
    # Helion writes a key again when it tunes it again: the newest text is served.
    _, d1b = entry(64, block=32)
    backend.put(k1, d1b)
    assert backend.get(k1) == d1b and list(backend.list(10))[0] == d1b


def test_a_lookup_waits_as_long_as_ks_helion_timeout_s_allows(
        sqlite_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service answering Helion's lookup in 1 s, past the other lookups' request bound
    (KS_PROVIDER_TIMEOUT_S 0.5 s), serves the entry when KS_HELION_TIMEOUT_S allows 5 s: the
    request was cut at 0.5 s and the service put on the back-off (a CI failure under load)."""
    import time as _time

    key, data = entry(64)
    app = create_app(settings_for(sqlite_store.url, api_token=TOKEN), store=sqlite_store)

    @app.middleware("http")
    async def slow_helion(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.method == "GET" and request.url.path.startswith("/v1/helion/"):
            await asyncio.sleep(1.0)
        return await call_next(request)

    with LiveServer(app) as s:
        monkeypatch.setenv("KS_SERVICE_URL", s.url)
        monkeypatch.setenv("KS_API_TOKEN", TOKEN)
        monkeypatch.setenv("KS_HELION_TIMEOUT_S", "5")
        KernelsearchBackend().put(key, data)
        BACKENDS.drain(10)
        t0 = _time.monotonic()
        assert KernelsearchBackend().get(key) == data
        assert _time.monotonic() - t0 >= 1.0 and BACKENDS.up("service")


def test_the_gate_refuses_what_is_not_a_checked_helion_entry(server: LiveServer) -> None:
    key, data = entry(64)
    with Client(server.url) as anon:
        with pytest.raises(Unauthorized):
            anon.helion_put(key, data)
    with Client(server.url, token=TOKEN) as c:
        with pytest.raises(InvalidRequest, match="accuracy check off"):
            c.helion_put(key, data, checked=False)
        with pytest.raises(InvalidRequest, match="data.key"):
            c.helion_put(key, json.dumps({"config": "{}"}))
        with pytest.raises(InvalidRequest, match="data.config"):
            c.helion_put(key, data.replace('"config": "{', '"config": "[{', 1))
        bad = httpx.put(f"{server.url}/v1/helion/entries/NOTAKEY", json={"data": data},
                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert bad.status_code == 422
        assert c.helion_get(key) is None  # nothing refused was stored
        stored = c.helion_put(key, data, kernel="mypkg.kernels.softmax", arg_names=["x", "y"], checked=True)
    assert stored["kernel"] == "helion:mypkg.kernels.softmax" and stored["checked_by"] == HELION_CHECKED
    assert stored["axes"]["x.dtype"] == "float16" and stored["axes"]["y.size1"] == 128


def _entry_text(fields: dict[str, str], config: str, key_type: str = "LooseAutotuneCacheKey") -> str:
    return json.dumps({"config": config, "key": {"type": key_type, "fields": fields}})


def test_the_key_is_the_hash_of_the_entrys_own_key_fields_as_helion_computes_it() -> None:
    """Helion's own keys (LooseAutotuneCacheKey, StrictAutotuneCacheKey, best_of_k shown or not)
    are recomputed from the entry's fields; an entry under any other key is refused."""
    from kernelsearch.search_space.acceptance import RecordRejected, accepted_helion, helion_entry_key

    config = json.dumps({"block_sizes": [64, 32]})
    for key_type, kw in ((LooseAutotuneCacheKey, {}), (LooseAutotuneCacheKey, {"best_of_k": 3}),
                         (StrictAutotuneCacheKey, {"helion_key": "h" * 64, "torch_key": "t" * 64,
                                                   "triton_key": "r" * 64}),
                         (StrictAutotuneCacheKey, {"best_of_k": 2, "helion_key": "h", "torch_key": "t",
                                                   "triton_key": "r"}),
                         (LooseAutotuneCacheKey, {"hardware": "NVIDIA \"H200\" 'x' \\"})):
        key, fields = helion_key(key_type, **kw)
        data = _entry_text(fields, config, key_type.__name__)
        assert helion_entry_key(data) == key, (key_type, kw)
        assert accepted_helion(key, data).value.cache_key == key
    other, _ = entry(128)
    key, fields = helion_key()
    for bad_key, bad_fields, field in (
            (other, fields, "key"),  # another shape's key
            (key, {**fields, "hardware": "NVIDIA B200"}, "key"),  # the fields changed under the key
            (key, {**fields, "extra": "x"}, "data.key.fields"),
            (key, {k: v for k, v in fields.items() if k != "best_of_k"}, "data.key.fields"),
            (key, {**fields, "best_of_k": "01"}, "data.key.fields.best_of_k"),
            (key, {**fields, "specialization_key": "x), hardware=('y"}, "data.key.fields.specialization_key")):
        with pytest.raises(RecordRejected) as e:
            accepted_helion(bad_key, _entry_text(bad_fields, config))
        assert e.value.field == field, (bad_fields, e.value)
    with pytest.raises(RecordRejected) as e:
        accepted_helion(key, _entry_text(fields, config, "BoundKernelInMemoryCacheKey"))
    assert e.value.field == "data.key.type"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# (id, entry text's key fields and config): hostile text each backend must refuse alike.
_HOSTILE = {
    "config-nested-deep": ({}, json.dumps({"block_sizes": [1]})[:-1] + ', "x": ' + _nested(5000) + "}"),
    "config-nested-past-the-bound": ({}, json.dumps({"x": json.loads(_nested(100))})),
    "config-nan": ({}, '{"block_sizes": [NaN, 32]}'),
    "config-infinity": ({}, '{"block_sizes": [Infinity, 32], "num_warps": -Infinity}'),
    "key-field-escaped-nul": ({"hardware": r"NVIDIA\u0000H200"}, json.dumps({"block_sizes": [1]})),
    "key-field-lone-surrogate": ({"hardware": r"NVIDIA\ud800"}, json.dumps({"block_sizes": [1]})),
    "config-key-nul": ({}, '{"block\\u0000sizes": [1]}'),
}


def _hostile_data(fields_over: dict[str, str], config: str) -> tuple[str, str]:
    key, fields = helion_key()
    doc = json.dumps({"config": config, "key": {"type": "LooseAutotuneCacheKey", "fields": fields}})
    for name, raw in fields_over.items():  # escapes written into the JSON text as they are
        doc = doc.replace(json.dumps(fields[name]), f'"{raw}"', 1)
    return key, doc


@pytest.mark.parametrize("case", list(_HOSTILE))
def test_hostile_entry_text_is_a_4xx_on_both_backends(store: Store, case: str) -> None:
    """PUT /v1/helion/entries answered 500 on deeply nested JSON (both backends), and on
    PostgreSQL on NaN/Infinity in the config and an escaped NUL in a key field."""
    app = create_app(settings_for(store.url, api_token=TOKEN), store=store)
    key, data = _hostile_data(*_HOSTILE[case])
    with TestClient(app, raise_server_exceptions=False) as c:
        res = c.put(f"/v1/helion/entries/{key}", json={"data": data}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert res.status_code == 422, (case, res.status_code, res.text[:300])
        assert res.json()["detail"].startswith("body.data"), res.json()["detail"][:300]
        deep = '{"data": "x", "kernel": ' + _nested(5000) + "}"  # the request body itself
        res = c.put(f"/v1/helion/entries/{key}", content=deep,
                    headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        assert 400 <= res.status_code < 500, res.text[:300]
    assert store.get_helion_entry(key) is None


def test_an_upload_never_replaces_a_workers_entry(store: Store) -> None:
    from kernelsearch.db.statuses import RecordOrigin
    from kernelsearch.search_space.acceptance import accepted_helion

    key, tuned = entry(64)
    _, forged = entry(64, block=1)
    _, other = entry(64, block=16)
    app = create_app(settings_for(store.url, api_token=TOKEN), store=store)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(app) as c:
        # An upload replaces an upload (Helion writes its key again when it tunes it again) ...
        assert c.put(f"/v1/helion/entries/{key}", json={"data": other}, headers=auth).status_code == 200
        assert c.put(f"/v1/helion/entries/{key}", json={"data": forged}, headers=auth).json()["origin"] == "upload"
        # ... a worker's tuning replaces an upload, and no upload replaces the worker's.
        got = store.put_helion_entry(accepted_helion(key, tuned, by="worker w1", origin=RecordOrigin.WORKER))
        assert got.origin == "worker" and got.data == tuned
        res = c.put(f"/v1/helion/entries/{key}", json={"data": forged}, headers=auth)
        assert res.status_code == 409 and "worker" in res.json()["detail"], res.text
        served = c.get(f"/v1/helion/entries/{key}").json()
        assert served["data"] == tuned and served["origin"] == "worker"
        # A worker tuning the key again still replaces its own.
        again = store.put_helion_entry(accepted_helion(key, other, origin=RecordOrigin.WORKER))
        assert again.data == other


def test_the_backend_loads_only_an_entry_of_the_key_it_asked_for(sqlite_store: Store,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry stored under a key its own fields do not hash to (put there past the gate: an
    older server, a hand-edited database) is a miss, through the service and the local store."""
    import dataclasses

    from kernelsearch.db.statuses import RecordOrigin
    from kernelsearch.search_space.acceptance import accepted_helion

    (k1, d1), (k2, d2) = entry(64), entry(128)
    sqlite_store.put_helion_entry(accepted_helion(k1, d1))
    sqlite_store.put_helion_entry(trusted_entry(dataclasses.replace(accepted_helion(k2, d2).value,
                                                                   cache_key=entry(32)[0])))
    monkeypatch.delenv("KS_SERVICE_URL", raising=False)
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_HELION_TIMEOUT_S", "30")
    assert KernelsearchBackend().get(k1) == d1
    assert KernelsearchBackend().get(entry(32)[0]) is None
    # A worker's entry stays against this process's put, and refusing it is no fault of the store.
    k3, d3 = entry(256)
    sqlite_store.put_helion_entry(accepted_helion(k3, d3, origin=RecordOrigin.WORKER))
    KernelsearchBackend().put(k3, entry(256, block=1)[1])
    assert not BACKENDS.resolver.down("store") and KernelsearchBackend().get(k3) == d3
    BACKENDS.reset()
    app = create_app(settings_for(sqlite_store.url, api_token=TOKEN), store=sqlite_store)
    with LiveServer(app) as s:
        monkeypatch.setenv("KS_SERVICE_URL", s.url)
        assert KernelsearchBackend().get(k1) == d1
        assert KernelsearchBackend().get(entry(32)[0]) is None
        assert not BACKENDS.resolver.down("service")  # a wrong entry is no fault of the service


def test_the_store_keeps_entries_newest_first_one_per_key(store: Store) -> None:
    from kernelsearch.search_space.acceptance import accepted_helion

    (k1, d1), (k2, d2) = entry(64), entry(128, hardware="NVIDIA B200")
    store.put_helion_entry(accepted_helion(k1, d1))
    store.put_helion_entry(accepted_helion(k2, d2))
    store.put_helion_entry(accepted_helion(k1, d1, kernel="m.f"))  # the key again: replaced, now newest
    assert [e.cache_key for e in store.list_helion_entries(10)] == [k1, k2]
    assert [e.cache_key for e in store.list_helion_entries(10, hardware="NVIDIA B200")] == [k2]
    assert [e.cache_key for e in store.list_helion_entries(10, kernel="helion:m.f")] == [k1]
    got = store.get_helion_entry(k1)
    assert got is not None and got.data == d1 and got.kernel == "helion:m.f" and got.updated_at >= got.created_at
    with pytest.raises(ValueError, match="limit"):
        store.list_helion_entries(0)


def test_a_helion_entry_shows_on_the_dashboard(server: LiveServer) -> None:
    key, data = entry(64)
    with Client(server.url, token=TOKEN) as c:
        c.helion_put(key, data, kernel="mypkg.softmax", arg_names=["x", "y"], checked=True)
    page = httpx.get(f"{server.url}/helion").text
    assert f'data-key="{key}"' in page
    for text in ("helion:mypkg.softmax", "NVIDIA H200", "x.dtype=float16", "x.size0=64", HELION_CHECKED):
        assert text in page
    one = httpx.get(f"{server.url}/helion", params={"kernel": "helion:other"}).text
    assert f'data-key="{key}"' not in one and "No Helion entries of this kernel" in one
    assert 'href="/helion"' in httpx.get(f"{server.url}/").text


def test_a_dead_service_is_a_miss_and_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KS_SERVICE_URL", f"http://127.0.0.1:{free_port()}")
    backend = KernelsearchBackend()
    key, data = entry(64)
    assert backend.get(key) is None
    assert BACKENDS.resolver.down("service")  # the refused connection marked it down
    backend.put(key, data)  # dropped, not raised
    assert list(backend.list(5)) == []


def test_a_service_that_never_answers_is_a_miss_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts and never answers: get returns None while the server still holds
    the request (the bound, not the server, ended the wait)."""
    release = threading.Event()
    held: list[socket.socket] = []
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()

    def hold() -> None:
        while not release.is_set():
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=hold, daemon=True).start()
    monkeypatch.setenv("KS_SERVICE_URL", f"http://127.0.0.1:{lsock.getsockname()[1]}")
    monkeypatch.setenv("KS_HELION_TIMEOUT_S", "0.3")
    try:
        assert KernelsearchBackend().get(entry(64)[0]) is None
        assert held and not release.is_set()
        assert BACKENDS.resolver.down("service")
        BACKENDS.resolver.reset()
        KernelsearchBackend().put(*entry(64))  # returns at the bound; the put goes on
        assert not BACKENDS.idle()
    finally:
        release.set()
        lsock.close()
        for conn in held:
            conn.close()
    BACKENDS.drain(10.0)  # what the process does at exit: the put ends (here: refused)
    assert BACKENDS.idle()


def test_without_a_service_the_local_store_keeps_the_entries(sqlite_store: Store,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KS_SERVICE_URL", raising=False)
    monkeypatch.setenv("KS_DATABASE_URL", sqlite_store.url)
    monkeypatch.setenv("KS_HELION_TIMEOUT_S", "30")  # a loaded machine opens the store slowly
    backend = KernelsearchBackend()
    key, data = entry(64)
    assert backend.get(key) is None
    backend.put(key, data)
    assert backend.get(key) == data and list(backend.list()) == [data]
    stored = sqlite_store.get_helion_entry(key)
    assert stored is not None and stored.uploaded_by == "anonymous"
    backend.put(key, "not json")  # refused by the gate: the stored entry stays
    backend.put(key, data.replace("NVIDIA", "NVIDIA\x00"))  # NUL: refused here, as PostgreSQL would
    assert backend.get(key) == data


# -- Helion's own RemoteAutotuneCache, tuning a real Helion kernel on the CPU -------------------

# In this process: no benchmark subprocess, no precompile fork (the interpreter has neither).
@helion.kernel(configs=[helion.Config(block_sizes=[4]), helion.Config(block_sizes=[8])],
               autotune_precompile=None, autotune_benchmark_subprocess=False)
def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    for tile in hl.tile(x.size(0)):
        out[tile] = x[tile] + y[tile]
    return out


class CpuRemoteAutotuneCache(RemoteAutotuneCache):
    """Helion's RemoteAutotuneCache, keyed on the CPU: Helion names no CPU device for its Triton
    backend (its key asserts a hardware and runtime name), so this key says `cpu` and the
    interpreter where Helion's would say the GPU and CUDA version; every other field is Helion's."""

    def _generate_key(self) -> LooseAutotuneCacheKey:
        import inspect
        import textwrap

        k = self.kernel.kernel
        mem = k._create_bound_kernel_cache_key(self.kernel, tuple(self.args), k._base_specialization_key(self.args))
        source = textwrap.dedent(inspect.getsource(k.fn))
        return LooseAutotuneCacheKey(
            specialization_key=mem.specialization_key, extra_results=mem.extra_results,
            kernel_source_hash=hashlib.sha256(source.encode()).hexdigest(), hardware="cpu",
            runtime_name="triton-interpreter", backend=self.kernel.env.backend.name,
            config_spec_hash=self.kernel.config_spec.structural_fingerprint_hash(advanced_controls_files=None),
            extra_cache_key=self.kernel.extra_cache_key())


@pytest.fixture
def helion_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Helion's autotuner on the CPU, timed with Helion's own wall-clock `do_bench_generic` (its
    default, Triton's GPU events, has no CPU driver; Helion leaves `do_bench` patchable for this)."""
    import helion.autotuner.benchmark_provider as bp
    from helion.autotuner.benchmarking import do_bench_generic

    monkeypatch.setattr(bp, "do_bench", do_bench_generic)
    monkeypatch.setenv("HELION_REMOTE_CACHE_BACKEND", "kernelsearch.helion.KernelsearchBackend")


def _tune(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[helion.Config, int, CpuRemoteAutotuneCache]:
    """One process's first call of `add`: its config, how many configs it benchmarked, the cache."""
    from helion._utils import counters

    monkeypatch.setenv("HELION_CACHE_DIR", str(cache_dir))
    x, y = torch.randn(16), torch.randn(16)
    bound = add.bind((x, y))
    cache = CpuRemoteAutotuneCache[FiniteSearch](bound, (x, y))
    before = counters["autotune"]["cache_miss"]
    config = cache.autotune()
    return config, counters["autotune"]["cache_miss"] - before, cache


def test_helion_remote_cache_tunes_once_then_serves(server: LiveServer, helion_on_cpu: None,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tuned, misses, cache = _tune(tmp_path / "host1", monkeypatch)
    assert misses == 1  # nothing stored yet: Helion tuned, then put its entry
    key = cache.key.stable_hash()
    with Client(server.url) as c:
        got = c.helion_get(key)
    assert got is not None
    local = (tmp_path / "host1" / f"{key}.best_config").read_text()
    assert got["data"] == local  # exactly the text Helion wrote to its own cache
    assert got["kernel"] == "helion:test_helion.add" and got["checked_by"] == HELION_CHECKED
    assert got["hardware"] == "cpu" and got["config"] == json.loads(tuned.to_json())
    assert got["axes"] == {"x.dtype": "float32", "x.size0": 16, "y.dtype": "float32", "y.size0": 16}

    # Another host: an empty local cache, served by the backend without tuning.
    served, misses, _ = _tune(tmp_path / "host2", monkeypatch)
    assert misses == 0 and served == tuned
    assert (tmp_path / "host2" / f"{key}.best_config").exists()  # Helion kept it locally too


class CpuFiniteSearch(FiniteSearch):
    """Helion's FiniteSearch, matching cached entries on the CPU: its hardware is `cpu` as the
    cache key above says (Helion names no CPU device), and its specialization is serialized as
    put() serializes it. Helion 1.4.0 serializes its live key otherwise (a torch.Size becomes a
    tuple), so its warm start never matches a tensor kernel's entry, local or remote; this is
    Helion's fix of that (pytorch/helion#3642, after 1.4.0)."""

    def _get_current_hardware_and_specialization(self) -> tuple[str | None, str | None]:
        from helion.autotuner.base_search import _normalize_spec_key_str

        return "cpu", _normalize_spec_key_str(str(self.kernel.kernel._base_specialization_key(self.args)))


def test_helion_warm_start_reads_the_entries_list_gives(server: LiveServer, helion_on_cpu: None,
                                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Helion's warm start (`_find_similar_cached_configs`: the local cache, then the backend's
    `list`) finds the config another host tuned, with this host's local cache empty."""
    tuned, _, _ = _tune(tmp_path / "host1", monkeypatch)
    for block in (64, 128):  # newer entries of another hardware: list() leaves them out, or they
        KernelsearchBackend().put(*entry(block))  # would fill the 2 Helion asks for one match
    monkeypatch.setenv("HELION_CACHE_DIR", str(tmp_path / "host3"))
    x, y = torch.randn(16), torch.randn(16)
    found = CpuFiniteSearch(add.bind((x, y)), (x, y))._find_similar_cached_configs(1)
    assert [e.config for e in found] == [tuned]
    assert found[0].hardware == "cpu" and found[0].flat_config is not None
