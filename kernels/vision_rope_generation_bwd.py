"""Workload A (SOL-ExecBench L1/024): backward of a 2-D vision RoPE table, down to grad_inv_freq.

    g[p, c]          = grad_sin[p, c] * cos(emb[p, c]) - grad_cos[p, c] * sin(emb[p, c])
    grad_inv_freq[j] = sum_p pos[p,0] * (g[p,j] + g[p,j+36]) + pos[p,1] * (g[p,j+18] + g[p,j+54])

One launch per call, deterministic: each program folds its patches into an 18-vector partial,
then takes a ticket from a self-resetting counter; the program holding the last ticket sums the
partials in program order (`ticket2`: the same in groups of 32 programs, then over the groups).

`fixed` adds each partial exactly into a long fixed-point accumulator that spans
the whole float32 range (bits 2^-149 to 2^139: nine 32-bit digits per output), with integer
atomics: integer sums do not depend on arrival order, so the result is the same bits every call
without partials to read back or a fence. Why nine digits rather than a window: a float32
partial is m * 2^e with a 24-bit m, which lands exactly in two adjacent digits wherever e is,
so every magnitude a caller can pass sums exactly (a fixed binary point covered only a band:
zeros for gradients of 1e-20, NaN from 1e10); a scale picked per launch would need every
program's exponent before any program converts, i.e. a grid-wide wait. Each word carries a
16-bit arrival count, and the program that brings an output's count to the grid size resolves
its carries into balanced digits (so the float64 combination never cancels) and writes that
output rounded once; a NaN or Inf partial makes the output NaN. No memset, no atomics on the
output. `SLOTS=spread` puts each of the 180 words in its own 128-byte line, so that the grid's
atomics on one output do not all queue at one L2 slice.

`hybrid` (the default) keeps the common case at the cost of a 3-digit fixed point (52 fraction
bits, four words per output, one vector atomic, no fence) and sends the rest through an ordered
float64 sum: a partial p with 2^-29 <= |p| < 2^43 (or 0) is an integer number of 2^-52 below 2^95,
so it adds exactly. A program with any other partial (tiny, huge, NaN/Inf) stores those in its own
row of a zeroed workspace, fences (release), then adds zero for them and counts itself in the
output's fourth word. An output's finisher sees that count in its own atomic's return: zero, and
it writes the integer sum as the old fixed point did; otherwise it fences (acquire), adds the
rows of its column in float64, in a fixed order, to the exact integer sum, and zeroes them
again. The integer part does not depend on arrival order and the float64 part runs in a fixed
order over a set the data decides, so the bits are the same every call.

`GRID=persistent` runs PROGRAMS_PER_SM programs per multiprocessor, each striding over the tiles,
so the cross-program sum costs a fixed number of atomics however large the input.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from ._trig import TRIG_CHOICES, sincos
from .device import default_device, is_interpreter, num_programs_hint
from .spec import Axes, AxisValue, Axis, InputDomain, KernelDef, Param, check_tensor, load_cases, runtime_of

NAME = "vision_rope_generation_bwd"
HEAD_DIM = 72
HALF = 36
QUARTER = 18
MAX_PATCHES = 1 << 22
# The largest grid position the domain holds (a long video's time axis): angles up to 1.3e5 rad.
MAX_POSITION = 1 << 17
GROUP = 32  # programs per first-level group of the two-level ticket
# REDUCE="fixed": each output has ten int64 words (nine 32-bit digit sums and the poison count),
# word w of output j at j * FIXED_STRIDE + w (SLOTS="line": one 128-byte line per output) or at
# (w * 18 + j) * FIXED_STRIDE (SLOTS="spread": a line per word). The count field is 16 bits, and
# the digit sums stay inside 48 bits for at most FIXED_MAX_PROGRAMS programs.
FIXED_STRIDE = 16
FIXED_WORDS = 10
FIXED_MAX_PROGRAMS = (1 << 15) - 1
# REDUCE="hybrid": four words per output (three digit sums, then the arrival count with the count
# of programs whose partial fell outside [2^-29, 2^43) above it), at the same places as the fixed
# sum's first four; such partials wait in a zeroed [programs, 32] float32 workspace.


@triton.jit
def _load_tile(gc_ptr, gs_ptr, pos_ptr, emb_ptr, t, t_hi, P,
               BLOCK_P: tl.constexpr, COLS: tl.constexpr):
    """One tile's inputs and weights; tiles at or past t_hi load nothing (masked)."""
    p0 = t * BLOCK_P
    live = t < t_hi
    if COLS == "quarters":
        # [BLOCK_P, 4, 32] view: column q*18 + j, j < 18; weight pos[:, q % 2].
        rows = p0 + tl.arange(0, BLOCK_P)[:, None, None]
        q3 = tl.arange(0, 4)[None, :, None]
        j3 = tl.arange(0, 32)[None, None, :]
        rmask = (rows < P) & live
        offs = rows * 72 + q3 * 18 + j3
        m = rmask & (j3 < 18)
        sel = (q3 % 2) == 0
    elif COLS == "split64":
        # [BLOCK_P, 64] + [BLOCK_P, 8]: no padded lanes, and both parts start at a multiple of 8
        # floats of a 288-byte row, so every load is a full 16-byte vector.
        rows = p0 + tl.arange(0, BLOCK_P)[:, None]
        c2 = tl.arange(0, 64)[None, :]
        rmask = (rows < P) & live
        base = tl.multiple_of(rows * 72, [8, 8])
        offs = base + c2
        m = rmask
        sel = ((c2 // 18) % 2) == 0
    else:
        # [BLOCK_P, 128] view: column c < 72; weight pos[:, (c // 18) % 2].
        rows = p0 + tl.arange(0, BLOCK_P)[:, None]
        c2 = tl.arange(0, 128)[None, :]
        rmask = (rows < P) & live
        offs = rows * 72 + c2
        m = rmask & (c2 < 72)
        sel = ((c2 // 18) % 2) == 0
    pos_a = tl.load(pos_ptr + rows * 2, mask=rmask, other=0).to(tl.float32)
    pos_b = tl.load(pos_ptr + rows * 2 + 1, mask=rmask, other=0).to(tl.float32)
    w = tl.where(sel, pos_a, pos_b)
    e = tl.load(emb_ptr + offs, mask=m, other=0.0)
    gs = tl.load(gs_ptr + offs, mask=m, other=0.0)
    gc = tl.load(gc_ptr + offs, mask=m, other=0.0)
    if COLS == "split64":
        # Columns 64..71 sit in the fourth quarter: weight pos[:, 1].
        offs_t = base + 64 + tl.arange(0, 8)[None, :]
        e_t = tl.load(emb_ptr + offs_t, mask=rmask, other=0.0)
        gs_t = tl.load(gs_ptr + offs_t, mask=rmask, other=0.0)
        gc_t = tl.load(gc_ptr + offs_t, mask=rmask, other=0.0)
    else:
        e_t = 0.0
        gs_t = 0.0
        gc_t = 0.0
    return e, gs, gc, w, e_t, gs_t, gc_t, pos_b


@triton.jit
def _fold_tile(acc, acc_t, e, gs, gc, w, e_t, gs_t, gc_t, pos_b,
               COLS: tl.constexpr, TRIG: tl.constexpr, ASM: tl.constexpr):
    s, c = sincos(e, TRIG, ASM)
    acc += (gs * c - gc * s) * w
    if COLS == "split64":
        s_t, c_t = sincos(e_t, TRIG, ASM)
        acc_t += (gs_t * c_t - gc_t * s_t) * pos_b
    return acc, acc_t


# Shapes vary per case; specialising on them would recompile every config for every case.
@triton.jit(do_not_specialize=["P", "n_tiles"])
def _rope_gen_bwd_kernel(
    gc_ptr, gs_ptr, pos_ptr, emb_ptr, out_ptr, ws_ptr, counter_ptr, slots_ptr, rows_ptr,
    P, n_tiles,
    BLOCK_P: tl.constexpr, TILES: tl.constexpr, REDUCE: tl.constexpr, COLS: tl.constexpr,
    TRIG: tl.constexpr, ASM: tl.constexpr, RB: tl.constexpr, PIPELINE: tl.constexpr,
    GROUP: tl.constexpr, SLOT_STRIDE: tl.constexpr, PERSISTENT: tl.constexpr,
    WORD_STRIDE: tl.constexpr,
):
    pid = tl.program_id(0)
    j = tl.arange(0, 32)
    if COLS == "quarters":
        acc = tl.zeros([BLOCK_P, 4, 32], dtype=tl.float32)
    elif COLS == "split64":
        acc = tl.zeros([BLOCK_P, 64], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_P, 128], dtype=tl.float32)
    if COLS == "split64":
        acc_t = tl.zeros([BLOCK_P, 8], dtype=tl.float32)
    else:
        acc_t = 0.0

    if REDUCE == "single":
        t_lo = 0
        t_hi = n_tiles
        step = 1
    elif PERSISTENT:
        t_lo = pid
        t_hi = n_tiles
        step = tl.num_programs(0)
    else:
        t_lo = pid * TILES
        t_hi = tl.minimum(t_lo + TILES, n_tiles)
        step = 1
    if PIPELINE == "prefetch":
        # The next tile's loads are issued before this tile's arithmetic: a program keeps two
        # tiles in flight instead of paying one DRAM round trip per tile.
        e, gs, gc, w, e_t, gs_t, gc_t, pos_b = _load_tile(
            gc_ptr, gs_ptr, pos_ptr, emb_ptr, t_lo, t_hi, P, BLOCK_P, COLS)
        for t in range(t_lo + step, t_hi + step, step):
            e2, gs2, gc2, w2, e_t2, gs_t2, gc_t2, pos_b2 = _load_tile(
                gc_ptr, gs_ptr, pos_ptr, emb_ptr, t, t_hi, P, BLOCK_P, COLS)
            acc, acc_t = _fold_tile(acc, acc_t, e, gs, gc, w, e_t, gs_t, gc_t, pos_b,
                                    COLS, TRIG, ASM)
            e, gs, gc, w, e_t, gs_t, gc_t, pos_b = e2, gs2, gc2, w2, e_t2, gs_t2, gc_t2, pos_b2
    else:
        for t in range(t_lo, t_hi, step):
            e, gs, gc, w, e_t, gs_t, gc_t, pos_b = _load_tile(
                gc_ptr, gs_ptr, pos_ptr, emb_ptr, t, t_hi, P, BLOCK_P, COLS)
            acc, acc_t = _fold_tile(acc, acc_t, e, gs, gc, w, e_t, gs_t, gc_t, pos_b,
                                    COLS, TRIG, ASM)

    if COLS == "quarters":
        part = tl.sum(tl.sum(acc, axis=0), axis=0)
    elif COLS == "split64":
        v = tl.sum(acc, axis=0)  # [64]
        v_t = tl.sum(acc_t, axis=0)  # [8], columns 64..71 -> slots 10..17
        cc = tl.arange(0, 64)[:, None]
        ct = tl.arange(0, 8)[:, None]
        part = tl.sum(tl.where((cc % 18) == j[None, :], v[:, None], 0.0), axis=0)
        part += tl.sum(tl.where((ct + 10) == j[None, :], v_t[:, None], 0.0), axis=0)
    else:
        v = tl.sum(acc, axis=0)  # [128]
        cc = tl.arange(0, 128)[:, None]
        fold = ((cc % 18) == j[None, :]) & (cc < 72)
        part = tl.sum(tl.where(fold, v[:, None], 0.0), axis=0)

    if REDUCE == "single":
        tl.store(out_ptr + j, part, mask=j < 18)
    elif REDUCE == "fixed":
        _fixed_sum(part, slots_ptr, out_ptr, tl.num_programs(0), SLOT_STRIDE, WORD_STRIDE)
    elif REDUCE == "hybrid":
        _hybrid_sum(part, slots_ptr, rows_ptr, out_ptr, pid, tl.num_programs(0), SLOT_STRIDE,
                    WORD_STRIDE, RB, ASM)
    elif REDUCE == "ticket":
        n_prog = tl.num_programs(0)
        tl.store(ws_ptr + pid * 32 + j, part)
        tl.debug_barrier()
        ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
        if ticket == n_prog - 1:
            _sum_rows(ws_ptr, out_ptr, n_prog, RB)
            tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    else:
        # Two levels: the last of each GROUP programs sums its group's partials, the last group
        # sums the group sums. Tickets on one counter serialise at the L2 (about 5 ns each on
        # the H200), so a grid of many small programs pays for them twice over otherwise.
        n_prog = tl.num_programs(0)
        n_groups = tl.cdiv(n_prog, GROUP)
        g = pid // GROUP
        g_lo = g * GROUP
        g_n = tl.minimum(n_prog - g_lo, GROUP)
        tl.store(ws_ptr + pid * 32 + j, part)
        tl.debug_barrier()
        ticket = tl.atomic_add(counter_ptr + 32 + g * 32, 1, sem="acq_rel", scope="gpu")
        if ticket == g_n - 1:
            r = tl.arange(0, GROUP)[:, None]
            gp = tl.load(ws_ptr + (g_lo + r) * 32 + j[None, :], mask=r < g_n, other=0.0,
                         cache_modifier=".cg")
            tl.store(ws_ptr + (n_prog + g) * 32 + j, tl.sum(gp, axis=0))
            tl.atomic_xchg(counter_ptr + 32 + g * 32, 0, sem="relaxed", scope="gpu")
            tl.debug_barrier()
            ticket2 = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
            if ticket2 == n_groups - 1:
                _sum_rows(ws_ptr + n_prog * 32, out_ptr, n_groups, RB)
                tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _fixed_sum(part, slots_ptr, out_ptr, n_prog, STRIDE: tl.constexpr, WSTRIDE: tl.constexpr):
    """Add this program's 18 partials exactly to the long accumulators; finish those it completes.

    A partial is m * 2^(q - 149) with m < 2^24 and q in [0, 254): m << (q % 32) splits into digit
    q // 32 and the one above, each below 2^32 and signed by the partial. Word 9 counts NaN/Inf
    partials. Every word gets the program's digit shifted past a 16-bit arrival count (zero
    digits too, so every count reaches the grid size): two atomic instructions, the digits and
    word 9, whose returned count tells the program whether it finishes that output."""
    j = tl.arange(0, 32)
    live = j < 18
    w = tl.arange(0, 16)[None, :]  # 0..8: digits, 9: poison count, 10..15: unused
    row = slots_ptr + j * STRIDE
    words = row[:, None] + w * WSTRIDE
    bits = part.to(tl.int32, bitcast=True)
    ef = (bits >> 23) & 0xFF
    bad = ef == 255
    mant = bits & 0x7FFFFF
    m = tl.where(ef == 0, mant, mant | 0x800000).to(tl.int64)
    q = tl.where(bad, 0, tl.maximum(ef, 1) - 1)
    v = tl.where(bad, 0, m) << (q & 31).to(tl.int64)
    sign = tl.where(bits < 0, -1, 1).to(tl.int64)
    lo = (v & 0xFFFFFFFF) * sign
    hi = (v >> 32) * sign
    k = (q >> 5)[:, None]
    digit = tl.where(w == k, lo[:, None], tl.where(w == k + 1, hi[:, None], 0))
    inc = (digit << 16) + 1
    old = tl.atomic_add(words, inc, mask=live[:, None] & (w < 9), sem="relaxed", scope="gpu")
    old9 = tl.atomic_add(row + 9 * WSTRIDE, (bad.to(tl.int64) << 16) + 1, mask=live, sem="relaxed",
                         scope="gpu")
    fin = live & ((old9 & 0xFFFF) + 1 == n_prog)
    if tl.max(fin.to(tl.int32), axis=0) > 0:
        # Every program has added its word 9; its digits went out just before and are in
        # flight at worst: read them back until their counts are whole.
        fmask = fin[:, None] & (w < 9)
        done = ~fmask | (((old + inc) & 0xFFFF) == n_prog)
        if tl.min(tl.min(done.to(tl.int32), axis=1), axis=0) == 0:
            pending = 1
            while pending > 0:
                cur = tl.load(words, mask=fmask, other=0, volatile=True)
                ok = ~fmask | ((cur & 0xFFFF) == n_prog)
                pending = tl.sum(tl.sum((~ok).to(tl.int32), axis=1), axis=0)
        # Balanced digits in [-2^31, 2^31), from the bottom: below any digit the rest is less
        # than half a unit of it, so the float64 Horner sum never cancels (error < 1e-15).
        carry = tl.zeros([32], dtype=tl.int64)
        u = tl.zeros([32], dtype=tl.float64)
        for i in tl.static_range(9):
            s = (tl.load(row + i * WSTRIDE, mask=fin, other=0, volatile=True) >> 16) + carry
            d = ((s + 2147483648) & 0xFFFFFFFF) - 2147483648
            carry = (s - d) >> 32
            u = u * 2.3283064365386963e-10 + d.to(tl.float64)  # 2^-32
        # u counts units of digit 8 (2^(256 - 149) = 2^107); the carry is one digit above it.
        total = (u + carry.to(tl.float64) * 4294967296.0) * 1.6225927682921336e+32
        poisoned = (tl.load(row + 9 * WSTRIDE, mask=fin, other=0, volatile=True) >> 16) > 0
        res = tl.where(poisoned, float("nan"), total.to(tl.float32))
        tl.store(out_ptr + j, res, mask=fin)
        tl.store(words, tl.zeros([32, 16], dtype=tl.int64), mask=fin[:, None] & (w < 10))


@triton.jit
def _fence(x, ASM: tl.constexpr):
    """fence.acq_rel.gpu: the interpreter runs one program at a time and needs none."""
    if ASM:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [x],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _hybrid_sum(part, slots_ptr, rows_ptr, out_ptr, pid, n_prog, STRIDE: tl.constexpr,
                WSTRIDE: tl.constexpr, RB: tl.constexpr, ASM: tl.constexpr):
    """The fixed sum's fast path for partials it holds exactly, an ordered float64 sum for the rest.

    In range, x = |p| * 2^52 is an integer below 2^95 (float32 scaling and subtraction are exact
    here): three digits below 2^32, signed by p, each added shifted past a 16-bit arrival count.
    Word 3 adds the out-of-range flag the same way. A flagged program's row is visible before
    its atomics (store, barrier, release fence), so the finisher that sees the flag count after
    its own atomic and an acquire fence reads every flagged row."""
    j = tl.arange(0, 32)
    live = j < 18
    w = tl.arange(0, 4)[None, :]  # 0: low digit, 1: middle, 2: high, 3: flags
    words = slots_ptr + j[:, None] * STRIDE + w * WSTRIDE
    a = tl.abs(part)
    inr = (a == 0.0) | ((a >= 1.862645149230957e-09) & (a < 8796093022208.0))  # 2^-29, 2^43
    oor = live & ~inr
    if tl.max(oor.to(tl.int32), axis=0) > 0:
        tl.store(rows_ptr + pid * 32 + j, tl.where(oor, part, 0.0), mask=live)
        tl.debug_barrier()
        _fence(pid, ASM)
    x = tl.where(inr, a, 0.0) * 4503599627370496.0  # 2^52
    h = tl.floor(x * 5.421010862427522e-20)  # 2^-64
    r = x - h * 18446744073709551616.0
    m = tl.floor(r * 2.3283064365386963e-10)  # 2^-32
    lo_f = r - m * 4294967296.0
    sign = tl.where(part < 0, -1, 1).to(tl.int64)
    digit = tl.where(w == 0, (lo_f.to(tl.int64) * sign)[:, None],
                     tl.where(w == 1, (m.to(tl.int64) * sign)[:, None],
                              tl.where(w == 2, (h.to(tl.int64) * sign)[:, None],
                                       oor.to(tl.int64)[:, None])))
    inc = (digit << 16) + 1
    old = tl.atomic_add(words, inc, mask=live[:, None], sem="relaxed", scope="gpu")
    new = old + inc
    fin = live & ((tl.sum(tl.where(w == 3, new, 0), axis=1) & 0xFFFF) == n_prog)
    if tl.max(fin.to(tl.int32), axis=0) > 0:
        # Every program has added its word 3; its other words went out in the same instruction
        # and are in flight at worst: read them back until their counts are whole.
        done = ~fin[:, None] | ((new & 0xFFFF) == n_prog)
        if tl.min(tl.min(done.to(tl.int32), axis=1), axis=0) == 0:
            pending = 1
            while pending > 0:
                cur = tl.load(words, mask=fin[:, None], other=0, volatile=True)
                ok = ~fin[:, None] | ((cur & 0xFFFF) == n_prog)
                pending = tl.sum(tl.sum((~ok).to(tl.int32), axis=1), axis=0)
            new = tl.load(words, mask=fin[:, None], other=0, volatile=True)
        sums = new >> 16
        # Balanced digits from the bottom (as in _fixed_sum): the float64 Horner sum never cancels.
        s = tl.sum(tl.where(w == 0, sums, 0), axis=1)
        d0 = ((s + 2147483648) & 0xFFFFFFFF) - 2147483648
        s = tl.sum(tl.where(w == 1, sums, 0), axis=1) + ((s - d0) >> 32)
        d1 = ((s + 2147483648) & 0xFFFFFFFF) - 2147483648
        s = tl.sum(tl.where(w == 2, sums, 0), axis=1) + ((s - d1) >> 32)
        u = d0.to(tl.float64) * 2.3283064365386963e-10 + d1.to(tl.float64)  # 2^-32
        u = u * 2.3283064365386963e-10
        total = (u + s.to(tl.float64)) * 4096.0  # s counts units of 2^(64 - 52)
        need = fin & (tl.sum(tl.where(w == 3, sums, 0), axis=1) > 0)
        tl.store(words, tl.zeros([32, 4], dtype=tl.int64), mask=fin[:, None])
        extra = tl.zeros([32], dtype=tl.float64)
        if tl.max(need.to(tl.int32), axis=0) > 0:
            _fence(pid, ASM)
            tl.debug_barrier()
            rr = tl.arange(0, RB)[:, None]
            acc = tl.zeros([RB, 32], dtype=tl.float64)
            # Loads only, unrolled: several blocks in flight instead of one L2 round trip each.
            for b in tl.range(0, n_prog, RB, loop_unroll_factor=4):
                msk = ((b + rr) < n_prog) & need[None, :]
                v = tl.load(rows_ptr + (b + rr) * 32 + j[None, :], mask=msk, other=0.0,
                            cache_modifier=".cg")
                acc += v.to(tl.float64)
            extra = tl.sum(acc, axis=0)
            # Then the column back to zero, stores only (nothing waits on them).
            for b in range(0, n_prog, RB):
                tl.store(rows_ptr + (b + rr) * 32 + j[None, :], tl.zeros([RB, 32], dtype=tl.float32),
                         mask=((b + rr) < n_prog) & need[None, :])
        # Finite float32 partials cannot overflow a float64 sum: a non-finite one was NaN/Inf.
        poisoned = (extra != extra) | (tl.abs(extra) == float("inf"))
        res = tl.where(poisoned, float("nan"), (total + extra).to(tl.float32))
        tl.store(out_ptr + j, res, mask=fin)


@triton.jit
def _sum_rows(src_ptr, out_ptr, n_rows, RB: tl.constexpr):
    """Sum n_rows partials of 32 floats in row order (the same bits every call) into out[:18]."""
    j = tl.arange(0, 32)
    total = tl.zeros([RB, 32], dtype=tl.float32)
    r = tl.arange(0, RB)[:, None]
    for b in range(0, n_rows, RB):
        rr = b + r
        total += tl.load(src_ptr + rr * 32 + j[None, :], mask=rr < n_rows, other=0.0,
                         cache_modifier=".cg")
    tl.store(out_ptr + j, tl.sum(total, axis=0), mask=j < 18)


_MULTI = ("ticket", "ticket2", "fixed", "hybrid")  # the reductions over several programs
PARAMS = (
    Param("BLOCK_P", (8, 16, 32, 64, 128, 256, 512), 16, "patches per tile"),
    Param("TILES", (1, 2, 4, 8, 16, 32, 64), 1, "tiles each program folds before the cross-program sum "
          "(with REDUCE=fixed or hybrid, more when the grid would pass 32767 programs)",
          requires={"REDUCE": _MULTI, "GRID": ("tiles",)}),
    Param("REDUCE", ("ticket", "ticket2", "fixed", "hybrid", "single"), "hybrid",
          "cross-program reduction: the last-arriving program sums the partials in order, the same "
          "in two levels (groups of 32 programs, then the groups), fixed-point integer atomics whose "
          "last adder writes each output (exact over the float32 range), a 3-digit fixed point for "
          "the partials it holds exactly plus an ordered float64 sum of the rest, or one program "
          "does all"),
    Param("SLOTS", ("line", "spread"), "line",
          "fixed or hybrid sum's words: an output's ten (four) in one 128-byte line, or each word "
          "in its own line (fewer atomics queue at one L2 slice)",
          requires={"REDUCE": ("fixed", "hybrid")}),
    Param("GRID", ("tiles", "persistent"), "tiles",
          "TILES consecutive tiles per program, or PROGRAMS_PER_SM programs per multiprocessor "
          "striding over all tiles", requires={"REDUCE": _MULTI}),
    Param("PROGRAMS_PER_SM", (1, 2, 3, 4, 6, 8, 16), 4, "persistent grid size per multiprocessor",
          requires={"REDUCE": _MULTI, "GRID": ("persistent",)}),
    Param("COLS", ("pad128", "quarters", "split64"), "quarters",
          "tiling of the 72 columns: padded to 128, four 18-column quarters padded to 32, or 64 + 8"),
    Param("TRIG", TRIG_CHOICES, "approx_rr", "sin/cos implementation"),
    Param("PIPELINE", ("none", "prefetch"), "none",
          "tile loop: one tile in flight, or the next tile's loads issued before this tile's arithmetic"),
    Param("num_warps", (1, 2, 4, 8, 16), 4, "warps per program"),
    Param("num_stages", (1, 2, 3, 4), 1, "software pipelining depth of the tile loop"),
)


def _rules(cfg: Mapping[str, Any]) -> str | None:
    # Registers: the accumulator is BLOCK_P x 128 floats (72 for split64) spread over the
    # program's threads; past 128 per thread the compiler spills.
    width = 72 if cfg["COLS"] == "split64" else 128
    per_thread = cfg["BLOCK_P"] * width // (32 * cfg["num_warps"])
    if per_thread > 128:
        return (f"BLOCK_P={cfg['BLOCK_P']} with num_warps={cfg['num_warps']} puts {per_thread} "
                "accumulator values per thread (at most 128)")
    # Prefetch keeps two tiles of three inputs live: 6 values per accumulator value. Past 48
    # (288 loaded values per thread) ptxas spills heavily, and such configs can compute wrong
    # sums (docs/perf-notes.md).
    if cfg["PIPELINE"] == "prefetch" and per_thread > 48:
        return (f"PIPELINE=prefetch with BLOCK_P={cfg['BLOCK_P']} and num_warps={cfg['num_warps']} "
                f"keeps {6 * per_thread} loaded values per thread (at most 288)")
    return None


_ws_lock = threading.Lock()
_workspaces: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, rows: int, counters: int, flagged: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partials buffer, ticket counters (one per 128-byte line), the fixed-point sum's words and
    the hybrid sum's rows of out-of-range partials (`flagged` programs), kept per (device,
    stream): counters, words and rows reset themselves, so they are zeroed only when first made
    or grown."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    with _ws_lock:
        got = _workspaces.get(key)
        if got is None:
            got = (torch.empty((max(rows, 1024), 32), dtype=torch.float32, device=device),
                   torch.zeros(32 * counters, dtype=torch.int32, device=device),
                   torch.zeros(FIXED_WORDS * QUARTER * FIXED_STRIDE, dtype=torch.int64,
                               device=device),
                   torch.zeros((1, 32), dtype=torch.float32, device=device))
        ws, counter, slots, flag_rows = got
        if ws.shape[0] < rows:
            ws = torch.empty((max(rows, 2 * ws.shape[0]), 32), dtype=torch.float32, device=device)
        if counter.numel() < 32 * counters:
            counter = torch.zeros(max(32 * counters, 2 * counter.numel()), dtype=torch.int32,
                                  device=device)
        if flag_rows.shape[0] < flagged:
            flag_rows = torch.zeros((max(flagged, 2 * flag_rows.shape[0]), 32), dtype=torch.float32,
                                    device=device)
        got = _workspaces[key] = (ws, counter, slots, flag_rows)
        return got


def launch(grad_cos: torch.Tensor, grad_sin: torch.Tensor, pos_ids: torch.Tensor,
           inv_freq: torch.Tensor, emb: torch.Tensor, *, config: Mapping[str, Any],
           out: tuple[torch.Tensor] | None = None) -> tuple[torch.Tensor]:
    """Run the Triton kernel with an already validated config; `out` lets a check poison outputs."""
    P = emb.shape[0]
    bp = config["BLOCK_P"]
    n_tiles = triton.cdiv(P, bp)
    persistent = config["REDUCE"] != "single" and config.get("GRID") == "persistent"
    if config["REDUCE"] == "single":
        tiles = n_tiles
        n_prog = 1
    elif persistent:
        tiles = 1
        n_prog = min(n_tiles, num_programs_hint(emb.device) * config["PROGRAMS_PER_SM"])
    else:
        tiles = config["TILES"]
        if config["REDUCE"] in ("fixed", "hybrid"):
            tiles = max(tiles, triton.cdiv(n_tiles, FIXED_MAX_PROGRAMS))
        n_prog = triton.cdiv(n_tiles, tiles)
    grad = out[0] if out is not None else torch.empty(QUARTER, dtype=torch.float32, device=emb.device)
    two_level = config["REDUCE"] == "ticket2"
    fixed = config["REDUCE"] in ("fixed", "hybrid")
    n_groups = triton.cdiv(n_prog, GROUP) if two_level else 0
    ws, counter, slots, flag_rows = _workspace(
        emb.device, 1 if fixed else n_prog + n_groups, 1 + n_groups,
        n_prog if config["REDUCE"] == "hybrid" else 0)
    # The last program sums the partials (or the group sums) in blocks of RB rows. Two sizes
    # only, so that a config compiles at most twice over all shapes: one round of L2 reads up to
    # 32 rows per warp, then blocks of 128 per warp (four rows of registers per thread). The
    # hybrid sum's rare out-of-range scan reads two rows per warp at a time: wider blocks cost
    # the whole kernel registers (sm_90, 16 patches, 4 warps: 96 as the fixed sums with blocks of
    # 8 rows, 106 with 16 or 32, 159 with 128).
    nw = config["num_warps"]
    n_rows = n_groups if two_level else n_prog
    rb = 32 * nw if n_rows <= 32 * nw or fixed else 128 * nw
    if config["REDUCE"] == "hybrid":
        rb = 2 * nw
    runtime_of(KERNEL).last_compiled = _rope_gen_bwd_kernel[(n_prog,)](
        grad_cos, grad_sin, pos_ids, emb, grad, ws, counter, slots, flag_rows, P, n_tiles,
        BLOCK_P=bp, TILES=tiles, REDUCE=config["REDUCE"], COLS=config["COLS"],
        TRIG=config["TRIG"], ASM=not is_interpreter(), RB=rb, PIPELINE=config["PIPELINE"], GROUP=GROUP,
        SLOT_STRIDE=FIXED_STRIDE, PERSISTENT=persistent,
        WORD_STRIDE=QUARTER * FIXED_STRIDE if config.get("SLOTS") == "spread" else 1,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return (grad,)


def check_inputs(grad_cos, grad_sin, pos_ids, inv_freq, emb) -> None:
    check_tensor("emb", emb, shape=(None, HEAD_DIM), dtype=torch.float32)
    P = emb.shape[0]
    if P < 1:
        raise ValueError("emb: needs at least one patch")
    dev = emb.device
    check_tensor("grad_cos", grad_cos, shape=(P, HEAD_DIM), dtype=torch.float32, device=dev)
    check_tensor("grad_sin", grad_sin, shape=(P, HEAD_DIM), dtype=torch.float32, device=dev)
    check_tensor("pos_ids", pos_ids, shape=(P, 2), dtype=torch.int64, device=dev)
    check_tensor("inv_freq", inv_freq, shape=(QUARTER,), dtype=torch.float32, device=dev)


def axes_of(grad_cos, grad_sin, pos_ids, inv_freq, emb) -> dict[str, AxisValue]:
    return {"total_patches": int(emb.shape[0])}


def _grid_size(axes: Axes) -> int:
    if "max_grid_size" in axes:
        return int(axes["max_grid_size"])
    for c in CASES:
        if c.axes["total_patches"] == axes["total_patches"]:
            return int(c.info["max_grid_size"])
    return max(2, math.isqrt(int(axes["total_patches"])) + 1)


def real_inv_freq(device: torch.device | str = "cpu") -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, HALF, 2, dtype=torch.float64, device=device) / HALF))


