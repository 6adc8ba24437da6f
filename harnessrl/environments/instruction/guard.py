"""The on-task guard: whether a reply answers its request at all, decided before its constraints count.

IFEval's constraints are about form (no commas, a keyword, a case), and form alone can be met by replies that
say nothing: a reward a short, empty, echoed or cut-off reply can win trains that instead of instruction
following. Every instruction reward (env.py) is 0 for a reply that
- was cut off by its reply budget (`cut_off`: the harness ended on the token budget): not a finished answer;
- has fewer than `MIN_WORDS` words (a one-word answer, a two-item list of names);
- echoes the request: half or more of its word trigrams are the request's;
- is filler: among `FILLER_MIN_WORDS` or more words, under `MIN_DISTINCT_BIGRAMS` of its word bigrams are
  distinct, or one word is more than `MAX_WORD_SHARE` of them (a phrase repeated to reach a word count).
Whether it is about the request's topic is a constraint of its own where a task wants it (a keyword drawn
from the request: prompts.WholeReply), not a guard: a good answer may name its topic in other words.
"""

from __future__ import annotations

import re
from collections import Counter
from enum import StrEnum

MIN_WORDS = 5
FILLER_MIN_WORDS = 8
MIN_DISTINCT_BIGRAMS = 0.6
MAX_WORD_SHARE = 0.4
ECHO_SHARE = 0.5

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


class OffTask(StrEnum):
    """Why a reply does not answer its request (the module docstring)."""

    CUT_OFF = "cut off by the reply budget"
    TOO_SHORT = f"fewer than {MIN_WORDS} words"
    ECHO = "echoes the request"
    FILLER = "repeats itself"


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _ngrams(seq: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


def off_task(reply: str, request: str, *, cut_off: bool) -> OffTask | None:
    """Why `reply` does not answer `request`, or None when it may be scored."""
    if cut_off:
        return OffTask.CUT_OFF
    said = words(reply)
    if len(said) < MIN_WORDS:
        return OffTask.TOO_SHORT
    trigrams = _ngrams(said, 3)
    asked = set(_ngrams(words(request), 3))
    if trigrams and sum(t in asked for t in trigrams) >= ECHO_SHARE * len(trigrams):
        return OffTask.ECHO
    if len(said) >= FILLER_MIN_WORDS:
        bigrams = _ngrams(said, 2)
        top = Counter(said).most_common(1)[0][1]
        if len(set(bigrams)) < MIN_DISTINCT_BIGRAMS * len(bigrams) or top > MAX_WORD_SHARE * len(said):
            return OffTask.FILLER
    return None
