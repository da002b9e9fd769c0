"""Helpers the search-space tests import by name (a conftest is not importable by name: with
several test folders collected together, `conftest` is whichever folder's came first)."""
from __future__ import annotations

from pathlib import Path

import ks_fake_kernels

from kernelsearch.search_space.space import SearchSpace

HERE = Path(__file__).resolve().parent
FAKE = ks_fake_kernels.NAME

# Compile-pool size of the tests' runners. The default (a worker per core but one) is 0 under the
# interpreter but 15 per runner on the 16-core GPU host, where pytest-xdist runs several runners
# at once (a module's, the crash test's, the killed tuner's): 60+ processes importing torch and
# creating CUDA contexts on 16 cores. Two workers still exercise the pool there.
TEST_COMPILE_WORKERS = 2


def fake_space(modes=("ok",), blocks=(16, 32)) -> SearchSpace:
    return SearchSpace.from_dict({
        "kernel": FAKE,
        "param": [{"name": "MODE", "choices": list(modes)},
                  {"name": "BLOCK", "choices": list(blocks), "ordinal": True}],
    }, ks_fake_kernels.KERNEL)
