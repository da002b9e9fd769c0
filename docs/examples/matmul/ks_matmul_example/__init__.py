"""Triton's tutorial fp16 matmul, tuned and served by kernelsearch instead of per process.

Importing the declaration here binds the decorated kernel to its kernelsearch name, so the first
call already knows which records to look up.
"""
from . import declaration
from .kernel import matmul, matmul_kernel

__all__ = ["declaration", "matmul", "matmul_kernel"]
