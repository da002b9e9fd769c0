"""A worker stores the compiled kernel of every record it stores: the compile group its trial
child compiled for the winning config (`TrialOutcome.compiled`), read from this host's Triton
cache and stored content-addressed beside the record (`db.repos.artifacts`)."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.kernels.compiled import LAUNCHER_SUFFIX, env_fingerprint, read_group, refusal

log = logging.getLogger(__name__)


def store_compiled(store: Any, record_id: int, ref: Mapping[str, Any] | None) -> bool:
    """Store the group `ref` names beside record `record_id`; False (logged) when there is
    none (the interpreter), the cache no longer holds it, or a file may not be stored. Never
    raises: the record stands without it, and hosts compile it as before."""
    if not ref:
        return False
    try:
        files = read_group(str(ref["cache_key"]), str(ref["group"]))
        if files is None:
            log.info("record %s: its compile group is no longer in this host's Triton cache", record_id)
            return False
        if ref.get("launcher"):
            files[str(ref["group"])[: -len(".json")] + LAUNCHER_SUFFIX] = str(ref["launcher"]).encode()
        bad = [why for n, d in files.items() if (why := refusal(n, d))]
        if bad:
            log.warning("record %s: compile group not stored: %s", record_id, bad[0])
            return False
        env = dict(ref["env"])
        store.put_artifacts(record_id, cache_key=str(ref["cache_key"]), env=env,
                            env_fingerprint=env_fingerprint(env), group=str(ref["group"]),
                            files=files, origin=RecordOrigin.WORKER.value)
        return True
    except Exception as exc:
        log.warning("record %s: compile group not stored: %s", record_id, exc)
        return False
