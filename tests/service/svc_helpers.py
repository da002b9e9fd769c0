"""Helpers shared by the service tests (named uniquely: test folders are not packages)."""
from __future__ import annotations

from typing import Any, Callable

from kernelsearch import kernels
from kernelsearch.db.views import RecordIn
from kernelsearch.kernels.device import versions
from kernelsearch.service.settings import Settings

KA = "vision_rope_generation_bwd"
KB = "vision_rope3d_spatial_merge_bwd"
H200 = "NVIDIA H200"


def settings_for(url: str, **kw: Any) -> Settings:
    """Settings for a test: its database, fast checks, no token unless given, and /v1/best's time
    bound wide (on a loaded 2-core machine a PostgreSQL lookup can pass the default second and
    answer 503 where a test asks what is served; the bound's own tests set it)."""
    base = dict(database_url=url, api_token=None, records_check_seconds=0.05,
                heartbeat_seconds=0.5, lease_seconds=60.0, worker_poll_seconds=0.1, measure_n=2,
                trial_timeout_s=120.0, service_url=None, lookup_timeout_s=15.0)
    base.update(kw)
    return Settings(**base)


def record(kernel: str, axes: dict[str, int], latency_us: float, device: str = H200,
           **kw: Any) -> RecordIn:
    """A plausible record as the tuner would store it, with this code's versions."""
    k = kernels.get_kernel(kernel)
    v = versions()
    fields: dict[str, Any] = dict(
        kernel=kernel, axes=axes, work=float(k.bytes_moved(axes)), device=device,
        torch_version=v["torch"], triton_version=v["triton"], source_hash=k.source_hash,
        config=k.default_config, latency_median_us=latency_us, latency_min_us=latency_us * 0.95,
        latency_max_us=latency_us * 1.1, latency_iqr_us=latency_us * 0.02, timing_method="cupti",
        rel_error=1e-7, n_trials=10, n_failed=1, roofline_pct=50.0, speedup_eager=20.0,
        speedup_compile=5.0, study_name=f"{kernel}-test", device_info={"name": device})
    fields.update(kw)
    return RecordIn(**fields)


def free_port() -> int:
    """A port nothing listens on right now (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """A real uvicorn server for an app, in a thread on 127.0.0.1; stops on exit."""

    def __init__(self, app: Any) -> None:
        import threading

        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    def __enter__(self) -> "LiveServer":
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.stop()


CUDA_PROBES = ("is_available", "device_count", "current_device", "init", "_lazy_init")


def spy_cuda_probes(monkeypatch: Any, counting: Callable[[], bool] = lambda: True) -> list[str]:
    """Every CUDA question this process asks torch from now on (while `counting()` says so), by
    name: a worker that asks one marks every child it forks unable to use CUDA."""
    import torch

    probes: list[str] = []

    def spy(name: str, real: Any) -> Any:
        def probe(*args: Any, **kwargs: Any) -> Any:
            if counting():
                probes.append(name)
            return real(*args, **kwargs)
        return probe

    for name in CUDA_PROBES:
        monkeypatch.setattr(torch.cuda, name, spy(name, getattr(torch.cuda, name)))
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", spy("_cuda_getDeviceCount", lambda: 0),
                        raising=False)
    return probes

