"""Fault tests run the deployment's real processes: reuse the deploy tests' process helpers and
the tuner tests' misbehaving kernel (both live beside this folder)."""
from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
for sub in ("deploy", "search_space"):
    p = str(TESTS / sub)
    if p not in sys.path:
        sys.path.append(p)
