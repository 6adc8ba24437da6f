"""Recovery on start: the journal's records rebuild sessions (keys hashed), chains and their hash index, so a
harness continues with its old key after a gateway restart."""

from __future__ import annotations

from collections.abc import Iterable

from .records import CallRecord, Record, SessionEndRecord, SessionRecord
from .sessions import SessionStore


def recover(store: SessionStore, records: Iterable[Record]) -> int:
    """Applies the records to `store`; returns how many calls were replayed."""
    calls = 0
    for rec in records:
        if isinstance(rec, SessionRecord):
            store.add(rec)
        elif isinstance(rec, SessionEndRecord):
            store.apply_end(rec)
        elif isinstance(rec, CallRecord) and rec.session_id in store.sessions:
            s = store.sessions[rec.session_id]
            s.chains.commit(rec)
            s.calls += 1
            calls += 1
    return calls
