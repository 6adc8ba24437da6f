"""What the policy's sampled replies look like over a set of model calls (gateway records): how long they are,
how often the reply budget cut them off, how much a reply repeats itself. A reward won by a shortcut shows
here — a policy that learns to stop early, or to loop on a phrase until `max_tokens` ends it.

One model call's reply is its record's `completion_ids` (the tokens the engine sampled, verbatim) and its
`finish_reason`. `ReplyCounts` sums calls (the RL loop per group, as the journal is read; evaluate per policy
from `records.parquet`) and adds up across groups; `figures()` turns the sums into the three reported ratios:

- `mean_reply_tokens`: sampled tokens per model call;
- `length_finish_share`: the share of calls the engine ended because the reply budget (`max_tokens`) or the
  context ran out (finish reason `length`);
- `distinct_2`: distinct token bigrams ÷ all token bigrams, each counted within its reply and summed over the
  replies: 1 when no reply repeats a token pair, towards 0 for a reply looping on itself. Counted per reply,
  it does not fall merely because a step holds more replies (replies to one request share words).

Each ratio is None when nothing was there to count (no call; no reply of two tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from harnessrl.engine.base import FinishReason


@dataclass(frozen=True)
class ReplyFigures:
    """The three ratios as a step row, a summary and an evaluation result carry them (flat, JSON-ready)."""

    mean_reply_tokens: float | None = None
    length_finish_share: float | None = None
    distinct_2: float | None = None

    def row(self) -> dict[str, float | None]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ReplyFigures:
        """Read back from a row; a row written before these figures existed gives None for each."""
        return cls(**{f.name: row.get(f.name) for f in fields(cls)})


@dataclass
class ReplyCounts:
    calls: int = 0
    tokens: int = 0
    length_finishes: int = 0
    bigrams: int = 0  # within each reply: len(reply) - 1 for a reply of at least one token
    distinct_bigrams: int = 0  # within each reply, summed over the replies

    def add(self, completion_ids: Sequence[int], finish_reason: str) -> None:
        pairs = list(zip(completion_ids, completion_ids[1:], strict=False))
        self.calls += 1
        self.tokens += len(completion_ids)
        self.length_finishes += finish_reason == FinishReason.LENGTH
        self.bigrams += len(pairs)
        self.distinct_bigrams += len(set(pairs))

    def __add__(self, other: ReplyCounts) -> ReplyCounts:
        return ReplyCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def figures(self) -> ReplyFigures:
        return ReplyFigures(
            mean_reply_tokens=self.tokens / self.calls if self.calls else None,
            length_finish_share=self.length_finishes / self.calls if self.calls else None,
            distinct_2=self.distinct_bigrams / self.bigrams if self.bigrams else None,
        )


def reply_counts(calls: Iterable[tuple[Sequence[int], str]]) -> ReplyCounts:
    """The counts of these model calls, each given as (its sampled ids, its finish reason)."""
    counts = ReplyCounts()
    for ids, finish in calls:
        counts.add(ids, finish)
    return counts
