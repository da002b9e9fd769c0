"""Issue 14 on the H200: what the timing protocol lets any kernel reach, next to A and B.

    python3 docs/benchmarks/issue14_floors.py --out DIR [--n 30] [--records FILE.json] [--smoke]

The protocol flushes the L2 before every timed call by *writing* twice its size, so each call
starts with an L2 full of dirty lines that the call's own traffic must write back to DRAM. For
every size it times, in one profiler session per size and flush kind:
- A (`vision_rope_generation_bwd`): its shipped record's config (suite cases) or the best of a
  few large-input configs, a pure-read kernel of exactly A's bytes (the floor for any kernel that
  must read them), and the same read with a grid-wide ticket (the floor for any single-launch
  cross-program sum);
- B (`vision_rope3d_spatial_merge_bwd`): the nearest shipped record's config, its default, and a
  device copy of exactly B's bytes (half read, half written);
each under the benchmark's write flush and under a read flush (the same size read, which evicts
as well but leaves no dirty line), so the part of the gap to the roofline that is the flush's
write-back shows by difference. Writes DIR/floors.json and prints the tables.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import triton
import triton.language as tl

try:
    from kernelsearch import kernels
    from kernelsearch.kernels import measure
    from kernelsearch.kernels.measure import copy_bandwidth, time_calls
except ImportError as exc:  # pragma: no cover - a message instead of a traceback
    sys.exit(f"issue14_floors: install kernelsearch first (pip install -e .): {exc}")

A_NAME = "vision_rope_generation_bwd"
B_NAME = "vision_rope3d_spatial_merge_bwd"
A_SIZES = (65536, 262144, 1048576, 4194304)
B_SIZES = (8192, 16384, 32768)
A_LARGE_CONFIGS = (
    {"BLOCK_P": 128, "GRID": "persistent", "PROGRAMS_PER_SM": 2, "COLS": "split64", "num_warps": 8},
    {"BLOCK_P": 64, "GRID": "persistent", "PROGRAMS_PER_SM": 4, "COLS": "split64", "num_warps": 4},
    {"BLOCK_P": 32, "COLS": "split64"},
)
READ_VARIANTS = ((256, 1), (512, 2), (1024, 4), (2048, 4), (4096, 8), (8192, 8), (16384, 16))


@triton.jit
def _ks_read_floor(a_ptr, b_ptr, c_ptr, d_ptr, out_ptr, counter_ptr, n_abc, n_d,
                   BLOCK: tl.constexpr, TICKET: tl.constexpr):
    """Read a contiguous BLOCK of each input (the fourth, pos_ids, in proportion), keep a sum."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n_abc
    s = tl.load(a_ptr + offs, mask=m, other=0.0) + tl.load(b_ptr + offs, mask=m, other=0.0)
    s += tl.load(c_ptr + offs, mask=m, other=0.0)
    # pos_ids: 16 bytes a patch against 288 per input row; its share of this program's rows.
    d_blk: tl.constexpr = BLOCK // 16
    offs_d = pid * d_blk + tl.arange(0, d_blk)
    d = tl.load(d_ptr + offs_d, mask=offs_d < n_d, other=0).to(tl.float32)
    total = tl.sum(s, axis=0) + tl.sum(d, axis=0)
    if TICKET == "relaxed":
        # The partial travels in the atomic itself (as A's hybrid sum's digits do): no fence.
        ticket = tl.atomic_add(counter_ptr, 1, sem="relaxed", scope="gpu")
        if ticket == tl.num_programs(0) - 1:
            tl.store(out_ptr + tl.num_programs(0), total)
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    elif TICKET == "acq_rel":
        tl.store(out_ptr + pid, total)
        ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(0) - 1:
            tl.store(out_ptr + tl.num_programs(0), total)
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(out_ptr + pid, total)


@triton.jit
def _ks_l2_flush_read(ptr, out_ptr, n, BLOCK: tl.constexpr):
    """The flush's size read instead of written: it evicts the L2 and leaves no dirty line.
    (Its name carries measure's flush marker, so the profiler's records split at it.)"""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(v, axis=0))


