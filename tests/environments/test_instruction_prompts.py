"""Instruction task sources: deterministic generation, the JSONL row format, IFEval's prompt file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.environments.instruction.checks import Constraint, ConstraintKind
from harnessrl.environments.instruction.prompts import (
    DEFAULT_KINDS,
    IFEVAL_KINDS,
    ONE_SENTENCE_KINDS,
    InstructionTask,
    WholeReply,
    compatible,
    generate_rows,
    load_base_prompts,
    load_ifeval,
    load_rows,
    topic_words,
    write_rows,
)

K = ConstraintKind


def test_base_prompts_are_sixty_distinct_requests() -> None:
    prompts = load_base_prompts()
    assert len(prompts) == 60 and len(set(prompts)) == 60


def test_generation_is_deterministic_and_per_task() -> None:
    first = generate_rows(12, seed=5, constraints_per_task=(1, 2, 3))
    assert first == generate_rows(12, seed=5, constraints_per_task=(1, 2, 3))
    assert first[:4] == generate_rows(4, seed=5, constraints_per_task=(1, 2, 3))  # task i ignores n
    assert first != generate_rows(12, seed=6, constraints_per_task=(1, 2, 3))
    assert [t.task_id for t in first[:2]] == ["if-s5-00000", "if-s5-00001"]


def test_generated_tasks_hold_compatible_constraints_and_their_instructions() -> None:
    tasks = generate_rows(300, seed=1, constraints_per_task=(2, 3))
    counts = {len(t.constraints) for t in tasks}
    assert counts == {2, 3}
    kinds_seen = {c.kind for t in tasks for c in t.constraints}
    assert kinds_seen == set(DEFAULT_KINDS)  # constrained_response is opt-in
    for t in tasks:
        assert compatible(c.kind for c in t.constraints), t
        for constraint in t.constraints:
            assert constraint.instruction() in t.prompt
        repeat = [c for c in t.constraints if c.kind == K.REPEAT_PROMPT]
        if repeat:
            assert t.constraints[-1] is repeat[0]  # last: it repeats everything before it
            assert t.prompt.startswith(str(repeat[0].args["prompt_to_repeat"]))


def test_case_constraints_put_the_other_phrases_in_that_case() -> None:
    tasks = generate_rows(20, seed=0, constraints_per_task=(2,), kinds=[K.ALL_LOWERCASE, K.STARTS_WITH])
    for t in tasks:
        phrase = next(c.args["phrase"] for c in t.constraints if c.kind == K.STARTS_WITH)
        assert phrase == str(phrase).lower()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        pytest.param(
            {"constraints_per_task": (2,), "kinds": [K.ALL_LOWERCASE, K.ALL_UPPERCASE]},
            "conflict",
            id="conflict",
        ),
        pytest.param({"constraints_per_task": (4,)}, "constraints_per_task must be", id="too-many"),
        pytest.param({"kinds": ["nope"]}, "kinds: .*valid kinds", id="bad-kind"),
        pytest.param({"kinds": []}, "at least one kind", id="no-kinds"),
    ],
)
def test_bad_generation_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate_rows(3, seed=0, **kwargs)


def test_rows_round_trip(tmp_path: Path) -> None:
    tasks = generate_rows(25, seed=2, constraints_per_task=(1, 2, 3))
    path = tmp_path / "rows.jsonl"
    assert write_rows(path, tasks) == 25
    assert load_rows(path) == tasks
    row = json.loads(path.read_text().splitlines()[0])
    assert set(row) == {"task_id", "prompt", "constraints"}


GOOD = {"task_id": "t1", "prompt": "Say hi.", "constraints": [{"kind": "no_commas", "args": {}}]}


@pytest.mark.parametrize(
    "lines, message",
    [
        pytest.param(["{not json"], r"rows.jsonl:1: malformed JSON", id="json"),
        pytest.param([json.dumps([1])], r"rows.jsonl:1: a row must be a JSON object", id="not-object"),
        pytest.param(
            [json.dumps({**GOOD, "prompt": ""})], r"rows.jsonl:1 \(task 't1'\): field 'prompt'", id="prompt"
        ),
        pytest.param([json.dumps({**GOOD, "answer": "x"})], r"unknown field 'answer'", id="extra-field"),
        pytest.param(
            [json.dumps({**GOOD, "constraints": []})], r"field 'constraints' must be a non-empty", id="none"
        ),
        pytest.param(
            [json.dumps({**GOOD, "constraints": [{"kind": "word_count", "args": {"relation": "at least"}}]})],
            r"\(task 't1'\): field 'constraints\[0\]': constraint word_count: missing arg 'num_words'",
            id="bad-args",
        ),
        pytest.param(
            [json.dumps(GOOD), "", json.dumps(GOOD)],
            r"rows.jsonl:3: duplicate task_id 't1' \(first on line 1\)",
            id="dup",
        ),
    ],
)
def test_bad_rows_name_file_line_task_and_field(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        load_rows(path)


# Rows in IFEval's input_data.jsonl format (written for this test): one as the GitHub file has it, one as the
# Hugging Face copy has it (every kwarg listed, unused ones null), one with an instruction we do not support.
IFEVAL_ROWS = [
    {
        "key": 7,
        "prompt": "Write a riddle about a clock. Use no commas and include a title in <<>>.",
        "instruction_id_list": [
            "punctuation:no_comma",
            "detectable_format:title",
            "keywords:letter_frequency",
        ],
        "kwargs": [{}, {}, {"letter": "t", "let_frequency": 3, "let_relation": "at least"}],
    },
    {
        "key": 8,
        "prompt": "Describe rain in 2 sections (Section X) and end with 'Is there anything else?'",
        "instruction_id_list": ["detectable_format:multiple_sections", "startend:end_checker"],
        "kwargs": [
            {"section_spliter": "Section", "num_sections": 2, "end_phrase": None},
            {"section_spliter": None, "num_sections": None, "end_phrase": "Is there anything else? "},
        ],
    },
    {
        "key": 9,
        "prompt": "Answer in French.",
        "instruction_id_list": ["language:response_language"],
        "kwargs": [{"language": "fr"}],
    },
]


def test_ifeval_rows_map_to_our_kinds(tmp_path: Path) -> None:
    path = tmp_path / "input_data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in IFEVAL_ROWS))
    loaded = load_ifeval(path)
    assert loaded.skipped == {"language:response_language": 1}
    first, second = loaded.tasks
    assert first == InstructionTask(
        "ifeval-7",
        IFEVAL_ROWS[0]["prompt"],
        (
            Constraint.of(K.NO_COMMAS),
            Constraint.of(K.TITLE),
            Constraint.of(K.LETTER_FREQUENCY, {"letter": "t", "frequency": 3, "relation": "at least"}),
        ),
    )
    assert [c.to_json() for c in second.constraints] == [
        {"kind": "sections", "args": {"num_sections": 2, "splitter": "Section"}},
        {"kind": "ends_with", "args": {"phrase": "Is there anything else?"}},
    ]
    assert second.score("Section 1 It pours.\nSection 2 It stops. Is there anything else?").strict


def test_ifeval_errors_name_the_row_and_kwarg(tmp_path: Path) -> None:
    bad = {
        **IFEVAL_ROWS[0],
        "kwargs": [{}, {}, {"letter": "t", "let_frequency": 0, "let_relation": "at least"}],
    }
    path = tmp_path / "input_data.jsonl"
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r":1 \(key 7\): field 'kwargs\[2\]' \(keywords:letter_frequency\)"):
        load_ifeval(path)


def test_ifeval_ids_cover_every_kind_but_starts_with() -> None:
    assert len(IFEVAL_KINDS) == 24  # IFEval's 25 less language:response_language
    assert set(ConstraintKind) - set(IFEVAL_KINDS.values()) == {K.STARTS_WITH}  # ours, not IFEval's


@pytest.mark.parametrize(
    ("request_text", "topics"),
    [
        pytest.param(
            "Write an email to your neighbour asking to borrow a ladder for the weekend.",
            ("neighbour", "borrow", "ladder", "weekend"),
            id="email",
        ),
        pytest.param(
            "Explain why the sky looks blue during the day.",
            ("sky", "looks", "blue", "during", "day"),
            id="explain",
        ),
        pytest.param("Describe how to make a simple cup of tea.", ("cup", "tea"), id="three-letter-words"),
        pytest.param("Describe your ideal weekend.", ("ideal", "weekend"), id="describe"),
    ],
)
def test_topic_words_are_what_a_request_is_about(request_text: str, topics: tuple[str, ...]) -> None:
    assert topic_words(request_text) == topics


def test_whole_reply_tasks_ask_for_one_sentence_with_words_and_a_word_of_the_request() -> None:
    for task in generate_rows(20, 3, (1, 2), None, whole_reply=WholeReply(min_words=12)):
        drawn, (count, keyword) = task.constraints[:-2], task.constraints[-2:]
        assert all(c.kind in ONE_SENTENCE_KINDS for c in drawn) and 1 <= len(drawn) <= 2
        assert (count.kind, count.args["relation"], count.args["num_words"]) == (K.WORD_COUNT, "at least", 12)
        request = task.prompt.split(" Reply in one sentence.")[0]
        assert keyword.kind == K.KEYWORDS_PRESENT
        [word] = keyword.args["keywords"]  # type: ignore[misc]  # in the task's case (all caps: upper)
        assert str(word).lower() in topic_words(request)
        assert task.prompt.endswith(keyword.instruction())
    with pytest.raises(ValueError, match="a one-sentence reply can meet"):
        generate_rows(1, 0, (1,), ["json_format"], whole_reply=WholeReply())


def test_every_base_request_names_topic_words() -> None:
    assert all(len(topic_words(request)) >= 2 for request in load_base_prompts())
