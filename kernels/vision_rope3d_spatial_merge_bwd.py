"""Workload B (SOL-ExecBench L1/019): backward of 3-D vision RoPE applied to q and k.

A program owns a tile of ROWS rows x HEADS heads x BLOCK_D columns of the lower half of the
head dimension together with the matching columns of the upper half, which is exactly what
rotate_half couples: grad_q/grad_k and the column sums for grad_embeddings close inside the
tile. Splitting heads across programs (HEADS < 16) leaves partial sums for grad_embeddings,
added with atomics into an output zeroed by the launcher; splitting the head dimension needs no
cross-program sum at all, which is how the small cases find enough parallelism.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

from ._trig import TRIG_CHOICES, sincos
from .device import default_device, is_interpreter, num_programs_hint
from .spec import Axes, AxisValue, Axis, InputDomain, KernelDef, Param, check_tensor, load_cases, runtime_of

NAME = "vision_rope3d_spatial_merge_bwd"
NUM_HEADS = 16
HEAD_DIM = 128
HALF = 64
MAX_SEQ = 1 << 17
# The largest position the domain's RoPE tables hold (a long video's time axis): 1.3e5 rad.
MAX_POSITION = 1 << 17

_CACHE = {"none": ("", ""), "evict_first": ("", "evict_first"), "cg": (".cg", "")}
_STORE = {"none": ("", ""), "cs": (".cs", ""), "evict_first": ("", "evict_first")}


@triton.jit
def _tile(gq_ptr, gk_ptr, q_ptr, k_ptr, e_ptr, dq_ptr, dk_ptr, de_ptr, t, S,
          ROWS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
          N_H: tl.constexpr, N_D: tl.constexpr, TRIG: tl.constexpr, ASM: tl.constexpr,
          CM: tl.constexpr, EP: tl.constexpr, SCM: tl.constexpr, SEP: tl.constexpr,
          ATOMIC: tl.constexpr):
    d_blk = t % N_D
    h_blk = (t // N_D) % N_H
    r_blk = t // (N_D * N_H)
    r = r_blk * ROWS + tl.arange(0, ROWS)
    h = h_blk * HEADS + tl.arange(0, HEADS)
    d = d_blk * BLOCK_D + tl.arange(0, BLOCK_D)
    r3 = r[:, None, None]
    lo = r3 * (16 * 128) + h[None, :, None] * 128 + d[None, None, :]
    hi = lo + 64
    m3 = r3 < S
    gq_lo = tl.load(gq_ptr + lo, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    gq_hi = tl.load(gq_ptr + hi, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    gk_lo = tl.load(gk_ptr + lo, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    gk_hi = tl.load(gk_ptr + hi, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    q_lo = tl.load(q_ptr + lo, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    q_hi = tl.load(q_ptr + hi, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    k_lo = tl.load(k_ptr + lo, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    k_hi = tl.load(k_ptr + hi, mask=m3, other=0.0, cache_modifier=CM, eviction_policy=EP)
    r2 = r[:, None]
    e_off = r2 * 128 + d[None, :]
    m2 = r2 < S
    e_lo = tl.load(e_ptr + e_off, mask=m2, other=0.0)
    e_hi = tl.load(e_ptr + e_off + 64, mask=m2, other=0.0)
    n_lo, c_lo = sincos(e_lo, TRIG, ASM)
    n_hi, c_hi = sincos(e_hi, TRIG, ASM)
    c_lo3 = c_lo[:, None, :]
    c_hi3 = c_hi[:, None, :]
    n_lo3 = n_lo[:, None, :]
    n_hi3 = n_hi[:, None, :]
    tl.store(dq_ptr + lo, gq_lo * c_lo3 + gq_hi * n_hi3, mask=m3,
             cache_modifier=SCM, eviction_policy=SEP)
    tl.store(dq_ptr + hi, gq_hi * c_hi3 - gq_lo * n_lo3, mask=m3,
             cache_modifier=SCM, eviction_policy=SEP)
    tl.store(dk_ptr + lo, gk_lo * c_lo3 + gk_hi * n_hi3, mask=m3,
             cache_modifier=SCM, eviction_policy=SEP)
    tl.store(dk_ptr + hi, gk_hi * c_hi3 - gk_lo * n_lo3, mask=m3,
             cache_modifier=SCM, eviction_policy=SEP)
    C_lo = tl.sum(gq_lo * q_lo + gk_lo * k_lo, axis=1)
    C_hi = tl.sum(gq_hi * q_hi + gk_hi * k_hi, axis=1)
    S_lo = tl.sum(-(gq_lo * q_hi) - gk_lo * k_hi, axis=1)
    S_hi = tl.sum(gq_hi * q_lo + gk_hi * k_lo, axis=1)
    de_lo = c_lo * S_lo - n_lo * C_lo
    de_hi = c_hi * S_hi - n_hi * C_hi
    if ATOMIC:
        # The mask is broadcast by hand: the interpreter's atomics do not broadcast it.
        ma = m2 & (d[None, :] < 64)
        tl.atomic_add(de_ptr + e_off, de_lo, mask=ma, sem="relaxed")
        tl.atomic_add(de_ptr + e_off + 64, de_hi, mask=ma, sem="relaxed")
    else:
        tl.store(de_ptr + e_off, de_lo, mask=m2)
        tl.store(de_ptr + e_off + 64, de_hi, mask=m2)


# Shapes vary per case; specialising on them would recompile every config for every case.
@triton.jit(do_not_specialize=["S", "n_tiles"])
def _rope3d_bwd_kernel(gq_ptr, gk_ptr, q_ptr, k_ptr, e_ptr, dq_ptr, dk_ptr, de_ptr, S, n_tiles,
                       ROWS: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                       N_H: tl.constexpr, N_D: tl.constexpr, TRIG: tl.constexpr,
                       ASM: tl.constexpr, CM: tl.constexpr, EP: tl.constexpr,
                       SCM: tl.constexpr, SEP: tl.constexpr, ATOMIC: tl.constexpr,
                       PERSISTENT: tl.constexpr):
    pid = tl.program_id(0)
    if PERSISTENT:
        for t in range(pid, n_tiles, tl.num_programs(0)):
            _tile(gq_ptr, gk_ptr, q_ptr, k_ptr, e_ptr, dq_ptr, dk_ptr, de_ptr, t, S,
                  ROWS, HEADS, BLOCK_D, N_H, N_D, TRIG, ASM, CM, EP, SCM, SEP, ATOMIC)
    else:
        _tile(gq_ptr, gk_ptr, q_ptr, k_ptr, e_ptr, dq_ptr, dk_ptr, de_ptr, pid, S,
              ROWS, HEADS, BLOCK_D, N_H, N_D, TRIG, ASM, CM, EP, SCM, SEP, ATOMIC)


PARAMS = (
    Param("ROWS", (1, 2, 4, 8), 1, "sequence rows per tile"),
    Param("HEADS", (1, 2, 4, 8, 16), 16, "heads per tile (fewer than 16 splits heads across programs)"),
    Param("BLOCK_D", (8, 16, 32, 64), 32, "columns of each half of the head dimension per tile"),
    Param("GRID", ("tiles", "persistent"), "tiles", "one tile per program, or a persistent strided grid"),
    Param("PROGRAMS_PER_SM", (1, 2, 4, 8, 16, 32), 4, "persistent grid size per multiprocessor",
          requires={"GRID": ("persistent",)}),
    Param("CACHE", tuple(_CACHE), "none", "load cache/eviction hint for the streamed tensors"),
    Param("STORE", tuple(_STORE), "none", "store cache/eviction hint for grad_q and grad_k"),
    Param("TRIG", TRIG_CHOICES, "approx_rr", "sin/cos implementation"),
    Param("num_warps", (1, 2, 4, 8, 16), 1, "warps per program"),
    Param("num_stages", (1, 2, 3, 4), 1, "software pipelining depth (persistent loop)"),
)


def _rules(cfg: Mapping[str, Any]) -> str | None:
    elems = cfg["ROWS"] * cfg["HEADS"] * cfg["BLOCK_D"]
    per_thread = 8 * elems // (32 * cfg["num_warps"])
    # Past 128 live input values per thread ptxas spills to the stack (seen with cuobjdump).
    if per_thread > 128:
        return (f"tile ROWS*HEADS*BLOCK_D={elems} with num_warps={cfg['num_warps']} holds {per_thread} "
                "input values per thread (at most 128)")
    return None


def launch(grad_q_embed: torch.Tensor, grad_k_embed: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
           embeddings: torch.Tensor, *, config: Mapping[str, Any],
           out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the Triton kernel with an already validated config; `out` lets a check poison outputs."""
    S = q.shape[0]
    rows, heads, bd = config["ROWS"], config["HEADS"], config["BLOCK_D"]
    n_h, n_d = NUM_HEADS // heads, HALF // bd
    n_tiles = triton.cdiv(S, rows) * n_h * n_d
    atomic = heads < NUM_HEADS
    if out is None:
        dq, dk = torch.empty_like(q), torch.empty_like(k)
        de = (torch.zeros if atomic else torch.empty)(S, HEAD_DIM, dtype=torch.float32, device=q.device)
    else:
        dq, dk, de = out
        if atomic:
            de.zero_()
    persistent = config["GRID"] == "persistent"
    if persistent:
        grid = min(n_tiles, num_programs_hint(q.device) * config["PROGRAMS_PER_SM"])
    else:
        grid = n_tiles
    cm, ep = _CACHE[config["CACHE"]]
    scm, sep = _STORE[config["STORE"]]
    runtime_of(KERNEL).last_compiled = _rope3d_bwd_kernel[(grid,)](
        grad_q_embed, grad_k_embed, q, k, embeddings, dq, dk, de, S, n_tiles,
        ROWS=rows, HEADS=heads, BLOCK_D=bd, N_H=n_h, N_D=n_d, TRIG=config["TRIG"],
        ASM=not is_interpreter(), CM=cm, EP=ep, SCM=scm, SEP=sep, ATOMIC=atomic,
        PERSISTENT=persistent,
        num_warps=config["num_warps"], num_stages=config["num_stages"],
    )
    return dq, dk, de


