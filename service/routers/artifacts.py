"""/v1/artifacts: compiled kernels (Triton compile groups) stored beside the record whose config
they compile, content-addressed (sha256), and served to hosts whose compile fingerprint matches
(`kernelsearch.artifacts` installs them into the local Triton cache, after checking each hash).

Writes need the writer token, as record uploads do (workers write through the store). A shared
library or a pickle is refused here (422), whatever its name: the launcher is built on each host."""
from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, Field, StringConstraints

from kernelsearch.db import errors as dberr
from kernelsearch.db.statuses import RecordOrigin
from kernelsearch.db.views import ArtifactSetView
from kernelsearch.kernels.compiled import env_fingerprint, refusal, sha256_hex
from kernelsearch.kernels.undeclared import MAX_NAME_CHARS

from ..deps import SettingsDep, StoreDep, require_writer
from ..lookups import run_read
from .common import ERRORS, WRITE_ERRORS, check_text
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

    record_id: int = Field(ge=1, le=2**31 - 1)


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


def _stored(put: Any, owner: int | str, body: GroupIn, request: Request,
            settings: Any) -> dict[str, Any]:
    """Store a group through `put` (the store's put for a record or a Helion entry) as an
    upload under the writer token; 409 when a worker's set holds its key and fingerprint."""
    files = _files(body, settings.artifact_max_bytes)
    token = request.app.state.writer_token
    try:
        got = put(owner, cache_key=body.cache_key, env=body.env,
                  env_fingerprint=env_fingerprint(body.env), group=body.group, files=files,
                  origin=RecordOrigin.UPLOAD.value, uploaded_by=TOKEN_UPLOADER if token else ANONYMOUS,
                  uploaded_from=request.client.host if request.client else None)
    except dberr.Conflict as e:  # a worker's set under the same key and fingerprint stays
        raise HTTPException(409, str(e)) from None
    return set_json(got)


@router.post("/v1/artifacts", status_code=201, response_model=ArtifactSetOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def upload_artifacts(body: ArtifactSetIn, request: Request, store: StoreDep,
                     settings: SettingsDep) -> Any:
    """Store a compile group for a record (replacing the record's set under the same cache key
    and fingerprint; never a worker's: 409). 404: no such record; 413: over KS_ARTIFACT_MAX_BYTES; 422: a file that is
    no Triton compile file (a shared library, a pickle, a path, another suffix), bad base64, or
    a group without its metadata file."""
    return _stored(store.put_artifacts, body.record_id, body, request, settings)


@router.post("/v1/helion/entries/{key}/artifacts", status_code=201, response_model=ArtifactSetOut,
             responses=WRITE_ERRORS, dependencies=[Depends(require_writer)])
def upload_helion_artifacts(body: GroupIn, request: Request, store: StoreDep,
                            settings: SettingsDep, key: str = HELION_KEY) -> Any:
    """Store the compile group of the Triton kernel Helion generated for the entry's config
    under Helion's cache key `key`, as for a record (404: no such entry; 409, 413, 422 alike)."""
    return _stored(store.put_helion_artifacts, key, body, request, settings)


@router.get("/v1/helion/entries/{key}/artifacts", response_model=list[ArtifactSetOut],
            responses=ERRORS)
async def helion_artifacts(store: StoreDep, key: str = HELION_KEY,
                           env_fingerprint: str = Query(pattern=HEX64)) -> Any:
    """The compile groups of the Helion entry under `key` for this compile fingerprint (empty:
    none; Helion compiles)."""
    return [set_json(v) for v in await run_read(store.artifacts_of_helion_entry, key,
                                                env_fingerprint)]


@router.get("/v1/artifacts", response_model=list[ArtifactSetOut], responses=ERRORS)
async def record_artifacts(store: StoreDep, record_id: int = Query(ge=1, le=2**31 - 1),
                           env_fingerprint: str = Query(pattern=HEX64)) -> Any:
    """The compile groups of one record under this compile fingerprint (empty: none; the
    caller compiles)."""
    return [set_json(v) for v in await run_read(store.artifacts_of_record, record_id,
                                                env_fingerprint)]


@router.get("/v1/artifacts/by-cache-key", response_model=list[ArtifactSetOut], responses=ERRORS)
async def cache_key_artifacts(store: StoreDep, cache_key: str = Query(pattern=HEX64),
                              env_fingerprint: str = Query(pattern=HEX64)) -> Any:
    """The compile group of a current record under one Triton cache key and this fingerprint
    (what `kernelsearch.triton_cache` asks for when Triton's cache misses a group)."""
    return [set_json(v) for v in await run_read(store.artifacts_by_cache_key, cache_key,
                                                env_fingerprint)]


@router.get("/v1/artifacts/device", response_model=list[ArtifactSetOut], responses=ERRORS)
async def device_artifacts(store: StoreDep, settings: SettingsDep,
                           device: str = Query(max_length=200),
                           env_fingerprint: str = Query(pattern=HEX64),
                           kernel: list[str] | None = Query(None, max_length=100)) -> Any:
    """Every compile group of the current records on this device under this fingerprint
    (optionally of these kernels), newest first, up to KS_PREFETCH_MAX_BYTES: a process's
    prefetch at start-up, in one request."""
    check_text("device", device)
    for k in kernel or ():
        if len(k) > MAX_NAME_CHARS:
            raise _unprocessable("kernel", f"at most {MAX_NAME_CHARS} characters")
    got = await run_read(store.artifacts_for_device, device, env_fingerprint, kernel,
                         settings.prefetch_max_bytes)
    return [set_json(v) for v in got]
