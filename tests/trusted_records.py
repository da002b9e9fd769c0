"""Records as the store takes them, for tests of the store itself (tests/db and the routes'
fixtures): records of made-up kernels and values the acceptance gate would refuse. The gate's
token stands in for the gate here; production code never names it (tests/db/test_accepted_type.py
reads the tree to hold it so)."""
from __future__ import annotations

from kernelsearch.db.views import _GATE_TOKEN, Accepted, HelionEntryIn, RecordIn


def trusted(rec: RecordIn) -> Accepted[RecordIn]:
    """`rec` as if the gate had passed it."""
    return Accepted(rec, _GATE_TOKEN)


def trusted_entry(entry: HelionEntryIn) -> Accepted[HelionEntryIn]:
    """A Helion entry as if the gate had passed it."""
    return Accepted(entry, _GATE_TOKEN)


def trust_check(rec: RecordIn) -> Accepted[RecordIn]:
    """`import_records`' entry check that passes every entry (the store's own rules still apply)."""
    return trusted(rec)
