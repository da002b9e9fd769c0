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
import logging
import os
import re
import threading
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

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
_ET_DYN = 3  # e_type of a shared object
_PT_DYNAMIC, _PT_INTERP = 2, 3  # program headers of a dynamically linked ELF

log = logging.getLogger(__name__)
# The groups whose launcher build failed and was reported: a host that installs the same group
# again (another served key) does not repeat the warning.
_LAUNCHER_FAILED: set[tuple[str, str]] = set()
_LAUNCHER_FAILED_LOCK = threading.Lock()


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
    if data[:2] == b"PK":
        return f"{name}: a zip archive is never stored"
    if data[:1] == b"\x80" or _is_pickle(data):
        return f"{name}: a pickle stream is never stored"
    if low.endswith(".cubin"):
        return _cubin_refusal(name, data)
    if data[:4] == _ELF:
        return f"{name}: an ELF file that is not a CUDA cubin (a shared library?)"
    if b"\0" in data:
        return f"{name}: binary data where Triton writes text (only a .cubin is binary)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"{name}: not UTF-8 text (only a .cubin is binary)"
    if low.endswith(".json"):
        try:
            json.loads(text)
        except ValueError:
            return f"{name}: not JSON"
    return None


def _is_pickle(data: bytes) -> bool:
    """Whether `data` is a whole pickle stream of any protocol (0 and 1 are printable text, so
    no magic number tells them): its opcodes parse to the final STOP."""
    import pickletools

    if not data or data.rstrip()[-1:] != b".":
        return False
    try:
        for op, _arg, pos in pickletools.genops(data):
            if op.name == "STOP":
                return pos is not None and not data[pos + 1:].strip()
    except Exception:  # noqa: BLE001 - not a pickle: genops fails on the first foreign byte
        return False
    return False


def _cubin_refusal(name: str, data: bytes) -> str | None:
    """Why `data` is no CUDA cubin: an ELF for EM_CUDA that is not a shared object and has no
    dynamic linking (no PT_DYNAMIC, PT_INTERP), so a shared library whose header was patched
    to say CUDA is still refused."""
    if data[:4] != _ELF or len(data) < 52:
        return f"{name}: a .cubin is a CUDA ELF file"
    is64 = data[4:5] == b"\x02"
    order: Literal["big", "little"] = "big" if data[5:6] == b"\x02" else "little"

    def num(at: int, size: int) -> int:
        return int.from_bytes(data[at:at + size], order)

    if num(18, 2) != _EM_CUDA:
        return f"{name}: an ELF file that is not a CUDA cubin (a shared library?)"
    if num(16, 2) == _ET_DYN:
        return f"{name}: a shared object, not a CUDA cubin"
    phoff, phentsize, phnum = (num(32, 8), num(54, 2), num(56, 2)) if is64 else \
        (num(28, 4), num(42, 2), num(44, 2))
    for i in range(min(phnum, 256)):
        at = phoff + i * phentsize
        if at + 4 > len(data):
            return f"{name}: an ELF whose program headers lie outside it"
        if num(at, 4) in (_PT_DYNAMIC, _PT_INTERP):
            return f"{name}: an ELF linked dynamically (a shared library), not a CUDA cubin"
    return None


def function_names(kdef: Any) -> frozenset[str]:
    """The names Triton gives the compiled kernels of `kdef` (each launched `@triton.jit`
    function's name: the metadata's `name`, the group's `<name>.json`): its declared
    `triton_kernels`, or an undeclared kernel's own function."""
    names = {getattr(getattr(k, "fn", k), "__name__", None) for k in getattr(kdef, "triton_kernels", ())}
    defn = getattr(kdef, "definition", None)
    if defn is not None:
        names.add(str(defn.qualname).rsplit(".", 1)[-1])
    return frozenset(n for n in names if isinstance(n, str) and n)


