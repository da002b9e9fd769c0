"""A library reached unchanged (its module keeps `@triton.autotune`; the user's program swaps
`triton.autotune` for `kernelsearch.autotune`): a worker importing the module as shipped wraps
its plain autotuner as the swap did, tunes the captured call and stores the record a fresh
process is served."""
from __future__ import annotations

import pytest
from at_env import child_env, run_user
from svc_helpers import LiveServer, settings_for

from kernelsearch.service.api import create_app
from kernelsearch.service.worker import Worker

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("isolated_client")]
MODULES = ["ks_plain_lib"]


def _job_through_worker(store, settings, op: str, n: int) -> tuple[dict, object, object]:
    """The user's program misses under KS_AUTOTUNE_FALLBACK=first, a worker runs its job; the
    program's answer, the job, and its record."""
    with LiveServer(create_app(settings, store=store)) as srv:
        env = child_env(KS_SERVICE_URL=srv.url, KS_AUTOTUNE_FALLBACK="first",
                        KS_AUTOTUNE_TIMEOUT_S="60")
        first = run_user("ks_swap_user.py", op, n, env=env)
        (job,) = store.list_jobs()
        worker = Worker(settings, store)
        try:
            assert worker.run_one() is True
        finally:
            worker.close()
        done = store.get_job(job.id)
        assert done.status == "succeeded", done.error
        (rec,) = store.list_records(kernel=job.kernel)
        second = run_user("ks_swap_user.py", op, n, env=env)
    return {"first": first, "second": second}, done, rec


def test_a_plain_triton_autotune_kernel_reached_by_the_swap_is_tuned_by_a_worker(
        sqlite_store) -> None:
    settings = settings_for(sqlite_store.url, tune_reference="none", job_modules=MODULES)
    got, job, rec = _job_through_worker(sqlite_store, settings, "triple", 100)
    assert got["first"] == {"sources": ["first"], "benched": 0, "best": 16, "reached_by": "swap"}
    assert job.kernel == "ks_plain_lib.triple_kernel"
    assert sqlite_store.kernel_definitions()[job.kernel]["reached_by"] == "swap"
    assert len(rec.config_timings) == 2 and all(v is not None for v in rec.config_timings.values())
    assert got["second"]["sources"] == ["service"] and got["second"]["benched"] == 0

