"""A worker stores the compiled kernel of every record and Helion entry it stores: the compile
group its child compiled for the winning config (`TrialOutcome.compiled`, `TunedEntry.compiled`),
read from this host's Triton cache and stored content-addressed beside the record or entry
(`db.repos.artifacts`)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kernelsearch.db.errors import LeaseLost
from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.kernels.compiled import LAUNCHER_SUFFIX, env_fingerprint, read_group, refusal

log = logging.getLogger(__name__)


def store_compiled(store: Any, record_id: int, ref: Mapping[str, Any] | None) -> bool:
    """Store the group `ref` names beside record `record_id`; False (logged) when there is
    none (the interpreter), the cache no longer holds it, or a file may not be stored. Never
    raises: the record stands without it, and hosts compile it as before."""
    return _store(f"record {record_id}", ref, lambda **kw: store.put_artifacts(record_id, **kw))


def store_helion_compiled(store: Any, helion_key: str, ref: Mapping[str, Any] | None) -> bool:
    """`store_compiled` for the Helion entry under `helion_key`: the compile group of the
    Triton kernel Helion generated for the tuned config, as the worker's child compiled it."""
    return _store(f"helion entry {helion_key[:12]}", ref,
                  lambda **kw: store.put_helion_artifacts(helion_key, **kw))


def _store(what: str, ref: Mapping[str, Any] | None, put: Callable[..., Any]) -> bool:
    if not ref:
        return False
    try:
        files = read_group(str(ref["cache_key"]), str(ref["group"]))
        if files is None:
            log.info("%s: its compile group is no longer in this host's Triton cache", what)
            return False
        if ref.get("launcher"):
            files[str(ref["group"])[: -len(".json")] + LAUNCHER_SUFFIX] = str(ref["launcher"]).encode()
        bad = [why for n, d in files.items() if (why := refusal(n, d))]
        if bad:
            log.warning("%s: compile group not stored: %s", what, bad[0])
            return False
        env = dict(ref["env"])
        put(cache_key=str(ref["cache_key"]), env=env, env_fingerprint=env_fingerprint(env),
            group=str(ref["group"]), files=files, origin=RecordOrigin.WORKER.value)
        return True
    except LeaseLost:
        raise  # the job is another worker's now: nothing more is written for it
    except Exception as exc:
        log.warning("%s: compile group not stored: %s", what, exc)
        return False
