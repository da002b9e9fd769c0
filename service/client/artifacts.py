"""Compiled kernels served with their configs (`kernelsearch.artifacts`).

A host served a config still compiles it; the store keeps the compile group (Triton's cubin,
its metadata json and IRs; never a shared library or a pickle) of each served config, and this
module installs it into the local Triton cache before the key's first launch, so that
`triton.compiler.compile` finds it under its own cache key and compiles nothing (the launcher
`.so` is built here, as always). A group is loaded only under this host's compile fingerprint
(`kernels.compiled.environment`: target, driver, ptxas, Triton build, which Triton's key leaves
out in part), after each file's sha256 is checked, and only where it is bound to what it
claims (the cache key asked for; its record's kernel functions and config); anything else (no
set, another fingerprint, a failed hash, a set of another kernel or key, an unreachable
service) is a compile as before, never an error.

A process that tuned and shared a key uploads the group it compiled for the winner, tied to
the record the store answered. `prefetch()` (or `KS_PREFETCH=1` at the first lookup) fetches
the groups of the device's current records, oldest first, page by page within its budget.
"""
from __future__ import annotations

import atexit
import base64
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.kernels import compiled
from . import guard
from .backends import BACKENDS, in_daemon_thread
from .options import Options

log = logging.getLogger(__name__)

PREFETCH_ENV = "KS_PREFETCH"
# A first launch waits this long at most for the background prefetch the user asked for.
PREFETCH_WAIT_S = 10.0


@dataclass
class Stats:
    """What this module did in this process (tests and the benchmarks read it)."""

    installed: int = 0
    launchers: int = 0  # launchers built at install, before the first launch (from the specs)
    uploaded: int = 0
    rejected: int = 0
    fetched_sets: int = 0
    prefetch_s: float = 0.0  # the prefetch's own time (in the background under KS_PREFETCH=1)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, what: str, n: float = 1) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + n)


STATS = Stats()
_lock = threading.Lock()
_asked: set[int] = set()          # records whose sets this process asked for already
_asked_keys: set[str] = set()     # Triton cache keys asked for already
_prefetched = False
_prefetch_future: Future | None = None
# Rendezvous of a shared key: its record's id (from the store's answer) and its compiled
# kernel (from the first launch), whichever comes second uploads the group.
_records: dict[tuple[str, str, str], int] = {}
_handles: dict[tuple[str, str, str], Any] = {}
_uploaded: set[tuple[str, str, str]] = set()


def reset() -> None:
    """Forget what this process fetched, installed and noted, and its counts (tests)."""
    global _prefetched, _prefetch_future
    with STATS.lock:
        STATS.installed = STATS.launchers = STATS.uploaded = STATS.rejected = STATS.fetched_sets = 0
        STATS.prefetch_s = 0.0
    with _lock:
        _asked.clear()
        _asked_keys.clear()
        _records.clear()
        _handles.clear()
        _uploaded.clear()
        _helion_pending.clear()
        _prefetched = False
        _prefetch_future = None


def _backends(slow: bool = False) -> tuple[Any, Any]:
    """(the service's client, the local store), as the decorator's resolver has them: the
    lookups' client (bounded as a lookup is: a key's first launch waits on it) unless `slow`
    (uploads and an explicit prefetch, off the launch's path or asked for)."""
    BACKENDS.ensure()
    client = (BACKENDS.writer if slow else BACKENDS.client) if BACKENDS.up("service") else None
    return client, BACKENDS.store


def _wire(view: Any) -> dict[str, Any]:
    """A store's ArtifactSetView in the route's shape (files base64 with their sha256)."""
    return {"id": view.id, "record_id": view.record_id, "cache_key": view.cache_key,
            "group": view.group, "env_fingerprint": view.env_fingerprint, "kernel": view.kernel,
            "config": dict(view.config),
            "files": {n: {"sha256": compiled.sha256_hex(d), "data": base64.b64encode(d).decode()}
                      for n, d in view.files.items()}}


