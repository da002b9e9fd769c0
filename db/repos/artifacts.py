"""Compiled kernels (Triton compile groups) stored content-addressed beside the record that
serves their config (`models.ArtifactBlob`, `ArtifactSet`, `ArtifactFile`)."""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from ..checks import kernel_key
from ..errors import Conflict, NotFound
from ..statuses import RecordOrigin
from ..models import (ArtifactBlob, ArtifactFile, ArtifactSet, Case, Device, HelionEntry, Kernel,
                      Record, utcnow)
from ..views import ArtifactSetView
from ._base import RepoBase


class ArtifactRepo(RepoBase):
    def put_artifacts(self, record_id: int, *, cache_key: str, env: Mapping[str, Any],
                      env_fingerprint: str, group: str, files: Mapping[str, bytes], origin: str,
                      uploaded_by: str | None = None, uploaded_from: str | None = None,
                      max_bytes: int | None = None,
                      max_uploads: int | None = None) -> ArtifactSetView:
        """Store one compile group for a record, replacing the set under the same (record, cache
        key, fingerprint) when this is a worker's; an upload never replaces a set (the same files
        again answer the stored set). NotFound: no such record; Conflict: a stored set stays, a
        set without its group's metadata file, over `max_bytes`, or an upload past
        `max_uploads` uploaded sets of the record. What a file may be is checked by the
        callers, the route and the worker (`kernels.compiled.refusal`): this layer imports no
        kernel code."""
        return self._put_set(ArtifactSet.record_id, record_id, cache_key=cache_key, env=env,
                             env_fingerprint=env_fingerprint, group=group, files=files,
                             origin=origin, uploaded_by=uploaded_by, uploaded_from=uploaded_from,
                             max_bytes=max_bytes, max_uploads=max_uploads)

    def put_helion_artifacts(self, helion_key: str, *, cache_key: str, env: Mapping[str, Any],
                             env_fingerprint: str, group: str, files: Mapping[str, bytes],
                             origin: str, uploaded_by: str | None = None,
                             uploaded_from: str | None = None,
                             max_bytes: int | None = None,
                             max_uploads: int | None = None) -> ArtifactSetView:
        """`put_artifacts` for the Helion entry under Helion's cache key `helion_key`: the compile
        group of the Triton kernel Helion generated for the entry's config. NotFound: no entry."""
        def entry_id(s: Session) -> int:
            got = s.execute(select(HelionEntry.id).where(
                HelionEntry.cache_key == helion_key)).scalar_one_or_none()
            if got is None:
                raise NotFound(f"helion entry {helion_key}: no such entry")
            return int(got)

        return self._put_set(ArtifactSet.helion_entry_id, entry_id, cache_key=cache_key, env=env,
                             env_fingerprint=env_fingerprint, group=group, files=files,
                             origin=origin, uploaded_by=uploaded_by, uploaded_from=uploaded_from,
                             max_bytes=max_bytes, max_uploads=max_uploads)

    def _put_set(self, owner_col: Any, owner: int | Callable[[Session], int], *, cache_key: str,
                 env: Mapping[str, Any], env_fingerprint: str, group: str,
                 files: Mapping[str, bytes], origin: str, uploaded_by: str | None,
                 uploaded_from: str | None, max_bytes: int | None,
                 max_uploads: int | None) -> ArtifactSetView:
        if group not in files:
            raise Conflict(f"{group}: the group's metadata file is not among the files")
        if max_bytes is not None and sum(len(d) for d in files.values()) > max_bytes:
            raise Conflict(f"the artifact set is over {max_bytes} bytes")

        def tx(s: Session) -> ArtifactSetView:
            if callable(owner):
                owner_id = owner(s)
                what = "helion entry"
            else:
                owner_id, what = owner, "record"
                if s.get(Record, owner_id) is None:
                    raise NotFound(f"record {owner_id}: no such record")
            same = (owner_col == owner_id, ArtifactSet.cache_key == cache_key,
                    ArtifactSet.env_fingerprint == env_fingerprint)
            stored = s.execute(select(ArtifactSet.id, ArtifactSet.origin)
                               .where(*same)).one_or_none()
            if stored is not None and origin == RecordOrigin.UPLOAD:
                held = "a worker's" if stored.origin == RecordOrigin.WORKER else "another upload's"
                if stored.origin == RecordOrigin.UPLOAD:
                    [view] = self._artifact_views(s, [stored.id])
                    if view.files == dict(files) and view.group == group:
                        return view  # the same upload again: kept as it is
                raise Conflict(f"{what} {owner_id}: {held} compiled kernel is stored under this "
                               "cache key and fingerprint; an upload never replaces it")
            if stored is None and origin == RecordOrigin.UPLOAD and max_uploads is not None:
                uploads = int(s.execute(select(func.count()).select_from(ArtifactSet).where(
                    owner_col == owner_id, ArtifactSet.origin == RecordOrigin.UPLOAD.value)
                ).scalar_one())
                if uploads >= max_uploads:
                    raise Conflict(f"{what} {owner_id}: it holds {uploads} uploaded compiled kernels "
                                   f"already, the most it may (KS_ARTIFACT_MAX_UPLOADS)")
            s.execute(delete(ArtifactSet).where(*same))
            row = ArtifactSet(**{owner_col.key: owner_id}, cache_key=cache_key, env=dict(env),
                              env_fingerprint=env_fingerprint, group=group, origin=origin,
                              uploaded_by=uploaded_by, uploaded_from=uploaded_from,
                              created_at=utcnow())
            s.add(row)
            s.flush()
            for name, data in files.items():
                digest = hashlib.sha256(data).hexdigest()
                if s.get(ArtifactBlob, digest) is None:
                    s.add(ArtifactBlob(sha256=digest, size=len(data), data=data, created_at=utcnow()))
                    s.flush()
                s.add(ArtifactFile(set_id=row.id, filename=name, sha256=digest))
            s.flush()
            return self._artifact_views(s, [row.id])[0]

        return self._tx(tx, write=True)

    def record_owner(self, record_id: int) -> tuple[str, dict[str, Any]] | None:
        """(kernel name, config) of a record, what a set stored beside it must compile; None:
        no such record."""
        def tx(s: Session) -> tuple[str, dict[str, Any]] | None:
            row = s.execute(select(Kernel.name, Record.config)
                            .join(Record, Record.kernel_id == Kernel.id)
                            .where(Record.id == record_id)).one_or_none()
            return None if row is None else (str(row[0]), dict(row[1]))

        return self._tx(tx, write=False)

    def artifacts_of_record(self, record_id: int, env_fingerprint: str, *, after: int = 0,
                            max_bytes: int | None = None,
                            workers_only: bool = False) -> list[ArtifactSetView]:
        """The sets of one record compiled under this fingerprint (any Triton cache key), oldest
        first from id `after` on, as many as fit in `max_bytes` (at least one): a page."""
        def tx(s: Session) -> list[ArtifactSetView]:
            q = select(ArtifactSet.id).where(ArtifactSet.record_id == record_id,
                                             ArtifactSet.env_fingerprint == env_fingerprint)
            return self._page(s, q, after, max_bytes, workers_only)

        return self._tx(tx, write=False)

    def _page(self, s: Session, q: Any, after: int, max_bytes: int | None,
              workers_only: bool, strict: bool = False) -> list[ArtifactSetView]:
        """The sets `q` selects past id `after`, oldest first, as many as `max_bytes` of files
        holds: their sizes are summed in the database before any file is read, so a request's
        memory is bounded by what it answers. At least one, unless `strict` (a budget: a set
        that does not fit in what is left is passed over, never read)."""
        q = q.where(ArtifactSet.id > after).order_by(ArtifactSet.id)
        if workers_only:
            q = q.where(ArtifactSet.origin == RecordOrigin.WORKER.value)
        ids = list(s.execute(q).scalars().all())
        if max_bytes is not None and ids:
            sizes = dict(s.execute(
                select(ArtifactFile.set_id, func.sum(ArtifactBlob.size))
                .join(ArtifactBlob, ArtifactBlob.sha256 == ArtifactFile.sha256)
                .where(ArtifactFile.set_id.in_(ids)).group_by(ArtifactFile.set_id)).all())
            kept: list[int] = []
            total = 0
            for i in ids:
                size = int(sizes.get(i) or 0)
                if total + size > max_bytes and (kept or strict):
                    if strict:
                        continue
                    break
                total += size
                kept.append(i)
            ids = kept
        return self._artifact_views(s, ids)

    def artifacts_of_helion_entry(self, helion_key: str, env_fingerprint: str, *,
                                  max_bytes: int | None = None,
                                  workers_only: bool = False) -> list[ArtifactSetView]:
        """The sets of the Helion entry under Helion's cache key compiled under this fingerprint
        (oldest first, within `max_bytes`)."""
        def tx(s: Session) -> list[ArtifactSetView]:
            q = (select(ArtifactSet.id)
                 .join(HelionEntry, HelionEntry.id == ArtifactSet.helion_entry_id)
                 .where(HelionEntry.cache_key == helion_key,
                        ArtifactSet.env_fingerprint == env_fingerprint))
            return self._page(s, q, 0, max_bytes, workers_only)

        return self._tx(tx, write=False)

    def artifacts_by_cache_key(self, cache_key: str, env_fingerprint: str, *,
                               workers_only: bool = False) -> list[ArtifactSetView]:
        """The sets of current records under one Triton cache key and fingerprint (what Triton's
        cache manager asks for when it misses a compile group)."""
        def tx(s: Session) -> list[ArtifactSetView]:
            q = (select(ArtifactSet.id).join(Record, Record.id == ArtifactSet.record_id)
                 .where(ArtifactSet.cache_key == cache_key, Record.is_current,
                        ArtifactSet.env_fingerprint == env_fingerprint))
            if workers_only:
                q = q.where(ArtifactSet.origin == RecordOrigin.WORKER.value)
            ids = s.execute(q.order_by(ArtifactSet.id.desc()).limit(1)).scalars().all()
            return self._artifact_views(s, list(ids))

        return self._tx(tx, write=False)

    def artifacts_for_device(self, device: str, env_fingerprint: str,
                             kernels: Sequence[str] | None = None,
                             max_bytes: int | None = None, *, after: int = 0,
                             workers_only: bool = False) -> list[ArtifactSetView]:
        """The sets of the current records on `device` under this fingerprint (optionally of
        these kernels), oldest first from id `after` on, those that fit in `max_bytes` of files
        (sized before any is read; a set too large for what is left is passed over): a page of a
        process's prefetch. Oldest first, so a recent
        upload never pushes the sets a device has long run out of a bounded prefetch."""
        def tx(s: Session) -> list[ArtifactSetView]:
            q = (select(ArtifactSet.id).join(Record, Record.id == ArtifactSet.record_id)
                 .join(Device, Device.id == Record.device_id)
                 .where(Device.name == device, Record.is_current,
                        ArtifactSet.env_fingerprint == env_fingerprint))
            if kernels:
                q = q.join(Kernel, Kernel.id == Record.kernel_id).where(
                    Kernel.name_key.in_([kernel_key(k) for k in kernels]))
            return self._page(s, q, after, max_bytes, workers_only, strict=True)

        return self._tx(tx, write=False)

    def drop_orphan_artifact_blobs(self) -> int:
        """Delete the blobs no set names any longer (after a withdrawal); how many went."""
        def tx(s: Session) -> int:
            used = select(ArtifactFile.sha256)
            gone = s.execute(select(ArtifactBlob.sha256).where(
                ArtifactBlob.sha256.not_in(used))).scalars().all()
            if gone:
                s.execute(delete(ArtifactBlob).where(ArtifactBlob.sha256.in_(list(gone))))
            return len(gone)

        return self._tx(tx, write=True)

    @staticmethod
    def _artifact_views(s: Session, ids: list[int]) -> list[ArtifactSetView]:
        if not ids:
            return []
        rows = s.execute(
            select(ArtifactSet, Record.config, Record.is_current, Kernel.name, Case.axes,
                   Device.name.label("device"))
            .join(Record, Record.id == ArtifactSet.record_id)
            .join(Kernel, Kernel.id == Record.kernel_id).join(Case, Case.id == Record.case_id)
            .join(Device, Device.id == Record.device_id)
            .where(ArtifactSet.id.in_(ids))).all()
        helion = s.execute(select(ArtifactSet, HelionEntry)
                           .join(HelionEntry, HelionEntry.id == ArtifactSet.helion_entry_id)
                           .where(ArtifactSet.id.in_(ids))).all()
        files: dict[int, dict[str, bytes]] = {i: {} for i in ids}
        for set_id, name, data in s.execute(
                select(ArtifactFile.set_id, ArtifactFile.filename, ArtifactBlob.data)
                .join(ArtifactBlob, ArtifactBlob.sha256 == ArtifactFile.sha256)
                .where(ArtifactFile.set_id.in_(ids))).all():
            files[set_id][name] = bytes(data)
        by_id = {
            r.ArtifactSet.id: ArtifactSetView(
                id=r.ArtifactSet.id, record_id=r.ArtifactSet.record_id, kernel=r.name,
                axes=dict(r.axes), device=r.device, config=dict(r.config),
                cache_key=r.ArtifactSet.cache_key, env_fingerprint=r.ArtifactSet.env_fingerprint,
                env=dict(r.ArtifactSet.env), group=r.ArtifactSet.group,
                origin=r.ArtifactSet.origin, files=files[r.ArtifactSet.id],
                is_current=bool(r.is_current))
            for r in rows}
        for a, e in helion:
            by_id[a.id] = ArtifactSetView(
                id=a.id, record_id=None, kernel=e.kernel, axes=dict(e.axes), device=e.hardware,
                config=dict(e.config), cache_key=a.cache_key, env_fingerprint=a.env_fingerprint,
                env=dict(a.env), group=a.group, origin=a.origin, files=files[a.id],
                helion_key=e.cache_key)
        return [by_id[i] for i in ids if i in by_id]
