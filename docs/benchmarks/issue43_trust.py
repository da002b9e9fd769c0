"""Compiled kernels a host can trust, on the GPU: after `gpu.sh loop` stored real compile groups
(a worker's and the first hosts'), two records of different kernels, A and B, are taken from the
service and:

  upload      B's real group (its cubin, its metadata) posted as record A's: the service refuses
              it (422: the cubin compiles another kernel than A's)
  relabel     a fresh host (fresh Triton cache) handed B's group labelled as A's set (record,
              kernel, config), as a hostile or stale answer would: not installed, nothing written
  other-key   the same host asking for A's cache key and answered with B's set: dropped
  own         A's own set: installed (its cubin then in the cache under A's key)

The kernels' modules are imported (through the swap) first, so the host knows A's Triton
functions, as a user's program that runs A does. One line per check.

    python3 issue43_trust.py --service URL --lib flaggems
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from typing import Any


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()[:300]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()[:300]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service", required=True)
    ap.add_argument("--lib", default="flaggems")
    a = ap.parse_args()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ks43-")
    import triton

    import kernelsearch

    triton.autotune = kernelsearch.autotune
    if a.lib == "flaggems":  # registers the kernels (their Triton functions) in this process
        import flag_gems.fused.moe_sum  # noqa: F401
        import flag_gems.ops.layernorm  # noqa: F401
        import flag_gems.ops.rms_norm  # noqa: F401
        import flag_gems.ops.softmax  # noqa: F401
    from kernelsearch import artifacts
    from kernelsearch.kernels import compiled

    svc = a.service.rstrip("/")
    fp = compiled.fingerprint()
    sets: dict[str, dict] = {}
    for rec in _get(f"{svc}/v1/records"):
        got = _get(f"{svc}/v1/artifacts?record_id={rec['id']}&env_fingerprint={fp}")
        if got and rec["kernel"] not in sets:
            sets[rec["kernel"]] = got[0]
    if len(sets) < 2:
        print(f"trust: FAILED  fewer than two kernels with compile groups in the store ({sorted(sets)})")
        return 1
    (ka, sa), (kb, sb) = list(sets.items())[:2]
    ok = True

    def line(name: str, passed: bool, text: str) -> None:
        nonlocal ok
        ok = ok and passed
        print(f"trust {name:10} {'passed' if passed else 'FAILED'}  {text}", flush=True)

    status, text = _post(f"{svc}/v1/artifacts", {
        "record_id": sa["record_id"], "cache_key": sb["cache_key"], "group": sb["group"],
        "env": compiled.environment(), "files": {n: f["data"] for n, f in sb["files"].items()}})
    line("upload", status == 422, f"{kb.rsplit('.', 1)[-1]}'s group posted as record {sa['record_id']} "
         f"({ka.rsplit('.', 1)[-1]}): {status} {text}")

    relabelled = {**sb, "record_id": sa["record_id"], "kernel": sa["kernel"], "config": sa["config"]}
    n = artifacts.install([relabelled], record_id=sa["record_id"])
    written = compiled.read_group(sb["cache_key"], sb["group"])
    line("relabel", n == 0 and written is None,
         f"{kb.rsplit('.', 1)[-1]}'s cubin labelled as {ka.rsplit('.', 1)[-1]}'s set: installed {n}, "
         f"in the cache: {written is not None}, rejected {artifacts.STATS.rejected}")

    n = artifacts.install([sb], cache_key=sa["cache_key"])
    line("other-key", n == 0 and compiled.read_group(sb["cache_key"], sb["group"]) is None,
         f"asked for {sa['cache_key'][:12]}, answered {sb['cache_key'][:12]}: installed {n}")

    n = artifacts.install([sa], cache_key=sa["cache_key"])
    line("own", n == 1 and compiled.read_group(sa["cache_key"], sa["group"]) is not None,
         f"{ka.rsplit('.', 1)[-1]}'s own set: installed {n}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