def check_inputs(grad_q_embed, grad_k_embed, q, k, embeddings) -> None:
    check_tensor("q", q, shape=(None, NUM_HEADS, HEAD_DIM), dtype=torch.float32)
    S = q.shape[0]
    if S < 1:
        raise ValueError("q: needs at least one row")
    dev = q.device
    for name, t in (("grad_q_embed", grad_q_embed), ("grad_k_embed", grad_k_embed), ("k", k)):
        check_tensor(name, t, shape=(S, NUM_HEADS, HEAD_DIM), dtype=torch.float32, device=dev)
    check_tensor("embeddings", embeddings, shape=(S, HEAD_DIM), dtype=torch.float32, device=dev)


def axes_of(grad_q_embed, grad_k_embed, q, k, embeddings) -> dict[str, AxisValue]:
    return {"seq_len": int(q.shape[0])}


def make_inputs(axes: Axes, *, seed: int, distribution: str = "benchmark",
                device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
    """The benchmark's draw (all standard normal), embeddings built from real RoPE angles of
    positions 0..S-1, or `long`: real RoPE angles of positions drawn up to MAX_POSITION."""
    device = torch.device(device) if device is not None else default_device()
    S = int(axes["seq_len"])
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (S, NUM_HEADS, HEAD_DIM)
    gq, gk, q, k = (torch.randn(shape, generator=gen) for _ in range(4))
    if distribution == "benchmark":
        emb = torch.randn(S, HEAD_DIM, generator=gen)
    elif distribution in ("realistic", "long"):
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
        if distribution == "long":
            pos = torch.randint(0, MAX_POSITION, (S,), generator=gen).double()
        else:
            pos = torch.arange(S, dtype=torch.float64)
        f = pos[:, None] * inv_freq[None, :]
        emb = torch.cat([f, f], dim=1).float()
    else:
        raise ValueError("distribution: expected 'benchmark', 'realistic' or 'long', "
                         f"got {distribution!r}")
    return tuple(t.to(device).contiguous() for t in (gq, gk, q, k, emb))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([-x[..., HALF:], x[..., :HALF]], dim=-1)


def reference(grad_q_embed, grad_k_embed, q, k, embeddings):
    """The formula in float64."""
    gq, gk, qq, kk, E = (t.double() for t in (grad_q_embed, grad_k_embed, q, k, embeddings))
    c = torch.cos(E)[:, None, :]
    n = torch.sin(E)[:, None, :]
    def back(g):
        # d/dx of x*c + rotate_half(x)*n is g*c + rotate_half^T(g*n), rotate_half^T = -rotate_half.
        return g * c - _rotate_half(g * n)
    C = (gq * qq + gk * kk).sum(1)
    Sn = (gq * _rotate_half(qq) + gk * _rotate_half(kk)).sum(1)
    de = torch.cos(E) * Sn - torch.sin(E) * C
    return back(gq), back(gk), de


def torch_reference(grad_q_embed, grad_k_embed, q, k, embeddings):
    """The benchmark's PyTorch path, float32, with its concatenate-then-slice of the table."""
    emb = torch.cat([embeddings, embeddings], dim=-1)[..., :HEAD_DIM]
    cos = emb.cos().unsqueeze(-2)
    sin = emb.sin().unsqueeze(-2)
    grad_q = grad_q_embed * cos - _rotate_half(grad_q_embed * sin)
    grad_k = grad_k_embed * cos - _rotate_half(grad_k_embed * sin)
    grad_cos = (grad_q_embed * q + grad_k_embed * k).sum(-2)
    grad_sin = (grad_q_embed * _rotate_half(q) + grad_k_embed * _rotate_half(k)).sum(-2)
    grad_emb = grad_sin * emb.cos() - grad_cos * emb.sin()
    return grad_q, grad_k, grad_emb


def bytes_moved(axes: Axes) -> int:
    S = int(axes["seq_len"])
    return 6 * S * NUM_HEADS * HEAD_DIM * 4 + 2 * S * HEAD_DIM * 4


CASES = load_cases("vision_rope3d_spatial_merge_bwd.json", ("seq_len",))

KERNEL = KernelDef(
    name=NAME,
    description="Backward of 3-D vision RoPE on q and k (Qwen3-Omni vision encoder)",
    benchmark_problem="SOL-ExecBench L1/019",
    axes=(Axis("seq_len", 1, MAX_SEQ, "rows of q/k (16 heads x 128 dims each)"),),
    params=PARAMS,
    cases=CASES,
    input_names=("grad_q_embed", "grad_k_embed", "q", "k", "embeddings"),
    output_names=("grad_q", "grad_k", "grad_embeddings"),
    rtol=2e-5,
    make_inputs=make_inputs,
    reference=reference,
    torch_reference=torch_reference,
    launch=launch,
    axes_of=axes_of,
    bytes_moved=bytes_moved,
    check_inputs=check_inputs,
    rules=_rules,
    triton_kernels=(_rope3d_bwd_kernel,),
    domain=InputDomain(
        scale_groups=(("grad_q_embed", "grad_k_embed"), ("q", "k")), edge=("long",),
        notes="the gradients, and q and k, each scaled by 1e-30 .. 1e30; RoPE angles of "
              f"positions up to {MAX_POSITION}"),
)
