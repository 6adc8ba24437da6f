"""Questions for the search environment, made offline and deterministically from the corpus's sources.

    make_questions(packages, passages) -> list[Question]
    write_questions(questions, path) / read_questions(path) -> list[Question]
    build_task_set(out_dir, site_dirs=None) -> TaskSetInfo      corpus.jsonl + questions.jsonl

Each row is `{task_id, question, answers, doc_id, kind}`; `doc_id` is the passage that holds the answer.
Kinds (`QuestionKind`):

- `license`: "What license does the Python package X declare in its metadata?" -> the License-Expression /
  short License field (the package's card passage);
- `requires_python`: "Which Python versions does the package X require, according to its metadata?" ->
  e.g. ">=3.9" (card);
- `version`: "What is the version number of the Python package X?" -> e.g. "2.4.6" (card);
- `package`: "Which Python package describes itself as: '<summary>'?" -> the name (card), only for summaries
  of 4+ words that no other package shares and that hold no URL and no part of the name;
- `cloze`: "In the documentation of the Python package X, which word is missing here: '... ____ ...'?" ->
  the word, from one sentence (10 to 35 words of prose) of one description passage of X, sentence and
  passage picked by a hash of the doc id; the blanked word is the rarest eligible one in the corpus (6+
  letters, not a stop word, not the package name, once in its sentence), so a prior alone rarely guesses it.

Invariants (checked for every row, a violating candidate is skipped): every answer occurs verbatim in the
gold passage's text; the normalized answer is not contained in the normalized question (the question names
the subject, never the answer or the passage id); task ids are unique (`<kind>:<package key>`); the order
is by package key, then kind. Nothing is random: the same corpus gives the same questions.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harnessrl.environments.search.corpus import (
    PackageMeta,
    Passage,
    build_corpus,
    read_packages,
    write_corpus,
)
from harnessrl.environments.search.index import STOP_WORDS
from harnessrl.environments.search.score import normalize_answer
from harnessrl.io import read_jsonl, write_jsonl

log = logging.getLogger(__name__)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_WORD = re.compile(r"[A-Za-z]+")
BLANK = "____"


class QuestionKind(enum.StrEnum):
    LICENSE = "license"
    REQUIRES_PYTHON = "requires_python"
    VERSION = "version"
    PACKAGE = "package"
    CLOZE = "cloze"


class QuestionError(ValueError):
    """A questions file that cannot be read back (names the file, line and field)."""


@dataclass(frozen=True)
class Question:
    task_id: str
    question: str
    answers: tuple[str, ...]
    doc_id: str
    kind: QuestionKind

    def to_row(self) -> dict[str, object]:
        row = asdict(self)
        row["answers"] = list(self.answers)
        row["kind"] = self.kind.value
        return row


@dataclass(frozen=True)
class TaskSetInfo:
    corpus: Path
    questions: Path
    passages: int
    counts: dict[str, int]  # questions per kind


def make_questions(packages: Sequence[PackageMeta], passages: Sequence[Passage]) -> list[Question]:
    by_id = {p.doc_id: p for p in passages}
    by_package: dict[str, list[Passage]] = {}
    for p in passages:
        by_package.setdefault(p.doc_id.split("/", 1)[0], []).append(p)
    df = _document_frequency(passages)
    summaries = Counter(m.summary.lower() for m in packages if m.summary)
    out: list[Question] = []
    for meta in sorted(packages, key=lambda m: m.key):
        card = f"{meta.key}/card"
        if card not in by_id:
            continue
        candidates: list[Question] = []
        if meta.license:
            candidates.append(
                _q(
                    QuestionKind.LICENSE,
                    meta,
                    f"What license does the Python package {meta.name} declare in its metadata?",
                    meta.license,
                    card,
                )
            )
        if meta.requires_python:
            candidates.append(
                _q(
                    QuestionKind.REQUIRES_PYTHON,
                    meta,
                    f"Which Python versions does the package {meta.name} require, according to its metadata?",
                    meta.requires_python,
                    card,
                )
            )
        if meta.version:
            candidates.append(
                _q(
                    QuestionKind.VERSION,
                    meta,
                    f"What is the version number of the Python package {meta.name}?",
                    meta.version,
                    card,
                )
            )
        if _summary_names_nothing(meta) and summaries[meta.summary.lower()] == 1:
            summary = meta.summary.rstrip(".")
            candidates.append(
                _q(
                    QuestionKind.PACKAGE,
                    meta,
                    f'Which Python package describes itself as: "{summary}"?',
                    meta.name,
                    card,
                )
            )
        cloze = _cloze(meta, by_package.get(meta.key, []), df, passages)
        if cloze is not None:
            candidates.append(cloze)
        out.extend(q for q in candidates if _valid(q, by_id))
    log.info("made %d questions from %d packages", len(out), len(packages))
    return out


def write_questions(questions: Iterable[Question], path: Path) -> int:
    return write_jsonl(path, (q.to_row() for q in questions))


def read_questions(path: Path) -> list[Question]:
    out: list[Question] = []
    for n, row in enumerate(read_jsonl(path), start=1):
        for key in ("task_id", "question", "doc_id", "kind"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise QuestionError(f"{path}: line {n}: field {key!r} missing or empty")
        answers = row.get("answers")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
            raise QuestionError(f"{path}: line {n}: field 'answers' must be a non-empty list of strings")
        try:
            kind = QuestionKind(row["kind"])
        except ValueError:
            choices = ", ".join(k.value for k in QuestionKind)
            raise QuestionError(f"{path}: line {n}: kind {row['kind']!r} is not one of {choices}") from None
        out.append(Question(row["task_id"], row["question"], tuple(answers), row["doc_id"], kind))
    return out


def build_task_set(out_dir: Path, site_dirs: Iterable[Path] | None = None) -> TaskSetInfo:
    """corpus.jsonl (+ .info.json) and questions.jsonl under `out_dir`, from the installed distributions."""
    sites = list(site_dirs) if site_dirs is not None else None
    packages = read_packages(sites)
    passages = build_corpus(sites)
    questions = make_questions(packages, passages)
    corpus_path, questions_path = out_dir / "corpus.jsonl", out_dir / "questions.jsonl"
    write_corpus(passages, corpus_path)
    write_questions(questions, questions_path)
    counts = dict(sorted(Counter(q.kind.value for q in questions).items()))
    return TaskSetInfo(corpus_path, questions_path, len(passages), counts)


def _q(kind: QuestionKind, meta: PackageMeta, question: str, answer: str, doc_id: str) -> Question:
    return Question(f"{kind.value}:{meta.key}", question, (answer,), doc_id, kind)


def _valid(q: Question, by_id: dict[str, Passage]) -> bool:
    passage = by_id.get(q.doc_id)
    if passage is None or not all(a in passage.text for a in q.answers):
        return False
    question = f" {normalize_answer(q.question)} "
    return all(normalize_answer(a) and f" {normalize_answer(a)} " not in question for a in q.answers)


def _summary_names_nothing(meta: PackageMeta) -> bool:
    summary = meta.summary.lower()
    if len(summary.split()) < 4 or "http" in summary or "www." in summary:
        return False
    return not any(len(part) >= 3 and part in summary for part in re.findall(r"[a-z0-9]+", meta.name.lower()))


def _document_frequency(passages: Sequence[Passage]) -> Counter[str]:
    df: Counter[str] = Counter()
    for p in passages:
        df.update({w.lower() for w in _WORD.findall(p.text)})
    return df


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _cloze(
    meta: PackageMeta, own: Sequence[Passage], df: Counter[str], passages: Sequence[Passage]
) -> Question | None:
    """One fill-in-the-blank question from a prose sentence of one of the package's description passages."""
    prose = [p for p in own if not p.doc_id.endswith("/card")]
    if not prose:
        return None
    start = _stable_hash(meta.key) % len(prose)
    name_parts = {w.lower() for w in _WORD.findall(meta.name)}
    for passage in prose[start:] + prose[:start]:
        sentences = [s.strip() for s in _SENTENCE_END.split(passage.text)]
        sentences = [s for s in sentences if _is_prose(s)]
        if not sentences:
            continue
        sentence = sentences[_stable_hash(passage.doc_id) % len(sentences)]
        if sum(sentence in p.text for p in passages) != 1:
            continue  # the same sentence elsewhere: the gold passage would be ambiguous
        words = _WORD.findall(sentence)
        counts = Counter(w.lower() for w in words)
        eligible = sorted(
            {
                w
                for w in words
                if len(w) >= 6
                and w.lower() not in STOP_WORDS
                and w.lower() not in name_parts
                and counts[w.lower()] == 1
                and re.search(rf"(?<![A-Za-z]){w}(?![A-Za-z])", sentence)
            },
            key=lambda w: (df[w.lower()], _stable_hash(passage.doc_id + w)),
        )
        if not eligible:
            continue
        answer = eligible[0]
        blanked = re.sub(rf"(?<![A-Za-z]){answer}(?![A-Za-z])", BLANK, sentence, count=1)
        question = (
            f"In the documentation of the Python package {meta.name}, which word is missing from this "
            f'sentence: "{blanked}"?'
        )
        return Question(
            f"{QuestionKind.CLOZE.value}:{meta.key}", question, (answer,), passage.doc_id, QuestionKind.CLOZE
        )
    return None


def _is_prose(sentence: str) -> bool:
    tokens = sentence.split()
    if not 10 <= len(tokens) <= 35 or "http" in sentence or BLANK in sentence:
        return False
    alphabetic = sum(1 for t in tokens if re.fullmatch(r"[A-Za-z][A-Za-z'’,;:.!?()-]*", t))
    return alphabetic >= 0.8 * len(tokens) and not re.search(r"[{}\[\]=<>|`$\\]", sentence)
