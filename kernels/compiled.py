"""Compiled kernels as files: what a Triton compile group holds, the compile fingerprint a host
loads one under, and reading or installing a group in the local Triton cache. One definition for
the service's routes, the workers and the user's process (`kernelsearch.artifacts`).

A Triton compile group is its metadata json, its binary and its IRs. Never a shared library
(the launcher is built on each host, as Triton builds it) and never a pickle: both are code that
runs on load. A name outside `SUFFIXES`, a path, an ELF that is not a CUDA cubin, or a pickle
stream is refused, whatever its name says.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

# Triton 3.6's CUDA group: <name>.json (metadata), .cubin, .ptx, .ttir, .ttgir, .llir, .source;
# and <name>.launcher: the kernel's argument types as JSON (data, not code), from which a host
# that installs the group generates its launcher's C source with its own Triton and builds it
# before the first launch, several kernels' launchers at once (`build_launchers`).
LAUNCHER_SUFFIX = ".launcher"
SUFFIXES = (".json", ".cubin", ".ptx", ".ttir", ".ttgir", ".llir", ".source", LAUNCHER_SUFFIX)
# An argument type a launcher spec may name: Triton's scalar and pointer types, constexpr and
# nvTmaDesc (tensor descriptors are left to Triton's own build at the first launch).
_ARG_TYPE = re.compile(r"\*?k?(i1|i8|i16|i32|i64|u1|u8|u16|u32|u64|fp8e4nv|fp8e5|fp8e4b15|fp8e4b8|"
                       r"fp8e5b16|fp16|bf16|fp32|f32|fp64)|constexpr|nvTmaDesc")
CODE_SUFFIXES = (".so", ".pyd", ".dll", ".dylib", ".pkl", ".pickle", ".pt", ".pyc")
MAX_NAME_CHARS = 200
GROUP_PREFIX = "__grp__"
_ELF = b"\x7fELF"
_EM_CUDA = 190  # e_machine of a CUDA cubin


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refusal(name: str, data: bytes) -> str | None:
    """Why a file may not be stored or installed (None: it may)."""
    low = name.lower()
    if not name or len(name) > MAX_NAME_CHARS or "/" in name or "\\" in name or name.startswith(".") \
            or any(ord(c) < 32 for c in name):
        return f"{name!r}: a plain file name of at most {MAX_NAME_CHARS} characters"
    if low.startswith(GROUP_PREFIX):
        return f"{name}: the group file is written by the host that installs the set"
    if low.endswith(CODE_SUFFIXES) or ".so." in low:
        return f"{name}: shared libraries and pickles are never stored (code that runs on load)"
    if not low.endswith(SUFFIXES):
        return f"{name}: not a Triton compile file ({', '.join(SUFFIXES)})"
    if low.endswith(LAUNCHER_SUFFIX) and launcher_signature(data) is None:
        return f"{name}: a launcher spec is a JSON list of Triton argument types"
    if data[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
        return f"{name}: a pickle stream is never stored"
    if data[:4] == _ELF:
        machine = int.from_bytes(data[18:20], "big" if data[5:6] == b"\x02" else "little")
        if not low.endswith(".cubin") or machine != _EM_CUDA:
            return f"{name}: an ELF file that is not a CUDA cubin (a shared library?)"
    return None


def launcher_signature(data: bytes) -> tuple[Any, ...] | None:
    """The argument types a launcher spec holds (lists as tuples, as Triton has them), or None
    when it is not a JSON list of at most 512 types `_ARG_TYPE` accepts (nested: tuple args)."""
    def ok(v: Any, depth: int) -> bool:
        if isinstance(v, str):
            return _ARG_TYPE.fullmatch(v) is not None
        return isinstance(v, list) and depth < 3 and all(ok(x, depth + 1) for x in v)

    def tup(v: Any) -> Any:
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    try:
        sig = json.loads(data)
    except ValueError:
        return None
    if not isinstance(sig, list) or len(sig) > 512 or not all(ok(v, 0) for v in sig):
        return None
    return tuple(tup(v) for v in sig)


def launcher_spec(handle: Any) -> bytes | None:
    """A compiled kernel's launcher spec (its argument types in order, as JSON), or None when
    Triton's own build at the first launch is left to make its launcher (tensor descriptors)."""
    sig = getattr(getattr(handle, "src", None), "signature", None)
    if not isinstance(sig, Mapping):
        return None

    def js(v: Any) -> Any:
        return [js(x) for x in v] if isinstance(v, tuple) else v

    data = json.dumps([js(v) for v in sig.values()]).encode()
    return data if launcher_signature(data) is not None else None


