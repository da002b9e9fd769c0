"""Undeclared kernels' definitions (`interfaces.KernelDefinitions`): what a decorator told of a
kernel with no declaration, kept so that every service process lists, gates and serves it."""
from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..models import Kernel
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
