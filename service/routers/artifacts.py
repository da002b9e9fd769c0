"""/v1/artifacts: compiled kernels (Triton compile groups) stored beside the record whose config
they compile, content-addressed (sha256), and served to hosts whose compile fingerprint matches
(`kernelsearch.artifacts` installs them into the local Triton cache, after checking each hash).

Writes need the writer token, as record uploads do (workers write through the store). A shared
library, a pickle or a zip is refused here (422), whatever its name: the launcher is built on
each host. A set is stored only for what it compiles: its metadata names one of the record's
kernel's Triton functions, with the record's launch options (`compiled.binding_refusal`).
Reads need KS_READ_TOKEN (or the writer token) where one is set, and answer a bounded page
(KS_ARTIFACT_READ_MAX_BYTES, sized before any file is read)."""
from __future__ import annotations

import base64
import binascii
import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field, Strict, StringConstraints

from kernelsearch.db import errors as dberr
from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.db.views import ArtifactSetView
from kernelsearch.kernels.compiled import (binding_refusal, env_fingerprint, function_names,
                                           refusal, sha256_hex)
from kernelsearch.kernels.undeclared import MAX_NAME_CHARS

from ..deps import UNAUTHORIZED, SettingsDep, StoreDep, bearer, require_writer
from ..lookups import run_read
from .common import ERRORS, WRITE_ERRORS, check_text, kernel_or_404
from .records import ANONYMOUS, TOKEN_UPLOADER

router = APIRouter(tags=["artifacts"])

HEX64 = "^[0-9a-f]{64}$"
HELION_KEY = PathParam(pattern=HEX64, description="Helion's cache key (sha256 of its key, hex)")
# What a file's name and bytes may be is checked in the route (kernels.compiled.refusal), so a
# shared library or a pickle is refused with a message saying so.
FileName = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Base64 = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]*={0,2}$")]


class GroupIn(BaseModel):
    """One Triton compile group: `files` maps each file name to its bytes (base64); `group` is
    the metadata json Triton looks the group up by; `env` what Triton's cache key leaves out
    (compute capability, CUDA driver, ptxas, Triton build)."""

    cache_key: str = Field(pattern=HEX64, description="Triton's cache key (CompiledKernel.hash)")
    group: str = Field(min_length=1, max_length=200)
    env: dict[str, str | int | None] = Field(max_length=16)
    files: dict[FileName, Base64] = Field(min_length=1, max_length=16)


class ArtifactSetIn(GroupIn):
    """The compile group of a record's config."""

    record_id: Annotated[int, Strict()] = Field(ge=1, le=2**31 - 1)


class ArtifactFileOut(BaseModel):
    sha256: str
    data: str


class ArtifactSetOut(BaseModel):
    id: int
    record_id: int | None
    helion_key: str | None = None
    kernel: str
    axes: dict[str, Any]
    device: str
    config: dict[str, Any]
    cache_key: str
    env_fingerprint: str
    env: dict[str, Any]
    group: str
    origin: str
    is_current: bool
    files: dict[str, ArtifactFileOut]


def set_json(v: ArtifactSetView) -> dict[str, Any]:
    return {"id": v.id, "record_id": v.record_id, "helion_key": v.helion_key, "kernel": v.kernel, "axes": v.axes,
            "device": v.device, "config": v.config, "cache_key": v.cache_key,
            "env_fingerprint": v.env_fingerprint, "env": v.env, "group": v.group,
            "origin": v.origin, "is_current": v.is_current,
            "files": {n: {"sha256": sha256_hex(d), "data": base64.b64encode(d).decode()}
                      for n, d in v.files.items()}}


def _unprocessable(field: str, msg: str) -> HTTPException:
    return HTTPException(422, f"{field}: {msg}")


def _files(body: GroupIn, max_bytes: int) -> dict[str, bytes]:
    """The group's files decoded, each one a Triton compile file (422 otherwise, naming it), the
    metadata file among them, the whole within `max_bytes` (413)."""
    files: dict[str, bytes] = {}
    for name, text in body.files.items():
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise _unprocessable(f"files.{name}", "not base64") from None
        why = refusal(name, data)
        if why:
            raise _unprocessable(f"files.{name}", why)
        files[name] = data
    if body.group not in files:
        raise _unprocessable("group", f"{body.group} is not among the files")
    if sum(len(d) for d in files.values()) > max_bytes:
        raise HTTPException(413, f"the artifact set is over {max_bytes} bytes "
                                 "(KS_ARTIFACT_MAX_BYTES)")
    return files


