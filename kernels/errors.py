"""Typed failures, so the tuner and the service can tell a bad config from a broken GPU."""
from __future__ import annotations

import enum


class FailureKind(str, enum.Enum):
    INVALID_CONFIG = "invalid_config"
    COMPILE_ERROR = "compile_error"
    OUT_OF_RESOURCES = "out_of_resources"
    WRONG_RESULT = "wrong_result"
    TIMEOUT = "timeout"
    CRASH = "crash"


class KernelSearchError(Exception):
    """Base of every failure a trial can report; `kind` is what gets stored."""

    kind: FailureKind = FailureKind.CRASH


class InvalidConfig(KernelSearchError, ValueError):
    kind = FailureKind.INVALID_CONFIG


class CompileError(KernelSearchError):
    kind = FailureKind.COMPILE_ERROR


class OutOfResources(KernelSearchError):
    kind = FailureKind.OUT_OF_RESOURCES


class WrongResult(KernelSearchError):
    kind = FailureKind.WRONG_RESULT


class TrialTimeout(KernelSearchError):
    kind = FailureKind.TIMEOUT


class TrialCrash(KernelSearchError):
    kind = FailureKind.CRASH


def classify(exc: BaseException) -> KernelSearchError:
    """Map an exception raised while building or running a kernel onto a typed failure."""
    if isinstance(exc, KernelSearchError):
        return exc
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if name == "OutOfResources" or "out of resource" in text.lower():
        return OutOfResources(text)
    if name in {"CompilationError", "PTXASError", "CompileTimeAssertionFailure"}:
        return CompileError(text)
    if isinstance(exc, TimeoutError):
        return TrialTimeout(text)
    mod = type(exc).__module__ or ""
    if mod.startswith("triton"):
        return CompileError(text)
    return TrialCrash(text)
