"""The sweep's candidates come from the kernel's declaration, for any registered kernel."""
from __future__ import annotations

import json
from pathlib import Path

from kernelsearch.kernels import get_kernel
from kernelsearch_tools.explore import candidates

from ss_helpers import FAKE

ROOT = Path(__file__).resolve().parents[2]


def test_a_plugin_kernel_gets_candidates_from_its_parameters():
    k = get_kernel(FAKE)
    got = candidates(FAKE, 10, seed=0)
    assert got[0] == k.default_config
    keys = {json.dumps(c, sort_keys=True) for c in got}
    assert len(keys) == len(got) > 5  # distinct configs beyond the default
    assert all(k.validate_config(c) == c for c in got)
    assert {c["MODE"] for c in got} <= set(k.param("MODE").choices)


def test_a_grid_file_replaces_the_draws():
    spec = json.loads((ROOT / "docs/benchmarks/explore_grid.json").read_text())
    name = "vision_rope3d_spatial_merge_bwd"
    got = candidates(name, 400, seed=0, spec=spec[name])
    assert len(got) > 100 and {c["HEADS"] for c in got[1:]} <= {4, 8, 16}
