"""The Python client, and the sources and resolver of `get_kernel`, against a real server and
with it gone."""
from __future__ import annotations

from trusted_records import trusted

import time
from collections.abc import Iterator

import pytest
import torch
from svc_helpers import H200, KB, LiveServer, free_port, record, settings_for

from kernelsearch import kernels
from kernelsearch.db.store import Store
from kernelsearch.kernels import provider as kprovider
from kernelsearch.kernels.device import INTERPRETER_DEVICE
from kernelsearch.service.api import create_app
from kernelsearch.rest_client import (Client, InvalidRequest, JobTimeout, NotFound, ServiceUnreachable,
                            TooManyRequests, Unauthorized)
from kernelsearch.kernels.resolve import Key, Match, Resolver, SourceUnavailable
from kernelsearch.provider import install_default_provider
from kernelsearch.service.sources import StoreSource
from kernelsearch.sources import ServiceSource


@pytest.fixture(autouse=True)
def _no_provider() -> Iterator[None]:
    yield
    kernels.set_resolver(None)


def _near(axes):
    kdef = kernels.get_kernel(KB)
    return lambda other: kdef.distance(axes, other)


def _config(resolver: Resolver, axes, device=H200):
    """What get_kernel's lookup would run: the resolver's answer with the kernel's own nearest."""
    got = resolver.resolve(Key.of(KB, axes, device), near=_near(axes))
    return None if got is None else got.config


@pytest.fixture
def server(sqlite_store: Store) -> Iterator[LiveServer]:
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 128}, 20.0, config={"ROWS": 2})))
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 4096}, 300.0, config={"ROWS": 8})))
    app = create_app(settings_for(sqlite_store.url, api_token="tok", max_queued_jobs=2),
                     store=sqlite_store)
    with LiveServer(app) as s:
        yield s


def test_client_lookups(server: LiveServer) -> None:
    with Client(server.url) as c:
        assert c.health()["status"] == "ok"
        assert {k["name"] for k in c.kernels()} == set(kernels.all_kernels())
        b = c.best(KB, H200, seq_len=4000)
        assert b["match"] == "nearest" and b["config"] == {"ROWS": 8}
        assert len(c.records(kernel=KB, device=H200)) == 2
        with pytest.raises(NotFound, match="no record"):
            c.best(KB, "NVIDIA B200", seq_len=1)
        with pytest.raises(InvalidRequest, match="outside") as err:
            c.best(KB, H200, seq_len=-3)
        assert err.value.status == 422


def test_client_jobs(server: LiveServer) -> None:
    with Client(server.url) as anon:
        with pytest.raises(Unauthorized, match="bearer token"):
            anon.submit_job(KB, [{"seq_len": 2}], n_trials=1)
    with Client(server.url, token="tok") as c:
        job = c.submit_job(KB, [{"seq_len": 2}], n_trials=3, sampler="random", timeout_s=30)
        assert job["status"] == "queued"
        assert c.job(job["id"])["n_trials"] == 3
        assert [j["id"] for j in c.jobs(status="queued")] == [job["id"]]
        with pytest.raises(JobTimeout, match="still queued"):
            c.wait(job["id"], timeout=0.3, poll_s=0.1)
        with pytest.raises(InvalidRequest, match=r"cases\[0\]"):
            c.submit_job(KB, [{"seq_len": 0}], n_trials=1)
        c.submit_job(KB, "all", n_trials=1)
        with pytest.raises(TooManyRequests, match="already queued"):
            c.submit_job(KB, "all", n_trials=2)
        assert c.cancel(job["id"])["status"] == "cancelled"
        assert c.wait(job["id"], timeout=5)["status"] == "cancelled"
        with pytest.raises(NotFound):
            c.job(987654)


def test_client_service_unreachable() -> None:
    with Client(f"http://127.0.0.1:{free_port()}", timeout=2) as c:
        with pytest.raises(ServiceUnreachable, match="unreachable"):
            c.best(KB, H200, seq_len=1)


def test_service_source_answers_and_survives_an_outage(server: LiveServer) -> None:
    p = Resolver([ServiceSource(Client(server.url, timeout=10))])  # a loaded CI machine is slow
    assert _config(p, {"seq_len": 128}) == {"ROWS": 2}
    assert _config(p, {"seq_len": 100}) == {"ROWS": 2}  # the service's nearest
    assert _config(p, {"seq_len": 128}, "NVIDIA B200") is None
    server.stop()
    t0 = time.monotonic()
    # Down: the nearest among the records it learnt, without a network wait after the first.
    assert _config(p, {"seq_len": 3000}) == {"ROWS": 8}
    assert p.down("service")
    assert _config(p, {"seq_len": 128}) == {"ROWS": 2}
    # Nothing known while down: unavailable, not "no record" (never cached as a miss).
    with pytest.raises(SourceUnavailable):
        _config(p, {"seq_len": 1}, "NVIDIA B200")
    assert time.monotonic() - t0 < 5
    p.sources[0].close()