def _functions(kernel: Any) -> frozenset[str] | None:
    """The Triton function names of the kernel of that name in this process (None: not known
    here, so a set's name is bound by its record's config and its own consistency alone)."""
    from kernelsearch.kernels import registry

    try:
        return compiled.function_names(registry.get_kernel(str(kernel))) or None
    except KeyError:
        return None


def _why_not(st: Mapping[str, Any], mine: str, cache_key: str | None,
             record_id: int | None) -> str | None:
    """Why a set from an answer is not installed here (None: it is, once its hashes hold): not
    this fingerprint, not the cache key asked for, not the record asked for, or not a group
    of its record's kernel and config (`compiled.binding_refusal`)."""
    if st.get("env_fingerprint") != mine:
        return "another compile fingerprint"
    if cache_key is not None and st.get("cache_key") != cache_key:
        return f"answered for cache key {str(st.get('cache_key'))[:12]}, asked for {cache_key[:12]}"
    if record_id is not None and st.get("record_id") != record_id:
        return f"answered for record {st.get('record_id')}, asked for record {record_id}"
    files = {n: base64.b64decode(f["data"], validate=True) for n, f in st["files"].items()}
    config = st.get("config")
    return compiled.binding_refusal(
        str(st["cache_key"]), str(st["group"]), files,
        functions=_functions(st["kernel"]) if st.get("kernel") else None,
        config=config if isinstance(config, Mapping) else None)


def install(sets: Sequence[Mapping[str, Any]], *, cache_key: str | None = None,
            record_id: int | None = None) -> int:
    """Install each set whose fingerprint is this host's, that is bound to what it claims
    (`_why_not`: the key or record asked for, its record's kernel and config) and whose files
    all hash to what the set says, then build their launchers at once
    (`compiled.build_launchers`: each launch would build its own, one after another); how many
    sets were installed. A set refused or malformed is logged and counted in STATS.rejected;
    the others beside it are installed all the same."""
    mine, done = compiled.fingerprint(), []
    for st in sets:
        try:
            why = _why_not(st, mine, cache_key, record_id)
            files = {n: base64.b64decode(f["data"], validate=True) for n, f in st["files"].items()}
            hashes = {n: str(f["sha256"]) for n, f in st["files"].items()}
            if why is None and not compiled.install_group(str(st["cache_key"]), str(st["group"]),
                                                          files, hashes):
                why = "a hash, a file or a file already in the cache refused it"
        except Exception as exc:  # noqa: BLE001 - one malformed set costs only itself
            why = f"malformed ({type(exc).__name__}: {exc})"
        if why is None:
            done.append(files)
        else:
            log.warning("kernelsearch: a compiled kernel's set was not installed (%s); compiling",
                        why)
            STATS.add("rejected")
    STATS.add("installed", len(done))
    STATS.add("launchers", compiled.build_launchers(done))
    return len(done)


def _fetch(record_id: int | None = None, cache_key: str | None = None) -> list[dict[str, Any]]:
    client, store = _backends()
    fp = compiled.fingerprint()
    sets: list[dict[str, Any]] = []
    if store is not None:
        try:
            views = (store.artifacts_of_record(record_id, fp) if record_id is not None
                     else store.artifacts_by_cache_key(cache_key, fp))
            sets = [_wire(v) for v in views]
        except Exception as exc:  # a store without the table (older schema): the service
            log.debug("local store has no compiled kernels: %s", exc)
    if not sets and client is not None:
        sets = _asking_service(lambda: client.artifacts(fp, record_id=record_id, cache_key=cache_key),
                               Options.from_env().timeout_s)
    STATS.add("fetched_sets", len(sets))
    return sets


def _asking_service(ask: Any, wait_s: float | None = None) -> Any:
    """A request to the service, through the backends' one bounded call when it is on a first
    launch's path (`wait_s`: the lookups' bound, KS_AUTOTUNE_TIMEOUT_S) and their one back-off:
    a failure, or no answer in time, leaves the service alone for KS_AUTOTUNE_RETRY_S (a cold
    host's compiles ask no more)."""
    if wait_s is not None:
        fut = BACKENDS.bounded(ask, wait_s, source="service")
        if not fut.done():
            raise TimeoutError(f"no compiled kernels within {wait_s:g} s")
        ask = fut.result
    try:
        return ask()
    except Exception as exc:
        BACKENDS.failed("service", exc)
        raise