class ReadFlush:
    """measure's flush replaced by a read of the same size, inside a `with`."""

    def __init__(self, device: torch.device) -> None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
        self.buf = torch.ones(2 * l2 // 4, dtype=torch.float32, device=device)
        self.out = torch.empty(triton.cdiv(self.buf.numel(), 8192), dtype=torch.float32,
                               device=device)
        self._saved: Callable[..., None] | None = None

    def flush(self, device: torch.device, i: int) -> None:
        n = self.buf.numel()
        _ks_l2_flush_read[(triton.cdiv(n, 8192),)](self.buf, self.out, n, BLOCK=8192, num_warps=8)

    def __enter__(self) -> "ReadFlush":
        self._saved = measure._flush
        measure._flush = self.flush
        return self

    def __exit__(self, *exc: object) -> None:
        measure._flush = self._saved


def read_floor_fns(inputs: tuple[torch.Tensor, ...], device: torch.device, ticket: str
                   ) -> list[tuple[str, Callable[[], Any]]]:
    """`ticket`: "none", "acq_rel" (partials stored, then a fenced ticket) or "relaxed"."""
    gc, gs, pos, _inv, emb = inputs
    n_abc = emb.numel()
    out = torch.empty(triton.cdiv(n_abc, min(b for b, _ in READ_VARIANTS)) + 1, dtype=torch.float32,
                      device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    fns = []
    for block, nw in READ_VARIANTS:
        grid = (triton.cdiv(n_abc, block),)
        name = {"none": "read", "acq_rel": "read+ticket", "relaxed": "read+relaxed"}[ticket]
        fns.append((f"{name} BLOCK={block} nw={nw}",
                    lambda grid=grid, block=block, nw=nw: _ks_read_floor[grid](
                        gc, gs, emb, pos, out, counter, n_abc, pos.numel(), BLOCK=block,
                        TICKET=ticket, num_warps=nw)))
    return fns


def _time(fns: list[tuple[str, Callable[[], Any]]], n: int, device: torch.device,
          flush: str) -> dict[str, dict[str, float]]:
    for _, f in fns:  # compile outside the session
        f()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if flush == "read" and device.type == "cuda":
        with ReadFlush(device):
            ts = time_calls([f for _, f in fns], n=n, device=device)
    else:
        ts = time_calls([f for _, f in fns], n=n, device=device)
    return {lab: {"median_us": t.median_us, "iqr_us": t.iqr_us, "min_us": t.min_us}
            for (lab, _), t in zip(fns, ts)}


def _best(rows: dict[str, dict[str, float]], prefix: str) -> tuple[str, float]:
    cands = [(lab, r["median_us"]) for lab, r in rows.items() if lab.startswith(prefix)]
    return min(cands, key=lambda kv: kv[1])


def a_rows(kdef: Any, axes: dict[str, int], configs: list[dict[str, Any]], n: int,
           device: torch.device, bw: float, flushes: tuple[str, ...]) -> dict[str, Any]:
    inputs = kdef.make_inputs(axes, seed=0, distribution="benchmark", device=device)
    fns: list[tuple[str, Callable[[], Any]]] = []
    for i, cfg in enumerate(configs):
        full = kdef.validate_config(cfg)
        fns.append((f"A#{i}", lambda full=full: kdef.launch(*inputs, config=full)))
    fns += [f for t in ("none", "acq_rel", "relaxed") for f in read_floor_fns(inputs, device, t)]
    roof = kdef.bytes_moved(axes) / bw * 1e6
    out: dict[str, Any] = {"axes": axes, "roofline_us": roof, "configs": configs}
    for flush in flushes:
        rows = _time(fns, n, device, flush)
        a_lab, a_us = _best(rows, "A#")
        r_lab, r_us = _best(rows, "read BLOCK")
        t_lab, t_us = _best(rows, "read+ticket")
        x_lab, x_us = _best(rows, "read+relaxed")
        out[flush] = {"rows": rows, "A_us": a_us, "A_config": configs[int(a_lab[2:])],
                      "read_us": r_us, "read_label": r_lab, "ticket_us": t_us, "ticket_label": t_lab,
                      "relaxed_us": x_us, "relaxed_label": x_lab}
    return out


def b_rows(kdef: Any, axes: dict[str, int], configs: list[dict[str, Any]], n: int,
           device: torch.device, bw: float, flushes: tuple[str, ...]) -> dict[str, Any]:
    inputs = kdef.make_inputs(axes, seed=0, distribution="benchmark", device=device)
    nbytes = kdef.bytes_moved(axes)
    src = torch.empty(nbytes // 8, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    fns: list[tuple[str, Callable[[], Any]]] = [("copy", lambda: dst.copy_(src))]
    for i, cfg in enumerate(configs):
        full = kdef.validate_config(cfg)
        fns.append((f"B#{i}", lambda full=full: kdef.launch(*inputs, config=full)))
    roof = nbytes / bw * 1e6
    out: dict[str, Any] = {"axes": axes, "roofline_us": roof, "configs": configs}
    for flush in flushes:
        rows = _time(fns, n, device, flush)
        b_lab, b_us = _best(rows, "B#")
        out[flush] = {"rows": rows, "B_us": b_us, "B_config": configs[int(b_lab[2:])],
                      "copy_us": rows["copy"]["median_us"]}
    return out


def _records(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    doc = json.loads(path.read_text())
    return [r for r in doc.get("records", []) if r.get("is_current", True)]


def _nearest(kdef: Any, recs: list[dict[str, Any]], axes: dict[str, int]) -> dict[str, Any] | None:
    mine = [r for r in recs if r["kernel"] == kdef.name]
    if not mine:
        return None
    return min(mine, key=lambda r: kdef.distance(axes, r["axes"]))["config"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--n", type=int, default=30, help="timed calls per variant (median)")
    ap.add_argument("--records", type=Path, default=Path("service/data/h200_records.json"))
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes under the Triton interpreter (checks the script, times nothing real)")
    args = ap.parse_args(argv)
    if args.smoke:
        device = torch.device("cpu")
        a_sizes, b_sizes, n, flushes, bw = (512,), (16,), 2, ("write",), 4e12
        suite_cases: list[Any] = sorted(kernels.get_kernel(A_NAME).cases,
                                        key=lambda c: c.axes["total_patches"])[:1]
    elif not torch.cuda.is_available():
        print("issue14_floors: needs a GPU (or --smoke under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
        a_sizes, b_sizes, n, flushes = A_SIZES, B_SIZES, args.n, ("write", "read")
        bw = copy_bandwidth(device)
        suite_cases = list(kernels.get_kernel(A_NAME).cases)
    args.out.mkdir(parents=True, exist_ok=True)
    ka, kb = kernels.get_kernel(A_NAME), kernels.get_kernel(B_NAME)
    recs = _records(args.records)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                              "copy_bandwidth_Bps": bw, "n": n, "A_suite": [], "A_large": [],
                              "B_large": []}
    t0 = time.time()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s; flushes: {', '.join(flushes)}")

    print("\n== A, suite cases (us): the shipped record, a pure read of its bytes, the read with a "
          "fenced ticket, with a relaxed one")
    head = f"{'flush':>5} {'A':>7} {'read':>7} {'+ticket':>7} {'+relax':>7}"
    print(f"{'patches':>8} {'roof':>6} | " + " | ".join([head] * len(flushes)))
    for c in suite_cases:
        axes = dict(c.axes)
        cfg = _nearest(ka, recs, axes) or {}
        r = a_rows(ka, axes, [cfg], n, device, bw, flushes)
        result["A_suite"].append(r)
        cells = " | ".join(f"{f:>5} {r[f]['A_us']:7.2f} {r[f]['read_us']:7.2f} {r[f]['ticket_us']:7.2f} "
                           f"{r[f]['relaxed_us']:7.2f}" for f in flushes)
        print(f"{axes['total_patches']:8d} {r['roofline_us']:6.2f} | {cells}")
    for f in flushes:
        rows = [r[f] for r in result["A_suite"]]
        keys = ("A_us", "read_us", "ticket_us", "relaxed_us")
        means = {k: statistics.fmean(x[k] for x in rows) for k in keys}
        result[f"A_suite_means_{f}"] = means
        print(f"suite means, {f} flush: A {means['A_us']:.3f} us, read floor {means['read_us']:.3f}, "
              f"read + fenced ticket {means['ticket_us']:.3f}, read + relaxed ticket "
              f"{means['relaxed_us']:.3f} (goal 3.3)")

    print("\n== A, large inputs: % of the roofline (bytes / copy bandwidth)")
    for P in a_sizes:
        axes = {"total_patches": P}
        r = a_rows(ka, axes, list(A_LARGE_CONFIGS), n, device, bw, flushes)
        result["A_large"].append(r)
        roof = r["roofline_us"]
        for f in flushes:
            x = r[f]
            print(f"{P:8d} {f:>5} flush: A {x['A_us']:8.2f} us {100 * roof / x['A_us']:5.1f}% | "
                  f"pure read {x['read_us']:8.2f} us {100 * roof / x['read_us']:5.1f}% | "
                  f"A at {100 * x['read_us'] / x['A_us']:5.1f}% of the read floor")

    print("\n== B, large inputs: % of the roofline, and a copy of exactly B's bytes")
    for S in b_sizes:
        axes = {"seq_len": S}
        cfgs = [kb.default_config] + ([_nearest(kb, recs, axes)] if _nearest(kb, recs, axes) else [])
        r = b_rows(kb, axes, cfgs, n, device, bw, flushes)
        result["B_large"].append(r)
        roof = r["roofline_us"]
        for f in flushes:
            x = r[f]
            print(f"{S:8d} {f:>5} flush: B {x['B_us']:8.2f} us {100 * roof / x['B_us']:5.1f}% | "
                  f"copy {x['copy_us']:8.2f} us {100 * roof / x['copy_us']:5.1f}% | "
                  f"B at {100 * x['copy_us'] / x['B_us']:5.1f}% of the copy floor")
    result["elapsed_s"] = time.time() - t0
    (args.out / "floors.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {args.out / 'floors.json'} ({result['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
