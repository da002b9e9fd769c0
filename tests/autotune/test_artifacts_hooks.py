"""The decorator's hooks of issue 34 under the interpreter (which compiles nothing, so Triton's
compiled kernel stands in as a synthetic compile group): a key tuned here uploads its winner's
group beside the record the store made of it, and a fresh host served that record installs the
group into its own Triton cache before the first launch."""
from __future__ import annotations

import base64
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
CUBIN = b"\x7fELF\x02\x01" + b"\0" * 10 + (2).to_bytes(2, "little") + (190).to_bytes(2, "little") \
    + b"\0" * 44 + b"body"


def stand_in(fn: str, **meta: Any) -> tuple[str, str, dict[str, bytes]]:
    """The compile group Triton would write for @triton.jit function `fn` (the interpreter
    compiles none): its own cache key, `<fn>.json` metadata naming it, its cubin."""
    key = hashlib.sha256(f"a compile of {fn}".encode()).hexdigest()
    cubin = CUBIN + fn.encode()
    return key, f"{fn}.json", {f"{fn}.json": json.dumps({"name": fn, "hash": key, **meta}).encode(),
                               f"{fn}.cubin": cubin}





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
    # Triton's compiled kernel as the interpreter cannot make it: the stand-in group.
    key, group, files = stand_in(kernel.fn.__name__, num_warps=2)
    monkeypatch.setattr(compiled, "group_of", lambda handle: (key, group, dict(files)))
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
    assert got.files == files and got.cache_key == key and got.config == rec.config
    assert artifacts.STATS.uploaded == 1

    # A fresh host: its own empty Triton cache, served the record, compiles nothing.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-host"))
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    artifacts.reset()
    kernel.forget()
    assert compiled.read_group(key, group) is None
    call(x.clone())
    assert list(kernel.sources.values()) == [Source.STORE]
    assert compiled.read_group(key, group) == files
    assert artifacts.STATS.installed == 1 and artifacts.STATS.uploaded == 0


def test_a_set_under_another_kernels_cache_key_is_never_installed(
        host: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two kernels tuned and shared with their own compile groups; a set stored beside the
    first's record under the second's cache key (with the second's files, as an older service
    took from any writer) is not installed by a host served the first, so the second still
    finds its own group; and an answer for another key than the one asked for is dropped."""
    groups = {k: stand_in(k.fn.__name__, num_warps=2) for k in (accumulate_kernel, _undeclared_scale)}
    current: list[Any] = [accumulate_kernel]
    monkeypatch.setattr(compiled, "group_of", lambda handle: (
        groups[current[0]][0], groups[current[0]][1], dict(groups[current[0]][2])))
    x = torch.randn(100)
    for kernel, call in ((accumulate_kernel, accumulate), (_undeclared_scale, scale3)):
        current[0] = kernel
        kernel.forget()
        monkeypatch.setattr(kernel, "_bench", lambda *a, config, kernel=kernel, **k: [
            1.0 if config is kernel.configs[1] else 2.0] * 3)
        call(x.clone())
        BACKENDS.drain(30.0)
    [rec_a] = host.list_records(accumulate_kernel._name())
    key_a, group_a, files_a = groups[accumulate_kernel]
    key_b, group_b, files_b = groups[_undeclared_scale]
    evil = {group_b: files_b[group_b], group_b[:-5] + ".cubin": CUBIN + b"evil"}
    host.put_artifacts(rec_a.id, cache_key=key_b, env=ENV, env_fingerprint=compiled.fingerprint(),
                       group=group_b, files=evil, origin="upload")

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fresh-host"))
    monkeypatch.setenv("KS_AUTOTUNE_FALLBACK", "first")
    artifacts.reset()
    accumulate_kernel.forget()
    accumulate(x.clone())
    assert compiled.read_group(key_a, group_a) == files_a
    assert compiled.read_group(key_b, group_b) is None
    assert artifacts.STATS.installed == 1 and artifacts.STATS.rejected == 1

    # Triton's cache manager asks for the second kernel's key: an answer of another key is
    # dropped; the second kernel's own set is installed as it is.
    answer = [{"record_id": rec_a.id, "cache_key": key_a, "group": group_a, "kernel": rec_a.kernel,
               "env_fingerprint": compiled.fingerprint(),
               "files": {n: {"sha256": hashlib.sha256(d).hexdigest(),
                             "data": base64.b64encode(d).decode()} for n, d in files_a.items()}}]
    with monkeypatch.context() as m:
        m.setattr(artifacts, "_fetch", lambda **kw: answer)
        assert artifacts.group_for_cache_key(key_b) is False
    _undeclared_scale.forget()
    scale3(x.clone())
    assert compiled.read_group(key_b, group_b) == files_b
