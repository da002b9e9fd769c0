"""sin/cos variants the kernels accept.

`precise` is libdevice's sinf/cosf; `approx` is the hardware's sin.approx/cos.approx, accurate
only near zero (errors near 1e-3 at the domain's largest angles, so the gate rejects it and
the search spaces leave it out); `approx_rr` reduces the argument to [-pi, pi] first (Cody-Waite, two constants)
so the approximation holds for the large angles real RoPE tables have. The interpreter has no
inline assembly: there `ASM` is false and tl.sin/tl.cos stand in, after the same reduction.
"""
import triton
import triton.language as tl

TRIG_CHOICES = ("precise", "approx", "approx_rr")
# Only `precise` and `approx_rr` pass the domain's largest angles: the tuner's gate refuses
# `approx` there. Keep the line count above the jit functions below: Triton's JIT cache key,
# the kernels' source identity, counts their line numbers, and every shipped record is keyed
# by it.

_INV_2PI = 0.15915494309189535
_2PI_HI = 6.28125
_2PI_LO = 0.0019353071795864769


@triton.jit
def _hw_sin(x, ASM: tl.constexpr):
    if ASM:
        return tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.sin(x)


@triton.jit
def _hw_cos(x, ASM: tl.constexpr):
    if ASM:
        return tl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.cos(x)


@triton.jit
def sincos(x, TRIG: tl.constexpr, ASM: tl.constexpr):
    if TRIG == "approx":
        s = _hw_sin(x, ASM)
        c = _hw_cos(x, ASM)
    elif TRIG == "approx_rr":
        k = tl.floor(x * 0.15915494309189535 + 0.5)
        r = x - k * 6.28125
        r = r - k * 0.0019353071795864769
        s = _hw_sin(r, ASM)
        c = _hw_cos(r, ASM)
    else:
        s = tl.sin(x)
        c = tl.cos(x)
    return s, c
