"""A user's program: the example's decorated matmul called as the tutorial calls it.

Prints one JSON line per call: where the config came from, the config, the relative error.
With --wait, after the first call it reads a line from stdin, then calls until the config comes
from the service (or 120 s pass)."""
import json
import sys
import time

import torch
from ks_matmul_example import matmul, matmul_kernel

from kernelsearch.kernels.configs import canonical as config_dict

M, N, K = (int(v) for v in sys.argv[1:4])
gen = torch.Generator().manual_seed(0)
a = torch.randn(M, K, generator=gen).half()
b = torch.randn(K, N, generator=gen).half()
ref = a.double() @ b.double()


def call() -> str:
    """One call; what it ran is read before the call returns to here, since a late lookup may
    replace the key's config (for the next call) at any moment."""
    c = matmul(a, b)
    used = matmul_kernel.best_config
    (key,) = matmul_kernel.sources
    config, source = matmul_kernel.resolved(key)
    if config is not used:
        source = "replaced after the call"
    err = float((c.double() - ref).norm() / ref.norm())
    print(json.dumps({"source": source if isinstance(source, str) else source.value,
                      "config": config_dict(used), "rel_error": err}), flush=True)
    return source if isinstance(source, str) else source.value


call()
if "--wait" in sys.argv:
    sys.stdin.readline()
    deadline = time.monotonic() + 120
    while call() != "service" and time.monotonic() < deadline:
        time.sleep(0.2)
