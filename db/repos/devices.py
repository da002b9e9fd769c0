"""The devices records were tuned on (`interfaces.DeviceRegistry`)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..checks import check_name
from ..models import Device, Record
from ._base import RepoBase


class DeviceRepo(RepoBase):
    def ensure_device(self, info: dict[str, Any]) -> int:
        """Insert or refresh a device from `kernels.device.device_info()`; returns its id."""
        if not isinstance(info, dict):
            raise ValueError(f"info: expected a dict as device_info() returns, got {type(info).__name__}")
        name = check_name(info.get("name"), "info['name']")
        return self._tx(lambda s: self._device_id(s, name, info), write=True)

    def list_devices(self) -> list[dict[str, Any]]:
        """Every device seen, with how many current records it has."""

        def q(s: Session) -> list[dict[str, Any]]:
            n = (
                select(Record.device_id, func.count().label("n"))
                .where(Record.is_current.is_(True))
                .group_by(Record.device_id)
                .subquery()
            )
            rows = s.execute(
                select(Device, func.coalesce(n.c.n, 0))
                .outerjoin(n, n.c.device_id == Device.id)
                .order_by(Device.name)
            ).all()
            return [
                {
                    "id": d.id,
                    "name": d.name,
                    "compute_capability": d.compute_capability,
                    "memory_bytes": d.memory_bytes,
                    "multiprocessors": d.multiprocessors,
                    "cuda_version": d.cuda_version,
                    "driver_version": d.driver_version,
                    "interpreter": d.interpreter,
                    "info": d.info,
                    "first_seen_at": d.first_seen_at.isoformat(),
                    "last_seen_at": d.last_seen_at.isoformat(),
                    "n_records": int(count),
                }
                for d, count in rows
            ]

        return self._tx(q, write=False)