async def require_reader(request: Request,
                         creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """Artifact reads need KS_READ_TOKEN or the writer token when KS_READ_TOKEN is set: each
    answer is megabytes of the store's, which an anonymous client may not ask for at will."""
    read = request.app.state.settings.read_token
    if read is None or not read.get_secret_value():  # KS_READ_TOKEN= (empty): not set
        return
    given = creds.credentials.encode() if creds is not None else b""
    allowed = [read.get_secret_value().encode(), request.app.state.writer_token]
    if not (given and any(t is not None and hmac.compare_digest(given, t) for t in allowed)):
        raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


def _uploads_allowed(settings: Any) -> None:
    if settings.artifacts_from_workers_only:
        raise HTTPException(403, "compiled kernels come from this service's workers only "
                                 "(KS_ARTIFACTS_FROM_WORKERS_ONLY)")


def _record_binding(store: Any, body: ArtifactSetIn, files: dict[str, bytes]) -> None:
    """404 without the record; 422 unless the set compiles one of the record's kernel's Triton
    functions with the record's config (its metadata: name, hash, launch options)."""
    owner = store.record_owner(body.record_id)
    if owner is None:
        raise HTTPException(404, f"record {body.record_id}: no such record")
    kernel, config = owner
    functions = function_names(kernel_or_404(kernel, store))
    if not functions:
        raise _unprocessable("group", f"{kernel} declares no triton_kernels to bind a compiled "
                                      "kernel to")
    why = binding_refusal(body.cache_key, body.group, files, functions=functions, config=config)
    if why:
        raise _unprocessable("group", why)


def _stored(put: Any, owner: int | str, body: GroupIn, request: Request,
            settings: Any, files: dict[str, bytes]) -> dict[str, Any]:
    """Store a group through `put` (the store's put for a record or a Helion entry) as an
    upload under the writer token; 409 when a set (a worker's, another upload's) holds its key
    and fingerprint with other files."""
    token = request.app.state.writer_token
    try:
        got = put(owner, cache_key=body.cache_key, env=body.env,
                  env_fingerprint=env_fingerprint(body.env), group=body.group, files=files,
                  origin=RecordOrigin.UPLOAD.value, uploaded_by=TOKEN_UPLOADER if token else ANONYMOUS,
                  uploaded_from=request.client.host if request.client else None,
                  max_uploads=settings.artifact_max_uploads)
    except dberr.Conflict as e:  # a stored set under the same key and fingerprint stays
        raise HTTPException(409, str(e)) from None
    return set_json(got)


@router.post("/v1/artifacts", status_code=201, response_model=ArtifactSetOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def upload_artifacts(body: ArtifactSetIn, request: Request, store: StoreDep,
                     settings: SettingsDep) -> Any:
    """Store a compile group for a record; never over a stored set of the same cache key and
    fingerprint (409; the same files again answer the stored set). 403: uploads are off
    (KS_ARTIFACTS_FROM_WORKERS_ONLY); 404: no such record; 413: over KS_ARTIFACT_MAX_BYTES;
    422: a file that is no Triton compile file (a shared library, a pickle, a zip, a path,
    another suffix), bad base64, a group without its metadata file, or a group that compiles
    no Triton function of the record's kernel with its config."""
    _uploads_allowed(settings)
    files = _files(body, settings.artifact_max_bytes)
    _record_binding(store, body, files)
    return _stored(store.put_artifacts, body.record_id, body, request, settings, files)


@router.post("/v1/helion/entries/{key}/artifacts", status_code=201, response_model=ArtifactSetOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def upload_helion_artifacts(body: GroupIn, request: Request, store: StoreDep,
                            settings: SettingsDep, key: str = HELION_KEY) -> Any:
    """Store the compile group of the Triton kernel Helion generated for the entry's config
    under Helion's cache key `key`, as for a record (404: no such entry; 403, 409, 413, 422
    alike; the entry's config's launch options bind the group's)."""
    _uploads_allowed(settings)
    files = _files(body, settings.artifact_max_bytes)
    entry = store.get_helion_entry(key)
    if entry is None:
        raise HTTPException(404, f"helion entry {key}: no such entry")
    why = binding_refusal(body.cache_key, body.group, files, functions=None,
                          config=dict(entry.config))
    if why:
        raise _unprocessable("group", why)
    return _stored(store.put_helion_artifacts, key, body, request, settings, files)


READS = [Depends(require_reader)]
AFTER = Query(0, ge=0, le=2**63 - 1, description="page on: the last set's id of the previous answer")


@router.get("/v1/helion/entries/{key}/artifacts", response_model=list[ArtifactSetOut],
            responses=ERRORS, dependencies=READS)
async def helion_artifacts(store: StoreDep, settings: SettingsDep, key: str = HELION_KEY,
                           env_fingerprint: str = Query(pattern=HEX64)) -> Any:
    """The compile groups of the Helion entry under `key` for this compile fingerprint (empty:
    none; Helion compiles), within KS_ARTIFACT_READ_MAX_BYTES."""
    return [set_json(v) for v in await run_read(
        lambda: store.artifacts_of_helion_entry(
            key, env_fingerprint, max_bytes=settings.artifact_read_max_bytes,
            workers_only=settings.artifacts_from_workers_only))]


@router.get("/v1/artifacts", response_model=list[ArtifactSetOut], responses=ERRORS,
            dependencies=READS)
async def record_artifacts(store: StoreDep, settings: SettingsDep,
                           record_id: int = Query(ge=1, le=2**31 - 1),
                           env_fingerprint: str = Query(pattern=HEX64), after: int = AFTER) -> Any:
    """A page of the compile groups of one record under this compile fingerprint, oldest first
    past `after`, within KS_ARTIFACT_READ_MAX_BYTES (empty: none left; the caller compiles)."""
    return [set_json(v) for v in await run_read(
        lambda: store.artifacts_of_record(
            record_id, env_fingerprint, after=after, max_bytes=settings.artifact_read_max_bytes,
            workers_only=settings.artifacts_from_workers_only))]


@router.get("/v1/artifacts/by-cache-key", response_model=list[ArtifactSetOut], responses=ERRORS,
            dependencies=READS)
async def cache_key_artifacts(store: StoreDep, settings: SettingsDep,
                              cache_key: str = Query(pattern=HEX64),
                              env_fingerprint: str = Query(pattern=HEX64)) -> Any:
    """The compile group of a current record under one Triton cache key and this fingerprint
    (what `kernelsearch.triton_cache` asks for when Triton's cache misses a group)."""
    return [set_json(v) for v in await run_read(
        lambda: store.artifacts_by_cache_key(
            cache_key, env_fingerprint, workers_only=settings.artifacts_from_workers_only))]


@router.get("/v1/artifacts/device", response_model=list[ArtifactSetOut], responses=ERRORS,
            dependencies=READS)
async def device_artifacts(store: StoreDep, settings: SettingsDep,
                           device: str = Query(max_length=200),
                           env_fingerprint: str = Query(pattern=HEX64),
                           kernel: list[str] | None = Query(None, max_length=100),
                           after: int = AFTER,
                           max_bytes: int | None = Query(None, ge=1, description="the caller's "
                                                         "budget left, capped by the service's")) -> Any:
    """A page of the compile groups of the current records on this device under this
    fingerprint (optionally of these kernels), oldest first past `after`, within
    KS_ARTIFACT_READ_MAX_BYTES (and `max_bytes`): a process's prefetch pages on until its
    budget (KS_PREFETCH_MAX_BYTES) is spent or an answer is empty."""
    check_text("device", device)
    for k in kernel or ():
        if len(k) > MAX_NAME_CHARS:
            raise _unprocessable("kernel", f"at most {MAX_NAME_CHARS} characters")
    cap = min(settings.artifact_read_max_bytes, settings.prefetch_max_bytes,
              max_bytes or settings.artifact_read_max_bytes)
    got = await run_read(lambda: store.artifacts_for_device(
        device, env_fingerprint, kernel, cap, after=after,
        workers_only=settings.artifacts_from_workers_only))
    return [set_json(v) for v in got]