def test_store_source(sqlite_store: Store) -> None:
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 64}, 9.0, config={"ROWS": 4})))
    p = Resolver([StoreSource(sqlite_store)])
    assert _config(p, {"seq_len": 64}) == {"ROWS": 4}
    got = p.resolve(Key.of(KB, {"seq_len": 70}, H200), near=_near({"seq_len": 70}))
    assert got is not None and got.match is Match.NEAREST and got.config == {"ROWS": 4}
    assert got.axes == {"seq_len": 64} and got.distance > 0
    assert _config(p, {"seq_len": 64}, "other") is None
    # Without a `near`, no nearest answer.
    assert p.resolve(Key.of(KB, {"seq_len": 70}, H200)) is None
    broken = Resolver([StoreSource(Store(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/x"))])
    with pytest.raises(SourceUnavailable):
        _config(broken, {"seq_len": 64})


def test_the_store_answers_before_the_service(tmp_path, server: LiveServer) -> None:
    """One chain, one order: the local store's exact record wins over the service's, and the
    service's exact record over the store's nearest."""
    from kernelsearch.db.engine import upgrade

    url = f"sqlite:///{tmp_path / 'local.db'}"
    upgrade(url)
    local = Store(url)
    local.upsert_best(trusted(record(KB, {"seq_len": 128}, 9.0, config={"ROWS": 16})))
    p = Resolver([StoreSource(local), ServiceSource(Client(server.url, timeout=10))])
    try:
        got = p.resolve(Key.of(KB, {"seq_len": 128}, H200), near=_near({"seq_len": 128}))
        assert got is not None and got.source == "store" and got.config == {"ROWS": 16}
        got = p.resolve(Key.of(KB, {"seq_len": 4096}, H200), near=_near({"seq_len": 4096}))
        assert got is not None and got.source == "service" and got.match is Match.EXACT
        assert got.config == {"ROWS": 8}
    finally:
        p.sources[1].close()
        local.close()


def test_a_store_blip_on_the_get_kernel_path_is_not_cached_as_a_miss(sqlite_store: Store) -> None:
    """kernelsearch.get_kernel(...)(...) asks kernels.provider.lookup: a transient store error
    answers the default once, and the next call finds the record."""
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 64}, 9.0, config={"ROWS": 4})))

    class Blip:
        def __init__(self, store: Store) -> None:
            self.store, self.fail = store, 1

        def find_best(self, *a, **k):
            if self.fail:
                self.fail -= 1
                raise ConnectionError("server closed the connection unexpectedly")
            return self.store.find_best(*a, **k)

    kprovider.set_resolver(Resolver([StoreSource(Blip(sqlite_store))], retry_s=0.0))  # type: ignore[arg-type]
    kdef = kernels.get_kernel(KB)
    try:
        assert kprovider.lookup(kdef, {"seq_len": 64}, H200) is None
        assert kprovider.lookup(kdef, {"seq_len": 64}, H200) == {"ROWS": 4}
    finally:
        kprovider.set_resolver(None)


def test_a_nearest_record_is_served_as_it_is_stored(sqlite_store: Store) -> None:
    """Another shape gets the nearest record's config unchanged: from the store, from the service
    and from what the service taught while it is down."""
    cfg = {"ROWS": 1, "TRIG": "precise"}
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 256}, 5.0, config=cfg)))
    local = Resolver([StoreSource(sqlite_store)])
    assert _config(local, {"seq_len": 256}) == cfg
    assert _config(local, {"seq_len": 3000}) == cfg
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    with LiveServer(app) as s:
        remote = Resolver([ServiceSource(Client(s.url, timeout=2))])
        assert _config(remote, {"seq_len": 256}) == cfg
        assert _config(remote, {"seq_len": 3000}) == cfg
        s.stop()
        assert _config(remote, {"seq_len": 256}) == cfg
        assert _config(remote, {"seq_len": 2000}) == cfg
        remote.sources[0].close()