def record_id_of(found: Any) -> int | None:
    """The id of the record a resolver's answer came from (a store's view, a service's JSON)."""
    rec = getattr(found, "record", None)
    rid = rec.get("id") if isinstance(rec, Mapping) else getattr(rec, "id", None)
    return int(rid) if isinstance(rid, int) else None


def before_first_launch(kernel: str, found: Any) -> None:
    """A served key on this host, before its first launch: install its record's compile groups
    (once per record and process). Inside the guard: any failure is a compile as today."""
    def body() -> None:
        if not compiled.compiles_here():
            return
        _await_prefetch()
        rid = record_id_of(found)
        if rid is None:
            return
        with _lock:
            if rid in _asked:
                return
            _asked.add(rid)
        install(_fetch(record_id=rid), record_id=rid)

    guard.guarded(kernel, "installing the served compiled kernel", body, None)


def group_for_cache_key(cache_key: str) -> bool:
    """Triton's cache manager missed this compile group: install it from the store or service
    (one request per key and process; none after a prefetch); whether it is there now.
    Never raises (a failure is a miss: Triton compiles)."""
    def body() -> bool:
        if not compiled.compiles_here():
            return False
        _await_prefetch()
        with _lock:
            asked = cache_key in _asked_keys
            _asked_keys.add(cache_key)
        if asked or _prefetched:  # a prefetch installed every group there is
            return False
        return install(_fetch(cache_key=cache_key), cache_key=cache_key) > 0

    return guard.guarded(cache_key[:12], "fetching a compile group", body, False)


def prefetch_soon() -> None:
    """Under KS_PREFETCH=1, start this process's prefetch in the background (once), at its first
    decorated kernel: the request, the installs and the launcher builds overlap the program's
    own start-up instead of its first calls."""
    global _prefetch_future
    if os.environ.get(PREFETCH_ENV) != "1":
        return
    with _lock:
        if _prefetch_future is not None or _prefetched:
            return
        _prefetch_future = in_daemon_thread(prefetch)


def _await_prefetch() -> None:
    """Under KS_PREFETCH=1, before a served key's first launch: the prefetch has installed what
    it found (the background one waited on for at most PREFETCH_WAIT_S, else run now). Past
    the bound the key's own set is fetched, as without a prefetch."""
    if os.environ.get(PREFETCH_ENV) != "1" or _prefetched:
        return
    fut = _prefetch_future
    if fut is None:
        prefetch()
        return
    try:
        fut.result(timeout=PREFETCH_WAIT_S)
    except Exception:  # noqa: BLE001 - past the bound: the key's own set is asked for
        pass


def prefetch(kernels: Sequence[str] | None = None, device: str | None = None,
             max_bytes: int | None = None) -> int:
    """Fetch the compile groups of this device's current records (optionally of these kernels),
    oldest first, page by page up to `max_bytes` (default KS_PREFETCH_MAX_BYTES; each page sized
    by the store before a file is read, so nothing past the budget is ever loaded), and install
    those of this host's fingerprint into the local Triton cache, so the first calls compile
    nothing; how many were installed. `device`: the name records are keyed by (default: this
    process's CUDA device). Never raises: 0 on any failure."""

    def body() -> int:
        global _prefetched
        import torch

        from kernelsearch.service.client_settings import client_settings

        t0 = time.perf_counter()

        client, store = _backends(slow=True)
        name = device or (torch.cuda.get_device_name() if torch.cuda.is_available() else None)
        if name is None or not compiled.compiles_here():
            return 0
        fp = compiled.fingerprint()
        budget = client_settings().prefetch_max_bytes if max_bytes is None else max_bytes
        sets = _prefetch_pages(client, store, name, fp, kernels, budget)
        STATS.add("fetched_sets", len(sets))
        with _lock:
            _asked.update(int(s["record_id"]) for s in sets if isinstance(s.get("record_id"), int))
        done = install(sets)
        with _lock:
            _prefetched = True
        STATS.add("prefetch_s", time.perf_counter() - t0)
        return done

    with _lock:
        if _prefetched and kernels is None:
            return 0
    return guard.guarded("kernelsearch", "prefetching compiled kernels", body, 0)


