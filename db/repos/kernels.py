"""Undeclared kernels' definitions (`interfaces.KernelDefinitions`): what a decorator told of a
kernel with no declaration, kept so that every service process lists, gates and serves it."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..checks import axes_key
from ..models import CallCapture, Job, Kernel, kernel_named, utcnow
from ._base import RepoBase


class KernelRepo(RepoBase):
    def save_definition(self, name: str, definition: dict[str, Any]) -> bool:
        """Store (or replace) a kernel's definition; True when it changed."""

        def tx(s: Session) -> bool:
            kernel_id = self._kernel_id(s, name)
            old = s.execute(select(Kernel.definition).where(Kernel.id == kernel_id)).scalar_one()
            if old == definition:
                return False
            s.execute(update(Kernel).where(Kernel.id == kernel_id).values(definition=definition))
            return True

        return self._tx(tx, write=True)

    def kernel_definitions(self) -> dict[str, dict[str, Any]]:
        """Every stored definition, by kernel name."""

        def q(s: Session) -> dict[str, dict[str, Any]]:
            rows = s.execute(select(Kernel.name, Kernel.definition)
                             .where(Kernel.definition.is_not(None))).all()
            return {name: dict(d) for name, d in rows}

        return self._tx(q, write=False)

    def save_capture(self, kernel: str, axes: dict[str, Any], capture: dict[str, Any],
                     digest: str) -> bool:
        """Keep a call of `kernel` a user's process met and tuned itself (no job carries it);
        True when it is new (a call is kept once per kernel, by its digest). The caller checks
        it first (search_space.job_acceptance.accept_capture)."""

        def tx(s: Session) -> bool:
            kernel_id = self._kernel_id(s, kernel)
            ins = self._insert(s, CallCapture).values(
                kernel_id=kernel_id, axes=dict(axes), axes_key=axes_key(dict(axes)), digest=digest,
                capture=dict(capture), created_at=utcnow())
            made = s.execute(ins.on_conflict_do_nothing(index_elements=["kernel_id", "digest"])
                             .returning(CallCapture.id)).scalar_one_or_none()
            return made is not None

        return self._tx(tx, write=True)

    def _calls(self, s: Session, kernel: str, limit: int) -> list[tuple[Any, Any]]:
        """(cases, capture) of the kernel's newest `limit` jobs, then of its newest `limit` calls
        kept without a job (`save_capture`), each as a one-case list."""
        jobs = s.execute(select(Job.cases, Job.capture).join(Kernel, Kernel.id == Job.kernel_id)
                         .where(kernel_named(kernel)).order_by(Job.id.desc()).limit(limit)).all()
        kept = s.execute(select(CallCapture.axes, CallCapture.capture)
                         .join(Kernel, Kernel.id == CallCapture.kernel_id)
                         .where(kernel_named(kernel)).order_by(CallCapture.id.desc())
                         .limit(limit)).all()
        return [(cases, capture) for cases, capture in jobs] + [([axes], c) for axes, c in kept]

    def kernel_captures(self, kernel: str, limit: int = 1000) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The calls stored with this kernel's jobs (`Job.capture`) and kept without one
        (`save_capture`), newest first, one per case:
        (the case's axes, the capture). What an undeclared kernel is tuned on again (`tune NAME`,
        a job submitted without a capture); the kernel's newest `limit` jobs are read."""

        def q(s: Session) -> list[tuple[dict[str, Any], dict[str, Any]]]:
            rows = self._calls(s, kernel, limit)
            out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
            for cases, capture in rows:
                if isinstance(capture, dict) and isinstance(cases, list) and len(cases) == 1:
                    out.setdefault(axes_key(dict(cases[0])), (dict(cases[0]), dict(capture)))
            return list(out.values())

        return self._tx(q, write=False)

    def key_captures(self, kernel: str, axes: dict[str, Any], limit: int = 1000) -> list[dict[str, Any]]:
        """Every distinct call stored with this kernel's jobs for the case `axes`, newest first:
        the calls that share the key, from which a search takes the key's edges (its smallest
        and largest call); the kernel's newest `limit` jobs are read."""
        want = axes_key(dict(axes))

        def q(s: Session) -> list[dict[str, Any]]:
            rows = self._calls(s, kernel, limit)
            out: list[dict[str, Any]] = []
            for cases, capture in rows:
                if (isinstance(capture, dict) and isinstance(cases, list) and len(cases) == 1
                        and axes_key(dict(cases[0])) == want and capture not in out):
                    out.append(dict(capture))
            return out

        return self._tx(q, write=False)
