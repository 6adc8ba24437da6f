"""Prompt-lookup drafts for speculative decoding: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (n = `max_n` down to `min_n`), as in vLLM's n-gram proposer. A single matching token
is too weak a cue (on prose its drafts are rarely kept and only make the step wider), hence `min_n` 2.

Agentic histories repeat themselves (tool names and arguments, file paths, code read back, the model's own
earlier replies), so a request often continues with tokens it has already seen. The engine feeds a decoding
row's drafts along with its pending token in the same forward pass and keeps the drafts the model itself
would have produced (`sampling.verify`): the output is the model's, and a decode step — which reads all the
weights and the row's keys/values whatever the number of tokens — then yields several tokens instead of one.

The index maps every n-gram to the position after its latest occurrence; it is built once from the prompt
(when the request starts decoding) and extended by each token the request emits, so a lookup is O(max_n).
"""

from __future__ import annotations

from dataclasses import dataclass

# Drafts are judged by the share of them the model keeps, once this many have been fed ...
JUDGED_AFTER = 4
# ... and drafting pays while at least this share is kept; below it a request feeds one probe token every
# PROBE_EVERY tokens, which keeps its judgement current.
MIN_KEPT_SHARE = 0.2
PROBE_EVERY = 4
ENGINE_DECAY = 0.99  # the engine's records forget old drafts: weight 1/e after ~100 rows' drafts


@dataclass
class DraftRecord:
    """Drafts fed and kept: one request's, and the engine's over recent requests that sampled alike (greedy,
    or not), by which a new request is judged until it has a record of its own."""

    fed: float = 0.0
    kept: float = 0.0

    def record(self, fed: int, kept: int, decay: float = 1.0) -> None:
        self.fed = self.fed * decay + fed
        self.kept = self.kept * decay + kept

    def kept_share(self) -> float | None:
        return self.kept / self.fed if self.fed >= JUDGED_AFTER else None


def draft_room(own: DraftRecord, engine: DraftRecord, most: int, emitted: int) -> int:
    """How many tokens a request may draft now. A draft widens the whole step (the linear layers take one
    more token, every decoding row's attention as many query columns as the longest draft), so drafts the
    model mostly rejects, as when sampling at temperature 1 from a small model (about 1 in 10 kept in the
    demo; its turns were 11% slower with them), cost more than they save."""
    share = own.kept_share()
    if share is None:
        share = engine.kept_share()
    if share is None or share >= MIN_KEPT_SHARE:
        return most
    return min(most, 1) if emitted % PROBE_EVERY == 0 else 0


class NgramIndex:
    def __init__(self, tokens: list[int], max_n: int = 3, min_n: int = 2) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self._next: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        seq, maps = self.tokens, self._next
        for token in tokens:
            i = len(seq)  # the n-grams ending just before `token` are followed by it
            for n in range(1, min(self.max_n, i) + 1):
                maps[n][tuple(seq[i - n : i])] = i
            seq.append(token)

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest matching suffix."""
        if k <= 0:
            return []
        seq = self.tokens
        for n in range(min(self.max_n, len(seq)), self.min_n - 1, -1):
            found = self._next[n].get(tuple(seq[len(seq) - n :]))
            if found is not None:
                return seq[found : found + k]
        return []
