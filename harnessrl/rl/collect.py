"""Training samples of finished rollouts, and what their replies look like, read from the gateway journal as
the run goes.

The journal is append-only and every record is durable before the harness gets its reply, so when a rollout
has finished, all its records are in the file. `JournalTail` reads only what was appended since the last
read and indexes records by rollout; a finished group's samples are `build_samples` of its records — the same
assembly the generate stage's export uses — and its replies' counts (gateway/replies.py) are summed over its
model calls.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from harnessrl.gateway.journal import decode_line, journal_file
from harnessrl.gateway.records import CallRecord, Record, SessionEndRecord, SessionRecord
from harnessrl.gateway.replies import ReplyCounts, reply_counts
from harnessrl.gateway.samples import build_samples
from harnessrl.schema import Sample


@dataclass
class Taken:
    """What finished rollouts' records give: their training samples and their model calls' reply counts."""

    samples: list[Sample]
    replies: ReplyCounts


class JournalTail:
    def __init__(self, journal_dir: str | Path) -> None:
        self.path = journal_file(journal_dir)
        self._offset = 0
        self._lock = threading.Lock()
        self._by_rollout: dict[str, list[Record]] = defaultdict(list)
        self._rollout_of_session: dict[str, str] = {}

    def _read_new(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            rec = decode_line(line)
            if isinstance(rec, SessionRecord):
                self._rollout_of_session[rec.session_id] = rec.rollout_id
                self._by_rollout[rec.rollout_id].append(rec)
            elif isinstance(rec, CallRecord):
                self._by_rollout[rec.rollout_id].append(rec)
            elif isinstance(rec, SessionEndRecord) and rec.session_id in self._rollout_of_session:
                self._by_rollout[self._rollout_of_session[rec.session_id]].append(rec)
        self._offset += end

    def take(self, rollout_ids: list[str]) -> Taken:
        """The samples and reply counts of finished rollouts (their records are then forgotten: memory stays
        bounded)."""
        with self._lock:
            self._read_new()
            records = [r for rid in rollout_ids for r in self._by_rollout.pop(rid, [])]
        calls = ((r.completion_ids, r.finish_reason) for r in records if isinstance(r, CallRecord))
        return Taken(build_samples(records), reply_counts(calls))
