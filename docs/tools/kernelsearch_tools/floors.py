"""What the timing protocol itself costs: an empty kernel and a plain copy of each case's bytes.

The roofline (bytes over the 1 GiB copy bandwidth) leaves out the fixed costs every timed call
pays after the L2 flush: the kernel's start and end, the first DRAM round trip, the write-back
of the flush's dirty lines. A device-to-device copy moving exactly a case's bytes (half read,
half written) is a kernel with no arithmetic and perfect access patterns; timed in the same
profiler session as the kernel's own config it splits the gap to the roofline into what any
kernel pays and what ours adds. `python -m kernelsearch_tools.floors -h`.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch
import triton


@triton.jit
def _ks_empty():
    pass


def floors_for(kernel: Any, axes: dict[str, int], config: dict[str, Any] | None, *,
               n: int = 30) -> dict[str, Any]:
    """Median-based timings of empty kernel, copy of the case's bytes and the kernel, one session."""
    from kernelsearch.kernels.measure import time_calls

    dev = torch.device("cuda")
    nbytes = kernel.bytes_moved(axes)
    src = torch.empty(max(1, nbytes // 8), dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    cfg = kernel.validate_config(config or kernel.default_config)
    inputs = kernel.make_inputs(axes, seed=0, distribution="benchmark", device=dev)
    fns = [lambda: _ks_empty[(1,)](), lambda: dst.copy_(src),
           lambda: kernel.launch(*inputs, config=cfg)]
    t_empty, t_copy, t_kernel = time_calls(fns, n=n, device=dev)
    return {"axes": axes, "bytes": nbytes, "config": cfg,
            "empty": t_empty.as_dict(), "copy": t_copy.as_dict(), "kernel": t_kernel.as_dict()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--kernel", action="append", help="kernel (repeatable); all when omitted")
    ap.add_argument("--n", type=int, default=30, help="timed calls per item")
    a = ap.parse_args(argv)
    from kernelsearch.kernels import all_kernels
    from kernelsearch.kernels.device import device_info, versions
    from kernelsearch.kernels.measure import copy_bandwidth

    if not torch.cuda.is_available():
        print("kernelsearch_tools.floors: needs a GPU", file=sys.stderr)
        return 2
    bw = copy_bandwidth()
    result: dict[str, Any] = {"device": device_info(), "versions": versions(),
                              "copy_bandwidth_Bps": bw, "kernels": {}}
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    print(f"{'kernel':<32} {'case axes':<24} {'roof':>7} {'empty':>7} {'copy':>7} {'kernel':>7}  [us]")
    for kname in a.kernel or sorted(all_kernels()):
        k = all_kernels()[kname]
        rows = []
        for c in k.cases:
            r = floors_for(k, dict(c.axes), None, n=a.n)
            r["case"] = c.number
            r["roofline_us"] = r["bytes"] / bw * 1e6
            rows.append(r)
            ax = " ".join(f"{key}={v}" for key, v in c.axes.items())
            print(f"{kname:<32} {c.number:>3} {ax:<20} {r['roofline_us']:7.2f} "
                  f"{r['empty']['median_us']:7.2f} {r['copy']['median_us']:7.2f} "
                  f"{r['kernel']['median_us']:7.2f}", flush=True)
        result["kernels"][kname] = rows
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