def _cuda_driver() -> Any:
    """Triton's CUDA driver module when it is the active driver (its launchers are what
    `build_launchers` builds), else None (the interpreter, another backend)."""
    try:
        from triton.backends.nvidia import driver as nv
        from triton.runtime.driver import driver

        return nv if driver.active.launcher_cls is nv.CudaLauncher else None
    except Exception:
        return None


def build_launchers(groups: Sequence[Mapping[str, bytes]], workers: int = 8) -> int:
    """Build the launchers of installed groups into the local Triton cache at once (each a C
    compiler run, in threads), from each group's launcher spec and metadata with this host's
    Triton (`make_launcher`, `compile_module_from_src`: the file and cache key Triton's launch
    looks for, so it builds nothing); how many were built or found. Never raises."""
    from concurrent.futures import ThreadPoolExecutor

    def one(files: Mapping[str, bytes]) -> bool:
        try:
            spec = next((d for n, d in files.items() if n.endswith(LAUNCHER_SUFFIX)), None)
            meta = next((d for n, d in files.items() if n.endswith(".json")), None)
            sig = launcher_signature(spec) if spec is not None else None
            if sig is None or meta is None or nv is None:
                return False
            # CudaLauncher.__init__'s own two steps (its constants are unused by make_launcher).
            src = nv.make_launcher({}, dict(enumerate(sig)), json.loads(meta).get("tensordesc_meta"))
            nv.compile_module_from_src(src=src, name="__triton_launcher", library_dirs=nv.library_dirs(),
                                       include_dirs=nv.include_dirs, libraries=nv.libraries)
            return True
        except Exception:  # Triton builds it at the first launch, as without a spec
            return False

    todo = [g for g in groups if any(n.endswith(LAUNCHER_SUFFIX) for n in g)]
    nv = _cuda_driver() if todo else None
    if nv is None:
        return 0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo)))) as pool:
        return sum(pool.map(one, todo))


def env_fingerprint(env: Mapping[str, Any]) -> str:
    """The sha256 of what Triton's cache key leaves out (compute capability, CUDA driver, ptxas,
    Triton build), as canonical JSON: two hosts load each other's sets only when it is equal."""
    return sha256_hex(json.dumps(dict(env), sort_keys=True, separators=(",", ":")).encode())


# JSON merged over `environment()`: stands for another driver, ptxas or Triton build (what the
# GPU benchmark's "another host" sets), so that a host compiles instead of loading.
ENV_OVERRIDE = "KS_ARTIFACT_ENV"


@lru_cache(maxsize=1)
def _host_environment() -> tuple[tuple[str, str], ...]:
    import triton
    from triton.runtime.cache import triton_key
    from triton.runtime.driver import driver

    target = driver.active.get_current_target()
    env = {"target": f"{target.backend}:{target.arch}:{target.warp_size}",
           "triton": f"{triton.__version__}+{sha256_hex(triton_key().encode())[:16]}",
           "driver": _driver_version(), "ptxas": ""}
    if target.backend == "cuda":
        from triton.backends.nvidia.compiler import get_ptxas_version

        m = re.search(r"release (\S+), (V\S+)", get_ptxas_version(target.arch))
        env["ptxas"] = " ".join(m.groups()) if m else sha256_hex(get_ptxas_version(target.arch).encode())[:16]
    return tuple(sorted(env.items()))


def _driver_version() -> str:
    """The kernel driver's version (/proc/driver/nvidia/version) and the CUDA driver API's."""
    parts = []
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(\S+)", text)
        if m:
            parts.append(m.group(1))
    except OSError:
        pass
    try:
        ver = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(ver)) == 0:
            parts.append(f"cuda{ver.value}")
    except OSError:
        pass
    return " ".join(parts)


def compiles_here() -> bool:
    """Whether a Triton backend compiles on this host (a GPU's driver is active): under the
    interpreter nothing is compiled, so there is no compile group to install or share."""
    try:
        _host_environment()
        return True
    except Exception:  # noqa: BLE001 - no active driver (Triton's RuntimeError), no target
        return False


