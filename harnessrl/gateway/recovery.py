"""Recovery on start: the journal's records rebuild sessions (keys hashed), chains and their hash index, so a
harness continues with its old key after a gateway restart.

A journal with corrupt lines (e.g. written by a version that left a partial record after a failed write)
stops the start, naming the line; with salvage the gateway keeps every complete record, reports what it
dropped (log, `salvage-<time>.json` beside the journal, metrics) and rewrites the journal clean, keeping the
original as `journal.jsonl.corrupt-<time>`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable

from .journal import Journal, JournalReport
from .records import CallRecord, Record, SessionEndRecord, SessionRecord
from .sessions import SessionStore

logger = logging.getLogger(__name__)


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


def recover_journal(store: SessionStore, journal: Journal, salvage: bool) -> tuple[int, JournalReport]:
    """Replays `journal` into `store` (strict unless `salvage`); returns (calls replayed, what was left out)."""
    report = JournalReport()
    calls = recover(store, journal.replay(salvage, report))
    if report.duplicates:
        logger.warning("%s", report.summary())
    if report.repaired:
        backup = journal.replace_with_salvaged()
        stamp = time.strftime("%Y%m%dT%H%M%S")
        details = {**report.as_dict(), "original": str(backup)}
        (journal.dir / f"salvage-{stamp}.json").write_text(json.dumps(details, indent=2))
        logger.warning(
            "%s; journal rewritten without them, the original kept as %s (details: salvage-%s.json)",
            report.summary(),
            backup,
            stamp,
        )
    return calls, report
