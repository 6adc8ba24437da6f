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
