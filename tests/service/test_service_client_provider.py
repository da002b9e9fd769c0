"""The Python client and the config providers against a real server, and with it gone."""
from __future__ import annotations

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
from kernelsearch.service.client import (Client, InvalidRequest, JobTimeout, NotFound, ServiceUnreachable,
                            TooManyRequests, Unauthorized)
from kernelsearch.service.provider import ServiceProvider, StoreProvider, install_default_provider


@pytest.fixture(autouse=True)
def _no_provider() -> Iterator[None]:
    yield
    kernels.set_provider(None)


@pytest.fixture
def server(sqlite_store: Store) -> Iterator[LiveServer]:
    sqlite_store.upsert_best(record(KB, {"seq_len": 128}, 20.0, config={"ROWS": 2}))
    sqlite_store.upsert_best(record(KB, {"seq_len": 4096}, 300.0, config={"ROWS": 8}))
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


def test_service_provider_answers_and_survives_an_outage(server: LiveServer) -> None:
    p = ServiceProvider(server.url, timeout=10)  # a loaded CI machine answers slowly
    assert p.best_config(KB, {"seq_len": 128}, H200) == {"ROWS": 2}
    assert p.best_config(KB, {"seq_len": 100}, H200) == {"ROWS": 2}  # the service's nearest
    assert p.best_config(KB, {"seq_len": 128}, "NVIDIA B200") is None
    server.stop()
    t0 = time.monotonic()
    # Down: the nearest among the records it learnt, without a network wait after the first.
    assert p.best_config(KB, {"seq_len": 3000}, H200) == {"ROWS": 8}
    assert p.best_config(KB, {"seq_len": 128}, H200) == {"ROWS": 2}
    # Nothing known while down: unavailable, not "no record" (never cached as a miss).
    with pytest.raises(kprovider.ProviderUnavailable):
        p.best_config(KB, {"seq_len": 1}, "NVIDIA B200")
    assert time.monotonic() - t0 < 5
    p.close()


def test_store_provider(sqlite_store: Store) -> None:
    sqlite_store.upsert_best(record(KB, {"seq_len": 64}, 9.0, config={"ROWS": 4}))
    p = StoreProvider(sqlite_store)
    assert p.best_config(KB, {"seq_len": 64}, H200) == {"ROWS": 4}
    assert p.best_config(KB, {"seq_len": 70}, H200) == {"ROWS": 4}
    assert p.best_config(KB, {"seq_len": 64}, "other") is None
    broken = StoreProvider(Store(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/x"))
    with pytest.raises(Exception):
        broken.best_config(KB, {"seq_len": 64}, H200)


def test_a_store_blip_on_the_get_kernel_path_is_not_cached_as_a_miss(sqlite_store: Store) -> None:
    """kernelsearch.get_kernel(...)(...) asks kernels.provider.lookup: a transient store error
    answers the default once, and the next call finds the record."""
    sqlite_store.upsert_best(record(KB, {"seq_len": 64}, 9.0, config={"ROWS": 4}))

    class Blip:
        def __init__(self, store: Store) -> None:
            self.store, self.fail = store, 1

        def find_best(self, *a, **k):
            if self.fail:
                self.fail -= 1
                raise ConnectionError("server closed the connection unexpectedly")
            return self.store.find_best(*a, **k)

    kprovider.set_provider(StoreProvider(Blip(sqlite_store)))  # type: ignore[arg-type]
    try:
        assert kprovider.lookup(KB, {"seq_len": 64}, H200) is None
        assert kprovider.lookup(KB, {"seq_len": 64}, H200) == {"ROWS": 4}
    finally:
        kprovider.set_provider(None)


def test_a_nearest_record_is_served_as_it_is_stored(sqlite_store: Store) -> None:
    """Another shape gets the nearest record's config unchanged: from the store, from the service
    and from what the service taught while it is down."""
    cfg = {"ROWS": 1, "TRIG": "precise"}
    sqlite_store.upsert_best(record(KB, {"seq_len": 256}, 5.0, config=cfg))
    local = StoreProvider(sqlite_store)
    assert local.best_config(KB, {"seq_len": 256}, H200) == cfg
    assert local.best_config(KB, {"seq_len": 3000}, H200) == cfg
    app = create_app(settings_for(sqlite_store.url), store=sqlite_store)
    with LiveServer(app) as s:
        remote = ServiceProvider(s.url, timeout=2)
        assert remote.best_config(KB, {"seq_len": 256}, H200) == cfg
        assert remote.best_config(KB, {"seq_len": 3000}, H200) == cfg
        s.stop()
        assert remote.best_config(KB, {"seq_len": 256}, H200) == cfg
        assert remote.best_config(KB, {"seq_len": 2000}, H200) == cfg
        remote.close()


def _kernel_b_inputs(seq_len: int) -> tuple[torch.Tensor, ...]:
    return kernels.get_kernel(KB).make_inputs({"seq_len": seq_len}, seed=0, device="cpu")


def test_kernel_call_never_fails_with_the_service_down(sqlite_url: str) -> None:
    """KS_SERVICE_URL on a dead port: the call still runs, with the local store's config."""
    from kernelsearch.db.engine import upgrade

    upgrade(sqlite_url)
    local = Store(sqlite_url)
    local.upsert_best(record(KB, {"seq_len": 2}, 9.0, device=INTERPRETER_DEVICE,
                             config={"ROWS": 2, "HEADS": 8}))
    settings = settings_for(sqlite_url, service_url=f"http://127.0.0.1:{free_port()}",
                            provider_timeout_s=0.3)
    p = install_default_provider(settings)
    assert isinstance(p, ServiceProvider) and isinstance(p.fallback, StoreProvider)
    inputs = _kernel_b_inputs(2)
    outs = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")(*inputs)
    ref = kernels.get_kernel(KB).reference(*inputs)
    for got, want in zip(outs, ref):
        assert torch.allclose(got.double(), want.double(), rtol=1e-4, atol=1e-5)
    cfg = kprovider.lookup(KB, {"seq_len": 2}, INTERPRETER_DEVICE)
    assert cfg == {"ROWS": 2, "HEADS": 8}
    local.close()


def test_kernel_call_with_nothing_reachable_uses_the_default(tmp_path) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'absent.db'}",
                            service_url=f"http://127.0.0.1:{free_port()}", provider_timeout_s=0.3)
    p = install_default_provider(settings)
    assert p.fallback is None and not (tmp_path / "absent.db").exists()
    outs = kernels.get_kernel("vision_rope3d_spatial_merge_bwd")(*_kernel_b_inputs(1))
    assert outs[0].shape == (1, 16, 128)
    assert kprovider.lookup(KB, {"seq_len": 1}, INTERPRETER_DEVICE) is None


def test_which_config_says_what_a_get_kernel_call_runs(sqlite_store: Store) -> None:
    kdef = kernels.get_kernel(KB)
    kprovider.set_provider(StoreProvider(sqlite_store))
    try:
        assert kdef.which_config({"seq_len": 64}, "cpu") == (kdef.default_config, "default")
        sqlite_store.upsert_best(record(KB, {"seq_len": 64}, 9.0, device=INTERPRETER_DEVICE,
                                        config={**kdef.default_config, "ROWS": 2, "HEADS": 8}))
        kprovider.clear_cache()
        config, source = kdef.which_config({"seq_len": 64}, "cpu")
        assert source == "record" and (config["ROWS"], config["HEADS"]) == (2, 8)
    finally:
        kprovider.set_provider(None)