def make_inputs(axes: Axes, *, seed: int, distribution: str = "benchmark",
                device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
    """The benchmark's draw (standard normal, uniform positions), a realistic RoPE table, or
    `long`: a realistic table with positions up to MAX_POSITION (the domain's largest angles)."""
    device = torch.device(device) if device is not None else default_device()
    P = int(axes["total_patches"])
    G = MAX_POSITION if distribution == "long" else _grid_size(axes)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    grad_cos = torch.randn(P, HEAD_DIM, generator=gen)
    grad_sin = torch.randn(P, HEAD_DIM, generator=gen)
    pos_ids = torch.randint(0, G, (P, 2), generator=gen, dtype=torch.int64)
    if distribution == "benchmark":
        inv_freq = torch.randn(QUARTER, generator=gen)
        emb = torch.randn(P, HEAD_DIM, generator=gen)
    elif distribution in ("realistic", "long"):
        f = real_inv_freq()
        rot = torch.cat([pos_ids[:, :1].double() * f, pos_ids[:, 1:].double() * f], dim=1)
        emb = torch.cat([rot, rot], dim=1).float()
        inv_freq = f.float()
    else:
        raise ValueError("distribution: expected 'benchmark', 'realistic' or 'long', "
                         f"got {distribution!r}")
    return tuple(t.to(device).contiguous() for t in (grad_cos, grad_sin, pos_ids, inv_freq, emb))


def reference(grad_cos, grad_sin, pos_ids, inv_freq, emb) -> tuple[torch.Tensor]:
    """The formula in float64."""
    e = emb.double()
    g = grad_sin.double() * torch.cos(e) - grad_cos.double() * torch.sin(e)
    pa = pos_ids[:, 0:1].double()
    pb = pos_ids[:, 1:2].double()
    out = (pa * (g[:, 0:18] + g[:, 36:54]) + pb * (g[:, 18:36] + g[:, 54:72])).sum(0)
    return (out,)


def torch_reference(grad_cos, grad_sin, pos_ids, inv_freq, emb) -> tuple[torch.Tensor]:
    """The benchmark's PyTorch path, float32: chain rule through cat, index and outer product."""
    g = grad_sin * torch.cos(emb) - grad_cos * torch.sin(emb)
    g_rot = g[:, :HALF] + g[:, HALF:]
    G = int(pos_ids.max().item()) + 1
    grad_freqs = torch.zeros(G, QUARTER, dtype=g.dtype, device=g.device)
    grad_freqs.index_add_(0, pos_ids[:, 0], g_rot[:, :QUARTER])
    grad_freqs.index_add_(0, pos_ids[:, 1], g_rot[:, QUARTER:])
    seq = torch.arange(G, dtype=g.dtype, device=g.device)
    return ((seq[:, None] * grad_freqs).sum(0),)


def bytes_moved(axes: Axes) -> int:
    P = int(axes["total_patches"])
    return 3 * P * HEAD_DIM * 4 + P * 16 + QUARTER * 4


CASES = load_cases("vision_rope_generation_bwd.json", ("total_patches",))

KERNEL = KernelDef(
    name=NAME,
    description="Backward of a 2-D vision RoPE table generation: grad_inv_freq from grad_cos/grad_sin",
    benchmark_problem="SOL-ExecBench L1/024",
    axes=(Axis("total_patches", 1, MAX_PATCHES, "patches over all images (rows of emb)"),),
    extra_axes=("num_images", "max_grid_size"),
    params=PARAMS,
    cases=CASES,
    input_names=("grad_cos", "grad_sin", "pos_ids", "inv_freq", "emb"),
    output_names=("grad_inv_freq",),
    rtol=2e-5,
    make_inputs=make_inputs,
    reference=reference,
    torch_reference=torch_reference,
    launch=launch,
    axes_of=axes_of,
    bytes_moved=bytes_moved,
    check_inputs=check_inputs,
    rules=_rules,
    triton_kernels=(_rope_gen_bwd_kernel,),
    domain=InputDomain(
        scale_groups=(("grad_cos", "grad_sin"),), edge=("long",),
        notes="grad_cos and grad_sin scaled by 1e-30 .. 1e30; RoPE tables with grid positions "
              f"up to {MAX_POSITION}"),
)