def test_the_provider_serves_no_record_past_the_nearest_bound(sqlite_store: Store) -> None:
    """`get_kernel`'s provider answers as /v1/best does: a record of seq_len 16 is no answer for
    seq_len 100000 (far past KS_NEAREST_MAX_RATIO), whatever the source."""
    sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 16}, 5.0, config={"ROWS": 1})))
    kprovider.set_resolver(Resolver([StoreSource(sqlite_store)], retry_s=0.0))
    kdef = kernels.get_kernel(KB)
    try:
        assert kprovider.lookup(kdef, {"seq_len": 100000}, H200) is None
        assert kprovider.lookup(kdef, {"seq_len": 20}, H200) == {"ROWS": 1}
    finally:
        kprovider.set_resolver(None)


def _kernel_b_inputs(seq_len: int) -> tuple[torch.Tensor, ...]:
    return kernels.get_kernel(KB).make_inputs({"seq_len": seq_len}, seed=0, device="cpu")


def test_kernel_call_never_fails_with_the_service_down(sqlite_url: str) -> None:
    """KS_SERVICE_URL on a dead port: the call still runs, with the local store's config."""
    from kernelsearch.db.engine import upgrade

    upgrade(sqlite_url)
    local = Store(sqlite_url)
    local.upsert_best(trusted(record(KB, {"seq_len": 2}, 9.0, device=INTERPRETER_DEVICE,
                             config={"ROWS": 2, "HEADS": 8})))
    settings = settings_for(sqlite_url, service_url=f"http://127.0.0.1:{free_port()}",
                            provider_timeout_s=0.3)
    p = install_default_provider(settings)
    assert p is not None and [src.name for src in p.sources] == ["store", "service"]
    inputs = _kernel_b_inputs(2)
    outs = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")(*inputs)
    ref = kernels.get_kernel(KB).reference(*inputs)
    for got, want in zip(outs, ref):
        assert torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-5)
    cfg = kprovider.lookup(kernels.get_kernel(KB), {"seq_len": 2}, INTERPRETER_DEVICE)
    assert cfg == {"ROWS": 2, "HEADS": 8}
    local.close()


def test_kernel_call_with_nothing_reachable_uses_the_default(tmp_path) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'absent.db'}",
                            service_url=f"http://127.0.0.1:{free_port()}", provider_timeout_s=0.3)
    p = install_default_provider(settings)
    assert p is not None and [src.name for src in p.sources] == ["service"]
    assert not (tmp_path / "absent.db").exists()
    outs = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")(*_kernel_b_inputs(1))
    assert outs[0].shape == (1, 16, 128)
    assert kprovider.lookup(kernels.get_kernel(KB), {"seq_len": 1}, INTERPRETER_DEVICE) is None


def test_which_config_says_what_a_get_kernel_call_runs(sqlite_store: Store) -> None:
    kdef = kernels.get_kernel(KB)
    kprovider.set_resolver(Resolver([StoreSource(sqlite_store)]))
    try:
        assert kdef.which_config({"seq_len": 64}, "cpu") == (kdef.default_config, "default")
        sqlite_store.upsert_best(trusted(record(KB, {"seq_len": 64}, 9.0, device=INTERPRETER_DEVICE,
                                        config={**kdef.default_config, "ROWS": 2, "HEADS": 8})))
        kprovider.clear_cache()
        config, source = kdef.which_config({"seq_len": 64}, "cpu")
        assert source == "record" and (config["ROWS"], config["HEADS"]) == (2, 8)
    finally:
        kprovider.set_resolver(None)


def test_get_kernel_and_the_decorator_share_one_resolver_and_its_back_off(tmp_path,
                                                                          monkeypatch) -> None:
    """`get_kernel`'s provider plugs in the backends' own resolver, with KS_AUTOTUNE_RETRY_S: a
    service the decorator (or a hook) saw fail is left alone by `get_kernel` too, and back."""
    from kernelsearch.backends import BACKENDS

    monkeypatch.setenv("KS_AUTOTUNE_RETRY_S", "123")
    settings = settings_for(f"sqlite:///{tmp_path / 'absent.db'}",
                            service_url=f"http://127.0.0.1:{free_port()}")
    try:
        p = install_default_provider(settings)
        assert p is BACKENDS.resolver is kprovider.current_resolver()
        assert p.retry_s == 123
        BACKENDS.failed("service", "no answer within 0.25 s")  # what the decorator's bound does
        assert kprovider.current_resolver().down("service")
        p.reset()
        assert not BACKENDS.resolver.down("service")
    finally:
        BACKENDS.reset()
