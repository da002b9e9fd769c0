"""Imported records checked against the declaration of their kernel, as this process knows it.

The store checks types and widths only (the db layer knows no kernels); `records import` adds
this check, so a file naming an unknown kernel, axes the kernel does not have or outside its
range, a config the kernel rejects, or a latency no device could reach, is refused whole.
"""
from __future__ import annotations

from kernelsearch import kernels
from kernelsearch.db.errors import ImportRejected
from kernelsearch.db.store import RecordIn
from kernelsearch.kernels.errors import InvalidConfig

# Bytes per second no device moves: 1000 TB/s, some 100 times an H200's HBM and well above any
# on-chip cache. A record claiming more (1e-6 us for a 143 MB case) is not a measurement.
MAX_BYTES_PER_S = 1e15


def check_against_kernel(rec: RecordIn) -> None:
    """Raise ImportRejected, naming the field, unless `rec` fits its kernel's declaration."""
    try:
        k = kernels.get_kernel(rec.kernel)
    except kernels.UnknownKernel as e:
        raise ImportRejected(str(e), field="kernel") from None
    try:
        axes = k.validate_axes(rec.axes, strict=True)
    except ValueError as e:
        raise ImportRejected(str(e), field="axes") from None
    if axes != rec.axes:
        extra = sorted(set(rec.axes) - set(axes))
        raise ImportRejected(f"{k.name}: axes {extra} do not key a case; a record's axes are "
                             f"exactly {sorted(axes)}", field="axes")
    try:
        k.validate_config(rec.config)
    except InvalidConfig as e:
        raise ImportRejected(str(e), field="config") from None
    moved = float(k.bytes_moved(axes))
    rate = moved / (rec.latency_min_us * 1e-6)
    if rate > MAX_BYTES_PER_S:
        raise ImportRejected(
            f"{rec.latency_min_us:g} us for the {moved:.0f} bytes this case moves is "
            f"{rate / 1e12:.3g} TB/s, beyond any device ({MAX_BYTES_PER_S / 1e12:.0f} TB/s): "
            f"not a measurement", field="latency_min_us")
