"""The decorator's hooks of issue 34 under the interpreter (which compiles nothing, so Triton's
compiled kernel stands in as a synthetic compile group): a key tuned here uploads its winner's
group beside the record the store made of it, and a fresh host served that record installs the
group into its own Triton cache before the first launch."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from ks_at_helpers import accumulate, accumulate_kernel

import kernelsearch
from kernelsearch import artifacts
from kernelsearch.kernels import compiled
from kernelsearch.backends import BACKENDS
from kernelsearch.options import Source

ENV = {"driver": "d", "ptxas": "p", "target": "cuda:90:32", "triton": "t"}
KEY = hashlib.sha256(b"a compile").hexdigest()
CUBIN = b"\x7fELF\x02\x01" + b"\0" * 12 + (190).to_bytes(2, "little") + b"body"
FILES = {"k.json": json.dumps({"name": "k"}).encode(), "k.cubin": CUBIN}


@kernelsearch.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=4),
                                triton.Config({"BLOCK": 64}, num_warps=2)], key=["n"])
@triton.jit
def _undeclared_scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3, mask=m)


def scale3(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _undeclared_scale[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


@pytest.fixture
def host(at_store: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setattr(compiled, "_host_environment", lambda: tuple(sorted(ENV.items())))
    # Triton's compiled kernel as the interpreter cannot make it: the synthetic group.
    monkeypatch.setattr(compiled, "group_of", lambda handle: (KEY, "k.json", dict(FILES)))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "first-host"))
    monkeypatch.setenv("KS_DATABASE_URL", at_store.url)
    monkeypatch.delenv("KS_SERVICE_URL", raising=False)
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "tune")
    artifacts.reset()
    yield at_store
    BACKENDS.drain(10.0)
    artifacts.reset()


@pytest.mark.parametrize("kernel, call", [(accumulate_kernel, accumulate), (_undeclared_scale, scale3)])
def test_tuned_here_uploads_and_a_fresh_host_installs(host: Any, kernel: Any, call: Any,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    kernel.forget()
    # Triton's benchmark made to rank the second config first (a correct one; the interpreter's
    # wall-clock timings would pick any).
    monkeypatch.setattr(kernel, "_bench", lambda *a, config, **k: [
        1.0 if config is kernel.configs[1] else 2.0] * 3)
    x = torch.randn(100)
    call(x.clone())
    assert list(kernel.sources.values()) == [Source.TUNED_HERE]
    BACKENDS.drain(30.0)
    [rec] = host.list_records(kernel._name())
    [got] = host.artifacts_of_record(rec.id, compiled.fingerprint())
    assert got.files == FILES and got.cache_key == KEY and got.config == rec.config
    assert artifacts.STATS.uploaded == 1

    # A fresh host: its own empty Triton cache, served the record, compiles nothing.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-host"))
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    artifacts.reset()
    kernel.forget()
    assert compiled.read_group(KEY, "k.json") is None
    call(x.clone())
    assert list(kernel.sources.values()) == [Source.STORE]
    assert compiled.read_group(KEY, "k.json") == FILES
    assert artifacts.STATS.installed == 1 and artifacts.STATS.uploaded == 0
