"""A user's `@triton.autotune` kernel whose key leaves the size out (calls of several sizes share
a key), and a config beyond its list that is right only on small calls: `LIMIT` caps the
elements it writes, so it matches the first listed config on a call of at most LIMIT elements
and not on a larger one of the same key (the strict gate's edge test). Its block is eight times
the list's, so the interpreter runs it faster on a small call than the list's config whatever the
machine's load: the search asks the strict gate only about configs faster than the list."""
from __future__ import annotations

import triton
import triton.language as tl

import kernelsearch

CONFIGS = [triton.Config({"BLOCK": 16, "LIMIT": 1 << 20}, num_warps=1)]
# Beyond the list: right on calls of at most 128 elements only.
BEYOND = [triton.Config({"BLOCK": 128, "LIMIT": 128}, num_warps=1)]


@kernelsearch.autotune(configs=CONFIGS, key=["s"], search_space=BEYOND)
@triton.jit
def capped_scale_kernel(x_ptr, y_ptr, n, s, BLOCK: tl.constexpr, LIMIT: tl.constexpr):
    """y = s x (for the first LIMIT elements)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = (offs < n) & (offs < LIMIT)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * s, mask=m)
