"""What a user's environment does to @kernelsearch.autotune: a bad KS_AUTOTUNE_* value is one
warning and its default (kernelsearch stays on), and a server-only setting changes nothing."""
from __future__ import annotations

import logging

import pytest
import torch
from ks_at_helpers import KERNEL, accumulate, accumulate_kernel

from kernelsearch import backends, options
from kernelsearch.kernels.configs import canonical
from kernelsearch.options import Source

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for k in ("KS_SERVICE_URL", "KS_AUTOTUNE_SYNC"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("KS_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    backends.BACKENDS.reset()
    accumulate_kernel.forget()


TYPOS = [  # (variable, bad value, words of what it accepts, the default used)
    ("KS_AUTOTUNE_FALLBACK", "frist", "one of tune, first, nearest", "'tune'"),
    ("KS_AUTOTUNE_TIMEOUT_S", "abc", "a number >= 0", "0.25"),
    ("KS_AUTOTUNE_TIMEOUT_S", "-1", "a number >= 0", "0.25"),
    ("KS_AUTOTUNE_RETRY_S", "never", "a number >= 0", "30.0"),
    ("KS_AUTOTUNE_SYNC", "bcast", "one of none, broadcast", "'none'"),
]


@pytest.mark.parametrize(("var", "value", "accepted", "used"), TYPOS)
def test_a_bad_value_is_one_line_and_its_default_is_used(at_store, monkeypatch, caplog,
                                                         var, value, accepted, used) -> None:
    """The record in the local store is still found (lookups go on), the miss of another key
    still queues its job (sharing goes on), and the warning says all a user needs to fix it."""
    from svc_like import put_record

    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv(var, value)
    if var != "KS_AUTOTUNE_FALLBACK":
        monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    second = KERNEL.space_configs[1]
    put_record(at_store, KERNEL, {"n": 100}, second)
    with caplog.at_level(logging.WARNING):
        opts = options.Options.from_env()
        accumulate(torch.randn(100))
        if var != "KS_AUTOTUNE_FALLBACK":
            accumulate(torch.randn(300))
        backends.BACKENDS.drain(30)
    lines = [r.getMessage() for r in caplog.records if var in r.getMessage()]
    assert lines == [f"{var}={value!r} is not accepted (accepted: {accepted}); using the "
                     f"default, {used}"]
    assert "not prepared" not in caplog.text and "validation error" not in caplog.text
    field = var.removeprefix("KS_AUTOTUNE_").lower()
    got = {"fallback": opts.fallback.value, "timeout_s": opts.timeout_s,
           "retry_s": opts.retry_s, "sync": opts.sync.value}[field]
    assert repr(got) == used
    assert list(accumulate_kernel.sources.values())[0] is Source.STORE
    assert canonical(list(accumulate_kernel.cache.values())[0]) == second
    if var != "KS_AUTOTUNE_FALLBACK":
        assert [j.cases for j in at_store.list_jobs()] == [[{"n": 300}]]


@pytest.mark.parametrize("server_env", [{}, {"KS_LEASE_SECONDS": "5"}, {"KS_LOOKUP_TIMEOUT_S": "0"}])
def test_a_server_only_setting_does_not_change_the_queued_jobs(at_store, monkeypatch, caplog,
                                                               server_env) -> None:
    """A user's program reads the client's settings only: a value the server would refuse
    (a lease shorter than three heartbeats) neither stops nor changes the job a miss queues."""
    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    for k, v in server_env.items():
        monkeypatch.setenv(k, v)
    accumulate(torch.randn(100))
    backends.BACKENDS.drain(30)
    assert [(j.kernel, j.cases, j.sampler, j.n_trials) for j in at_store.list_jobs()] == \
        [("ks_test_accumulate", [{"n": 100}], "grid", 3)]
    assert "KS_LEASE_SECONDS" not in caplog.text and "KS_LOOKUP_TIMEOUT_S" not in caplog.text
