"""A user's program that changes no library code: `triton.autotune = kernelsearch.autotune`
before importing the library (`ks_plain_lib`), then calls one of its kernels.

    ks_swap_user.py triple|plus_one|quarter N"""
from __future__ import annotations

import json
import sys
import time

import torch
import triton

import kernelsearch

triton.autotune = kernelsearch.autotune

import ks_plain_lib  # noqa: E402  (after the swap: its kernels are kernelsearch's)

from at_env import BENCHED  # noqa: E402
from kernelsearch.backends import BACKENDS  # noqa: E402

if __name__ == "__main__":
    op, n = sys.argv[1], int(sys.argv[2])
    x = torch.randn(n)
    want = {"triple": 3 * x, "plus_one": x + 1, "quarter": x / 4}[op]
    torch.testing.assert_close(getattr(ks_plain_lib, op)(x), want)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not BACKENDS.idle():
        time.sleep(0.05)
    tuner = {"triple": ks_plain_lib.triple_kernel, "plus_one": ks_plain_lib.one_block_kernel,
             "quarter": ks_plain_lib.quarter_kernel.fn}[op]
    print(json.dumps({"sources": [s.value for s in tuner.sources.values()],
                      "benched": len(BENCHED), "best": tuner.best_config.kwargs["BLOCK"],
                      "reached_by": tuner.undeclared.definition.reached_by.value}))