def _size(st: Mapping[str, Any]) -> int:
    """A set's bytes as stored (its files' base64, decoded length, without decoding)."""
    def one(data: str) -> int:
        return len(data) * 3 // 4 - data.endswith("=") - data.endswith("==")

    return sum(one(str(f.get("data", ""))) for f in st.get("files", {}).values())


def _prefetch_pages(client: Any, store: Any, device: str, fp: str,
                    kernels: Sequence[str] | None, budget: int) -> list[dict[str, Any]]:
    """The device's sets, oldest first, page after page (the local store's, else the
    service's) while `budget` bytes are left: each page asks for at most what is left."""
    def local(after: int, left: int) -> list[dict[str, Any]]:
        return [_wire(v) for v in store.artifacts_for_device(device, fp, kernels, left, after=after)]

    def remote(after: int, left: int) -> list[dict[str, Any]]:
        return _asking_service(lambda: client.device_artifacts(device, fp, kernels, after=after,
                                                               max_bytes=left))

    for page in ([local] if store is not None else []) + ([remote] if client is not None else []):
        sets: list[dict[str, Any]] = []
        after, left = 0, budget
        try:
            while left > 0:
                got = [st for st in page(after, left) if int(st["id"]) > after]
                fitting = []
                for st in got:
                    if _size(st) > left:
                        left = 0
                        break
                    left -= _size(st)
                    fitting.append(st)
                sets += fitting
                if not got or len(fitting) < len(got):
                    break
                after = int(got[-1]["id"])
        except Exception as exc:  # noqa: BLE001 - a store without the table: the service
            if page is remote:
                raise
            log.debug("local store has no compiled kernels: %s", exc)
        if sets:
            return sets
    return []


def _helion_sets(key: str) -> list[dict[str, Any]]:
    client, store = _backends()
    fp = compiled.fingerprint()
    sets: list[dict[str, Any]] = []
    if client is not None:
        sets = _asking_service(lambda: client.helion_artifacts(key, fp),
                               Options.from_env().timeout_s)
    elif store is not None:
        sets = [_wire(v) for v in store.artifacts_of_helion_entry(key, fp)]
    STATS.add("fetched_sets", len(sets))
    return sets


def before_helion_compile(key: str) -> int:
    """Helion's backend answered the entry under Helion's cache key `key`: install the compile
    groups of the Triton kernel generated for its config (this fingerprint, every hash checked)
    before Helion compiles it, so Triton's cache hits. Once per key and process; how many sets
    were installed. Never raises: a failure is a compile as today."""
    def body() -> int:
        if not compiled.compiles_here():
            return 0
        with _lock:
            if f"helion:{key}" in _asked_keys:
                return 0
            _asked_keys.add(f"helion:{key}")
        return install(_helion_sets(key))

    return guard.guarded(f"helion entry {key[:12]}", "installing Helion's compiled kernel", body, 0)


_helion_pending: dict[str, Any] = {}  # Helion keys stored here whose kernel has not run yet


def note_helion_put(key: str, kernels: Any, wait_s: float = 120.0, poll_s: float = 0.2) -> None:
    """This process stored Helion's entry under `key`: once the kernel has run (`kernels()`, the
    compiled Triton kernels its generated code holds, is non-empty; Helion compiles after it
    puts the entry), upload their compile groups tied to the entry, in the background. Watched
    for `wait_s` by a daemon thread and looked at once more at exit (a short program ends
    before the watch sees its run); a kernel never run here uploads nothing."""
    with _lock:
        if ("helion", key, "") in _uploaded or key in _helion_pending:
            return
        _helion_pending[key] = kernels

    def wait() -> None:  # a daemon: a kernel that never runs holds up no exit
        deadline = time.monotonic() + wait_s
        while key in _helion_pending and time.monotonic() < deadline:
            if _helion_upload_if_run(key, kernels, background=True):
                return
            time.sleep(poll_s)
        with _lock:
            _helion_pending.pop(key, None)

    in_daemon_thread(wait)


