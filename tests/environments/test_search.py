"""The search environment on a real corpus: the package metadata installed in this interpreter's environment.

Corpus and questions are rebuilt here (deterministic, ~1 s); the index tests need bm25s and are skipped with
one line without it. The recall test prints the measured top-5 recall per question kind.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from harnessrl.environments.search.corpus import (
    CorpusError,
    PackageMeta,
    Passage,
    build_corpus,
    chunk_description,
    default_site_dirs,
    read_corpus,
    read_packages,
    write_corpus,
)
from harnessrl.environments.search.questions import (
    Question,
    QuestionError,
    QuestionKind,
    build_task_set,
    make_questions,
    read_questions,
    write_questions,
)
from harnessrl.environments.search.score import (
    RewardKind,
    exact_match,
    extract_answer,
    normalize_answer,
    score_reply,
    token_f1,
)

requires_bm25s = pytest.mark.skipif(
    importlib.util.find_spec("bm25s") is None, reason="bm25s not installed (the search index's library)"
)


@pytest.fixture(scope="module")
def packages() -> list[PackageMeta]:
    return read_packages(default_site_dirs())


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return build_corpus(default_site_dirs())


@pytest.fixture(scope="module")
def questions(packages: list[PackageMeta], passages: list[Passage]) -> list[Question]:
    return make_questions(packages, passages)


# -- corpus ------------------------------------------------------------------------------------------------
def test_corpus_is_deterministic_with_unique_ids_and_bounded_passages(passages: list[Passage]) -> None:
    assert len(passages) > 200
    assert build_corpus(default_site_dirs()) == passages
    ids = [p.doc_id for p in passages]
    assert len(set(ids)) == len(ids)
    assert all(p.text.strip() and p.title.strip() for p in passages)
    prose = [len(p.text.split()) for p in passages if not p.doc_id.endswith("/card")]
    assert max(prose) <= 200
    assert sorted(prose)[len(prose) // 2] >= 80  # most passages are ~100-200 words


def test_chunking_keeps_paragraphs_and_headings() -> None:
    text = "# Intro\n\n" + "word " * 120 + "\n\n## Usage\n\n" + "use " * 450 + "\n\nTail sentence here."
    chunks = chunk_description(text)
    assert chunks[0] == ("Intro", " ".join(["word"] * 120))
    assert all(h == "Usage" for h, _ in chunks[1:])
    assert all(len(t.split()) <= 200 for _, t in chunks)
    assert chunks[-1][1].endswith("Tail sentence here.")


def test_corpus_file_round_trips_with_its_digest(passages: list[Passage], tmp_path: Path) -> None:
    info = write_corpus(passages, tmp_path / "corpus.jsonl")
    assert read_corpus(tmp_path / "corpus.jsonl") == passages
    meta = json.loads((tmp_path / "corpus.jsonl.info.json").read_text())
    assert meta["sha256"] == info.sha256 and meta["passages"] == len(passages)
    (tmp_path / "bad.jsonl").write_text('{"doc_id": "x", "title": "t", "text": ""}\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl: line 1: field 'text'"):
        read_corpus(tmp_path / "bad.jsonl")


# -- questions ---------------------------------------------------------------------------------------------
def test_questions_have_verbatim_answers_the_question_does_not_give_away(
    questions: list[Question], passages: list[Passage]
) -> None:
    by_id = {p.doc_id: p for p in passages}
    assert len(questions) >= 100
    assert {q.kind for q in questions} == set(QuestionKind)
    assert len({q.task_id for q in questions}) == len(questions)
    for q in questions:
        assert all(a in by_id[q.doc_id].text for a in q.answers), q
        assert f" {normalize_answer(q.answers[0])} " not in f" {normalize_answer(q.question)} ", q
        assert q.doc_id not in q.question


def test_questions_are_deterministic_and_round_trip(
    packages: list[PackageMeta], passages: list[Passage], questions: list[Question], tmp_path: Path
) -> None:
    assert make_questions(packages, passages) == questions
    write_questions(questions, tmp_path / "q.jsonl")
    assert read_questions(tmp_path / "q.jsonl") == questions
    (tmp_path / "bad.jsonl").write_text(
        '{"task_id": "x", "question": "q?", "answers": [], "doc_id": "d", "kind": "license"}\n'
    )
    with pytest.raises(QuestionError, match=r"line 1: field 'answers'"):
        read_questions(tmp_path / "bad.jsonl")


def test_build_task_set_writes_both_files(tmp_path: Path) -> None:
    info = build_task_set(tmp_path, default_site_dirs())
    assert info.corpus.is_file() and info.questions.is_file()
    assert sum(info.counts.values()) == len(read_questions(info.questions))


# -- scoring -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, answers, em",
    [
        pytest.param("<answer>MIT</answer>", ["MIT"], 1.0, id="gold"),
        pytest.param("I searched.\n<answer> the mit. </answer>", ["MIT"], 1.0, id="case-article-punctuation"),
        pytest.param("<answer>>= 3.9</answer>", [">=3.9"], 1.0, id="operator-spacing"),
        pytest.param("<answer>3.9</answer>", [">=3.9"], 0.0, id="operator-dropped"),
        pytest.param("<answer>bsd 3 clause</answer>", ["BSD-3-Clause"], 1.0, id="hyphens"),
        pytest.param("<answer>Apache-2.0</answer>", ["MIT"], 0.0, id="wrong"),
        pytest.param("", ["MIT"], 0.0, id="empty"),
        pytest.param("<answer></answer>", ["MIT"], 0.0, id="empty-tag"),
        pytest.param("Let me think\nAnswer: 2.4.6", ["2.4.6"], 1.0, id="last-line"),
        pytest.param("<answer>MIT</answer> then <answer>GPL</answer>", ["MIT"], 0.0, id="last-tag-counts"),
    ],
)
def test_exact_match_table(reply: str, answers: list[str], em: float) -> None:
    assert score_reply(reply, answers).reward == em


def test_gaming_the_answer_does_not_score(questions: list[Question], passages: list[Passage]) -> None:
    by_id = {p.doc_id: p for p in passages}
    licenses = sorted({q.answers[0] for q in questions if q.kind is QuestionKind.LICENSE})
    for q in [q for q in questions if q.kind is QuestionKind.LICENSE][:20]:
        gold = q.answers
        assert score_reply(f"<answer>{gold[0]}</answer>", gold, RewardKind.F1).reward == 1.0
        listing = ", ".join(licenses)  # every candidate at once
        assert exact_match(listing, gold) == 0.0 and token_f1(listing, gold) < 0.5
        pasted = by_id[q.doc_id].text  # the whole passage as the answer
        assert exact_match(pasted, gold) == 0.0 and token_f1(pasted, gold) < 0.3
    cloze = next(q for q in questions if q.kind is QuestionKind.CLOZE)
    nouns = " ".join(w for w in by_id[cloze.doc_id].text.split() if len(w) > 5)  # stuffed superstring
    assert exact_match(nouns, cloze.answers) == 0.0 and token_f1(nouns, cloze.answers) < 0.3


def test_extract_answer_prefers_the_last_tag() -> None:
    assert extract_answer("<answer>a</answer>\n<ANSWER>\nb\n</ANSWER>") == "b"
    assert extract_answer("thinking...\n\nFinal answer: MIT\n\n") == "MIT"
    assert extract_answer("   ") == ""


# -- index -------------------------------------------------------------------------------------------------
@requires_bm25s
def test_gold_passage_in_top5_for_most_questions(passages: list[Passage], questions: list[Question]) -> None:
    from harnessrl.environments.search.index import SearchIndex

    index = SearchIndex(passages)
    found: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for q in questions:
        total[q.kind.value] += 1
        found[q.kind.value] += q.doc_id in [h.doc_id for h in index.search(q.question, 5)]
    recall = sum(found.values()) / len(questions)
    print(f"recall@5 {recall:.4f} " + " ".join(f"{k}={found[k]}/{total[k]}" for k in sorted(total)))
    assert recall >= 0.8


@requires_bm25s
def test_search_and_read(passages: list[Passage]) -> None:
    from harnessrl.environments.search.index import SearchIndex, UnknownDocument, tokenize

    index = SearchIndex(passages)
    hits = index.search("numpy license metadata", 5)
    assert 0 < len(hits) <= 5 and hits == index.search("numpy license metadata", 5)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert "numpy/card" in [h.doc_id for h in hits]
    top = hits[0]
    assert top.snippet.removeprefix("… ").removesuffix(" …") in " ".join(index.read(top.doc_id).split())
    assert index.search("", 5) == [] and index.search("qqqzzzvvv wwwkkkjjj", 5) == []
    assert len(index.search("python", 10_000)) <= len(passages)
    with pytest.raises(UnknownDocument, match="no passage with doc id 'nope'"):
        index.read("nope")
    assert tokenize("The typing-extensions 3.1.9!") == [
        "typing",
        "extensions",
        "typing-extensions",
        "3",
        "1",
        "9",
        "3.1.9",
    ]
