"""Scoring a search agent's reply: the answer it gives, exact match and token F1 against the gold answers.

    extract_answer(reply) -> str             the last <answer>...</answer>, else the last non-empty line
    normalize_answer(text) -> str            SQuAD-style, with two deviations (below)
    exact_match(prediction, answers) -> float     1.0 / 0.0, best over the gold answers
    token_f1(prediction, answers) -> float        SQuAD token F1, best over the gold answers
    score_reply(reply, answers, reward=RewardKind.EM) -> AnswerScore

Normalization is SQuAD's (NFKC, lowercase, punctuation out, articles a/an/the out, whitespace collapsed)
except that what carries the answers of this corpus survives: a dot between digits (`3.1.9`) and a run of
version operators `< > = ! ~` right before a digit (`>= 3.9` reads as `>=3.9`); and hyphens, slashes and
underscores separate words (`BSD-3-Clause` = `bsd 3 clause`). So ">=3.9" and "3.9" differ, "MIT" and
"the MIT." do not.

Reward: `RewardKind.EM` (the default: binary, and a reply cannot raise it by saying more) or `RewardKind.F1`
(partial credit; a reply stuffed with candidates or a pasted passage gets low precision, hence low F1). Both
take the best over the gold answers; an empty prediction scores 0.
"""

from __future__ import annotations

import enum
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_OPERATOR_SPACE = re.compile(r"([<>=!~])\s+(?=[\d<>=!~])")  # ">= 3.9" -> ">=3.9"
_OPERATOR_RUN = re.compile(r"[<>=!~]+(?=\d)")
_KEEP_DOT = re.compile(r"(?<=\d)\.(?=\d)")
_SEPARATORS = re.compile(r"[-/_]")
# kept characters travel through the punctuation removal as private-use stand-ins
_PROTECT = {c: chr(0xE000 + i) for i, c in enumerate(".<>=!~")}
_RESTORE = str.maketrans({v: k for k, v in _PROTECT.items()})
_DROP_TABLE = str.maketrans("", "", string.punctuation + "“”‘’«»…–—")


class RewardKind(enum.StrEnum):
    EM = "em"
    F1 = "f1"


@dataclass(frozen=True)
class AnswerScore:
    answer: str  # what extract_answer took from the reply
    em: float
    f1: float
    reward: float


def extract_answer(reply: str) -> str:
    tagged = _ANSWER_TAG.findall(reply)
    if tagged:
        return tagged[-1].strip()
    lines = [ln.strip() for ln in reply.splitlines() if ln.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return re.sub(r"^(final answer|answer)\s*[:\-]\s*", "", last, flags=re.I).strip()


def normalize_answer(text: str) -> str:
    text = _OPERATOR_SPACE.sub(r"\1", unicodedata.normalize("NFKC", text).lower())
    text = _OPERATOR_RUN.sub(lambda m: "".join(_PROTECT[c] for c in m.group(0)), text)
    text = _KEEP_DOT.sub(_PROTECT["."], text)
    text = _SEPARATORS.sub(" ", text).translate(_DROP_TABLE).translate(_RESTORE)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    pred = normalize_answer(prediction)
    return float(bool(pred) and any(pred == normalize_answer(a) for a in answers))


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    pred = normalize_answer(prediction).split()
    if not pred:
        return 0.0
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def score_reply(reply: str, answers: Sequence[str], reward: RewardKind = RewardKind.EM) -> AnswerScore:
    if not answers:
        raise ValueError("a question needs at least one gold answer")
    answer = extract_answer(reply)
    em, f1 = exact_match(answer, answers), token_f1(answer, answers)
    return AnswerScore(answer, em, f1, em if reward is RewardKind.EM else f1)