def _helion_upload_pending() -> None:
    """At exit: the kernels stored here that ran since the watch last looked upload now."""
    for key, kernels in list(_helion_pending.items()):
        _helion_upload_if_run(key, kernels, background=False)


atexit.register(_helion_upload_pending)  # after the backends' drain is registered: runs first


def _helion_upload_if_run(key: str, kernels: Any, background: bool) -> bool:
    """Upload the compile groups of `kernels()` for the entry under `key` when there are any
    (once per key and process); whether they were taken."""
    what = f"helion entry {key[:12]}"
    handles: list[Any] = guard.guarded(what, "reading Helion's compiled kernel", kernels, [])
    if not handles:
        return False
    with _lock:
        if _helion_pending.pop(key, None) is None:
            return True  # taken by the other looker
        _uploaded.add(("helion", key, ""))

    def upload() -> None:
        client, store = _backends(slow=True)
        env = compiled.environment()
        for got in filter(None, map(compiled.group_of, handles)):
            cache_key, group, files = got
            if client is not None:
                client.upload_helion_artifacts(key, {
                    "cache_key": cache_key, "group": group, "env": env,
                    "files": {n: base64.b64encode(d).decode() for n, d in files.items()}})
            elif store is not None:
                store.put_helion_artifacts(key, cache_key=cache_key, env=env,
                                           env_fingerprint=compiled.env_fingerprint(env),
                                           group=group, files=files,
                                           origin=RecordOrigin.UPLOAD.value)
            else:
                return
            STATS.add("uploaded")

    def task() -> None:
        guard.guarded(what, "sharing Helion's compiled kernel", upload, None)

    if background:
        BACKENDS.in_background(task)
    else:
        task()
    return True


def _slot(kernel: str, axes: Mapping[str, Any], config: Any) -> tuple[str, str, str]:
    from kernelsearch.db.checks import axes_key
    from kernelsearch.kernels.configs import canonical_key

    return kernel, axes_key(dict(axes)), canonical_key(config)


def note_compiled(kernel: str, axes: Mapping[str, Any], config: Any, handle: Any) -> None:
    """The first launch of a key this process tuned (and shares) returned `handle`: upload its
    compile group once the record's id is known (`note_record`)."""
    slot = _slot(kernel, axes, config)
    with _lock:
        _handles[slot] = handle
        rid = _records.get(slot)
    if rid is not None:
        _upload(slot, rid)


def note_record(record: Any, record_id: int | None) -> None:
    """A record this process tuned was stored (by the service or the local store) as
    `record_id`: upload the compile group of its config once it is compiled here."""
    if record_id is None:
        return
    slot = _slot(record.kernel, record.axes, record.config)
    with _lock:
        _records[slot] = int(record_id)
        known = slot in _handles
    if known:
        _upload(slot, int(record_id))


BACKENDS.stored_listeners.append(note_record)


def _upload(slot: tuple[str, str, str], record_id: int) -> None:
    with _lock:
        if slot in _uploaded:
            return
        _uploaded.add(slot)
        handle = _handles.pop(slot, None)

    def body() -> None:
        got = compiled.group_of(handle)
        if got is None:
            return
        cache_key, group, files = got
        env = compiled.environment()
        client, store = _backends(slow=True)
        if client is not None:
            client.upload_artifacts({
                "record_id": record_id, "cache_key": cache_key, "group": group, "env": env,
                "files": {n: base64.b64encode(d).decode() for n, d in files.items()}})
        elif store is not None:
            store.put_artifacts(record_id, cache_key=cache_key, env=env,
                                env_fingerprint=compiled.env_fingerprint(env), group=group,
                                files=files, origin=RecordOrigin.UPLOAD.value)
        else:
            return
        STATS.add("uploaded")

    BACKENDS.in_background(lambda: guard.guarded(slot[0], "sharing the compiled kernel", body, None))
