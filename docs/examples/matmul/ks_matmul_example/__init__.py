"""Triton's tutorial fp16 matmul, tuned and served by kernelsearch instead of per process."""
from .kernel import matmul, matmul_kernel

__all__ = ["matmul", "matmul_kernel"]