def binding_refusal(cache_key: str, group: str, files: Mapping[str, bytes], *,
                    functions: Collection[str] | None,
                    config: Mapping[str, Any] | None) -> str | None:
    """Why a compile group is not what it claims (None: it is): its metadata's `hash` is its
    cache key, its `name` one of the record's kernel's functions (`functions`; None: not
    checked) and the group file `<name>.json` (the file Triton looks for when it compiles that
    function, never another's), every file of the group named `<name>.<suffix>`, and its launch
    options and constants those of the record's `config` where the metadata has them."""
    try:
        meta = json.loads(files[group])
    except (KeyError, ValueError):
        return f"{group}: the group's metadata file is not JSON"
    if not isinstance(meta, dict):
        return f"{group}: the group's metadata is not a JSON object"
    name = meta.get("name")
    if not isinstance(name, str) or group != f"{name}.json":
        return f"{group}: the group file must be the metadata's kernel name ({name!r}) + .json"
    if meta.get("hash", cache_key) != cache_key:
        return f"{group}: the metadata's hash is not the set's cache_key"
    if functions is not None and name not in functions:
        return (f"{group}: compiles {name!r}, which is not a Triton function of the record's "
                f"kernel ({', '.join(sorted(functions)) or 'none declared'})")
    for fname in files:
        if fname.rsplit(".", 1)[0] != name:
            return f"{fname}: every file of the group is named {name}.<suffix>"
    if config is not None:
        consts: dict[str, Any] = meta["constants"] if isinstance(meta.get("constants"), dict) else {}
        for opt in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
            if meta.get(opt) is not None and opt in config and meta[opt] != config[opt]:
                return f"{group}: {opt} is {meta[opt]!r}, the record's config has {config[opt]!r}"
        for k, v in consts.items():
            if k in config and v != config[k]:
                return f"{group}: constant {k} is {v!r}, the record's config has {config[k]!r}"
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
        except Exception as exc:  # Triton builds it at the first launch, as without a spec
            _warn_launcher_failed(files, spec, exc)
            return False

    todo = [g for g in groups if any(n.endswith(LAUNCHER_SUFFIX) for n in g)]
    nv = _cuda_driver() if todo else None
    if nv is None:
        return 0
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo)))) as pool:
        return sum(pool.map(one, todo))


def _warn_launcher_failed(files: Mapping[str, bytes], spec: bytes | None, exc: Exception) -> None:
    """One WARNING per group whose launcher build failed, naming its kernel and the error: the
    first launch then builds it (slower) or fails the same way, and says nothing of why."""
    name = next((n[:-len(LAUNCHER_SUFFIX)] for n in files if n.endswith(LAUNCHER_SUFFIX)), "?")
    ident = (name, sha256_hex(spec or b"") + sha256_hex(files.get(f"{name}.json", b"")))
    with _LAUNCHER_FAILED_LOCK:
        if ident in _LAUNCHER_FAILED:
            return
        _LAUNCHER_FAILED.add(ident)
    log.warning("the launcher of compiled kernel %s (group %s) was not built ahead; Triton builds "
                "it at its first launch: %s: %s", name, f"{name}.json", type(exc).__name__, exc)


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
    (`refusal`), the metadata file is among them and the group is bound to its key
    (`binding_refusal`). A group already there is kept; a set naming a file that is there
    already (another group's cubin) is refused, never written over it: each file is linked into
    place only where none is (`_put_new`)."""
    from triton.runtime.cache import get_cache_manager

    if group not in files or set(files) != set(hashes) or not re.fullmatch(r"[0-9a-f]{64}", cache_key):
        return False
    for name, data in files.items():
        if sha256_hex(data) != hashes[name] or refusal(name, data):
            return False
    if binding_refusal(cache_key, group, files, functions=None, config=None):
        return False
    manager = get_cache_manager(cache_key)
    if manager.get_group(group):
        return True
    if any(manager.get_file(name) is not None for name in files):
        return False
    paths = {}
    for name, data in files.items():
        path = _put_new(manager, name, data)
        if path is None:
            return False
        paths[name] = path
    manager.put_group(group, paths)
    return True


def _put_new(manager: Any, name: str, data: bytes) -> str | None:
    """Write one file of a new group: in a file cache, into a temporary file linked to its name
    (the link fails where a file is there, so nothing is replaced, and a reader sees the whole
    file or none); through another cache manager, its own `put` after the caller's check."""
    import tempfile

    cache_dir = getattr(manager, "cache_dir", None)
    if not isinstance(cache_dir, str) or not os.path.isdir(cache_dir):
        return str(manager.put(data, name, binary=True))
    final = os.path.join(cache_dir, name)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.link(tmp, final)
    except FileExistsError:
        return None
    except OSError:  # a file system without hard links: created only where none is
        try:
            with open(final, "xb") as f:
                f.write(data)
        except FileExistsError:
            return None
    finally:
        os.unlink(tmp)
    return final