def environment() -> dict[str, str]:
    """What Triton's cache key leaves out and a loaded binary depends on: the device target
    (compute capability), the driver, ptxas and the Triton build; `KS_ARTIFACT_ENV` (JSON)
    overrides fields."""
    env = dict(_host_environment())
    extra = os.environ.get(ENV_OVERRIDE)
    if extra:
        env.update({str(k): str(v) for k, v in json.loads(extra).items()})
    return env


def fingerprint() -> str:
    """This host's `env_fingerprint(environment())`."""
    return env_fingerprint(environment())


def group_of(handle: Any) -> tuple[str, str, dict[str, bytes]] | None:
    """(Triton's cache key, the group's metadata file name, its files) of a compiled kernel
    (what `kernel[grid](...)` returns), read from the local cache; None when it has none to give
    (the interpreter) or a file is not one a set may hold."""
    cache_key = getattr(handle, "hash", None)
    paths = getattr(handle, "metadata_group", None)
    if not isinstance(cache_key, str) or not isinstance(paths, Mapping):
        return None
    group = next((n for n in paths if n.endswith(".json") and not n.startswith(GROUP_PREFIX)), None)
    if group is None:
        return None
    files = {name: Path(path).read_bytes() for name, path in paths.items()}
    spec = launcher_spec(handle)
    if spec is not None:
        files[group[: -len(".json")] + LAUNCHER_SUFFIX] = spec
    if any(refusal(n, d) for n, d in files.items()):
        return None
    return cache_key, group, files


def jit_handles(jit_fn: Any) -> list[Any]:
    """The compiled kernels a Triton `JITFunction` holds in memory (what its launches compiled or
    loaded in this process, on every device), read as Helion reads its own kernel's cache key
    (`TritonBackend.compiled_cache_key`); empty when the layout is another Triton's."""
    try:
        return [k for caches in jit_fn.device_caches.values() for k in caches[0].values()]
    except (AttributeError, IndexError, TypeError):
        return []


def helion_handles(bound: Any) -> list[Any]:
    """The compiled Triton kernels of a Helion bound kernel's chosen config in this process:
    its generated code's `_helion_<name>` JITFunction, as Helion's own Triton backend reads
    them (`compiled_cache_key`); empty until the kernel has run."""
    run = getattr(bound, "_run", None)
    name = getattr(getattr(bound, "kernel", None), "name", None)
    jit = getattr(run, "__globals__", {}).get(f"_helion_{name}") if name else None
    return jit_handles(jit) if jit is not None else []


def compiled_ref(handle: Any) -> dict[str, Any] | None:
    """What a worker keeps of a trial's compiled kernel to store its group beside the record:
    Triton's cache key, the group's metadata file name and this host's environment (read where
    the kernel ran, on the device). None under the interpreter (nothing compiled)."""
    got = group_of(handle)
    if got is None:
        return None
    ref = {"cache_key": got[0], "group": got[1], "env": environment()}
    spec = got[2].get(got[1][: -len(".json")] + LAUNCHER_SUFFIX)
    if spec is not None:
        ref["launcher"] = spec.decode()
    return ref


def read_group(cache_key: str, group: str) -> dict[str, bytes] | None:
    """The files of a group in the local Triton cache (through its cache manager), or None."""
    from triton.runtime.cache import get_cache_manager

    paths = get_cache_manager(cache_key).get_group(group)
    if not paths or group not in paths:
        return None
    return {name: Path(path).read_bytes() for name, path in paths.items()}


def install_group(cache_key: str, group: str, files: Mapping[str, bytes],
                  hashes: Mapping[str, str]) -> bool:
    """Write a group into the local Triton cache, where `triton.compiler.compile` finds it under
    its own cache key and compiles nothing; the group file (absolute paths) is written here.
    False, writing nothing, unless every file's sha256 is the one given, every file may be held
    (`refusal`) and the metadata file is among them. A group already there is kept."""
    from triton.runtime.cache import get_cache_manager

    if group not in files or set(files) != set(hashes) or not re.fullmatch(r"[0-9a-f]{64}", cache_key):
        return False
    for name, data in files.items():
        if sha256_hex(data) != hashes[name] or refusal(name, data):
            return False
    manager = get_cache_manager(cache_key)
    if manager.get_group(group):
        return True
    paths = {name: manager.put(data, name, binary=True) for name, data in files.items()}
    manager.put_group(group, paths)
    return True
