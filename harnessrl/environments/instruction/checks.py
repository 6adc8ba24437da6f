"""Programmatically verifiable instruction constraints (the kinds of IFEval) and the reward they give a reply.

This module owns the constraint vocabulary: `ConstraintKind` (one member per kind), `Constraint` (a kind and
its validated args, the English instruction appended to a prompt, and `check`), one small pure checker per
kind (`check_*`), and `score`, which turns a reply and a task's constraints into an `InstructionScore`
(strict and loose, per constraint and as partial credit). No I/O, no randomness, no model: task sources
(`prompts.py`) build constraints, the RL loop calls `score`.

Counting rules, the same for every kind (nltk-free on purpose):

- A word is a run of `\\w` characters (letters, digits, underscore; Unicode-aware), which is the rule IFEval
  itself counts words with (nltk's `RegexpTokenizer(r"\\w+")`): "don't" is two words, "state-of-the-art"
  four, "--- !!!" none, so symbol padding never reaches a word count.
- A sentence ends at `.`, `!` or `?` (runs of them, optionally followed by closing quotes or brackets)
  followed by whitespace or the end of the reply; common abbreviations ("Dr.", "e.g.") and single capital
  initials ("J.") do not end one; a trailing piece without end punctuation counts too; pieces without a word
  do not count (". . . ." is no sentence). Line breaks alone do not end a sentence.
- Keywords, keyword frequencies and forbidden words match whole words, case-insensitively: "cat" is not in
  "concatenate" (IFEval's keyword-existence and frequency checks match substrings; ours are stricter).
- **A reply without a single word fails every constraint**, the negative ones included (no commas,
  forbidden words, "at most N", all lowercase, ...): an empty or symbol-only reply would otherwise collect
  their credit for free. So a lowercase or uppercase check on "123 !!!" fails (there is no letter to be in
  the asked case), and so does JSON `{}`.

Where a kind is stricter than IFEval's checker (each on purpose, to close a way of gaming it): bullets,
highlights, titles, placeholders, sections and postscripts only count when they hold a word (sections count
by distinct number); a highlight is markdown emphasis (`*text*` or `**text**`, no space just inside the
stars, on one line); a postscript marker must open a line; `starts_with`/`ends_with` compare exactly
(case-sensitive) and ignore only leading/trailing whitespace; `repeat_prompt` needs an answer after the
repeated request (whitespace runs compared as one space, case-insensitively as in IFEval);
`constrained_response` fails a reply that gives more than one of the options; a paragraph count with the
`***` divider needs the divider on a line of its own. IFEval's language kind (`language:response_language`) needs a language identifier and is not here.

Loose scoring (IFEval's "loose accuracy"): a constraint passes loosely when it passes on any of eight
variants of the reply: the reply, without its first line, without its last line, without both, and each of
those four with every `*` removed (variants that are blank are skipped). This forgives a preamble ("Sure!
Here is...") or a closing line, and markdown stars around the text.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Concatenate, ParamSpec, cast

logger = logging.getLogger(__name__)

ArgValue = int | str | tuple[str, ...]
"""An arg's value: a count, a phrase/word/choice, or a tuple of words."""


class ConstraintKind(StrEnum):
    WORD_COUNT = "word_count"
    SENTENCE_COUNT = "sentence_count"
    PARAGRAPH_COUNT = "paragraph_count"
    PARAGRAPH_FIRST_WORD = "paragraph_first_word"
    KEYWORDS_PRESENT = "keywords_present"
    KEYWORD_FREQUENCY = "keyword_frequency"
    FORBIDDEN_WORDS = "forbidden_words"
    LETTER_FREQUENCY = "letter_frequency"
    ALL_LOWERCASE = "all_lowercase"
    ALL_UPPERCASE = "all_uppercase"
    CAPITAL_WORD_FREQUENCY = "capital_word_frequency"
    JSON_FORMAT = "json_format"
    BULLET_COUNT = "bullet_count"
    HIGHLIGHTED_SECTIONS = "highlighted_sections"
    TITLE = "title"
    SECTIONS = "sections"
    POSTSCRIPT = "postscript"
    STARTS_WITH = "starts_with"
    ENDS_WITH = "ends_with"
    QUOTED = "quoted"
    NO_COMMAS = "no_commas"
    PLACEHOLDERS = "placeholders"
    REPEAT_PROMPT = "repeat_prompt"
    TWO_RESPONSES = "two_responses"
    CONSTRAINED_RESPONSE = "constrained_response"


class Relation(StrEnum):
    """How a count compares with the asked number. `around`: within max(1, round(N / 10)) of N."""

    AT_LEAST = "at least"
    AT_MOST = "at most"
    LESS_THAN = "less than"  # IFEval's other relation (count < N)
    AROUND = "around"


class ParagraphSeparator(StrEnum):
    DIVIDER = "***"  # the markdown divider on a line of its own (IFEval's number_paragraphs)
    BLANK_LINE = "blank_line"  # one or more blank lines


CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")
TWO_RESPONSES_SEPARATOR = "******"

# ---- tokenization ---------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+")
_SENTENCE_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s|$)")
_TOKEN_BEFORE = re.compile(r"([\w.]+)$")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e inc ltd co no fig approx dept est mt".split()
)


def words(text: str) -> list[str]:
    """The reply's words: runs of `\\w` characters (the module docstring has the rule)."""
    return _WORD.findall(text)


def split_sentences(text: str) -> list[str]:
    """The reply's sentences, stripped (the module docstring has the rule)."""
    pieces: list[str] = []
    start = 0
    for end in _SENTENCE_END.finditer(text):
        if end.group().startswith(".") and _is_abbreviation(text[start : end.start()]):
            continue
        pieces.append(text[start : end.end()])
        start = end.end()
    pieces.append(text[start:])
    return [p.strip() for p in pieces if _WORD.search(p)]


def _is_abbreviation(before_period: str) -> bool:
    token = _TOKEN_BEFORE.search(before_period)
    if token is None:
        return False
    t = token.group(1)
    return t.lower() in _ABBREVIATIONS or (len(t) == 1 and t.isalpha() and t.isupper())


def _has_word(text: str) -> bool:
    return _WORD.search(text) is not None


def _compare(count: int, relation: Relation, n: int) -> bool:
    if relation == Relation.AT_LEAST:
        return count >= n
    if relation == Relation.AT_MOST:
        return count <= n
    if relation == Relation.LESS_THAN:
        return count < n
    return abs(count - n) <= max(1, round(n / 10))


def _whole_word(phrase: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)", re.IGNORECASE)


_P = ParamSpec("_P")


def _needs_a_word(check: Callable[Concatenate[str, _P], bool]) -> Callable[Concatenate[str, _P], bool]:
    """A reply without a single word fails (the module docstring says why)."""

    @functools.wraps(check)
    def guarded(response: str, *args: _P.args, **kwargs: _P.kwargs) -> bool:
        return _has_word(response) and check(response, *args, **kwargs)

    return guarded


# ---- one checker per kind -------------------------------------------------------------------------------


@_needs_a_word
def check_word_count(response: str, relation: Relation, num_words: int) -> bool:
    return _compare(len(words(response)), relation, num_words)


@_needs_a_word
def check_sentence_count(response: str, relation: Relation, num_sentences: int) -> bool:
    return _compare(len(split_sentences(response)), relation, num_sentences)


_DIVIDER_LINE = re.compile(r"^[ \t]*\*\*\*[ \t]*$", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def split_paragraphs(response: str, separator: ParagraphSeparator) -> list[str] | None:
    """The paragraphs, stripped; None when one between two separators is blank (a leading or trailing
    divider is allowed)."""
    if separator == ParagraphSeparator.BLANK_LINE:
        return [p.strip() for p in _BLANK_LINES.split(response.strip())]
    parts = [p.strip() for p in _DIVIDER_LINE.split(response)]
    if parts and not parts[0]:
        parts = parts[1:]
    if parts and not parts[-1]:
        parts = parts[:-1]
    return None if any(not p for p in parts) else parts


@_needs_a_word
def check_paragraph_count(response: str, num_paragraphs: int, separator: ParagraphSeparator) -> bool:
    paragraphs = split_paragraphs(response, separator)
    return paragraphs is not None and len(paragraphs) == num_paragraphs and all(map(_has_word, paragraphs))


@_needs_a_word
def check_paragraph_first_word(
    response: str, num_paragraphs: int, nth_paragraph: int, first_word: str
) -> bool:
    paragraphs = split_paragraphs(response, ParagraphSeparator.BLANK_LINE) or []
    if (
        len(paragraphs) != num_paragraphs
        or not all(map(_has_word, paragraphs))
        or nth_paragraph > num_paragraphs
    ):
        return False
    first = _WORD.search(paragraphs[nth_paragraph - 1])
    return first is not None and first.group().casefold() == first_word.casefold()


@_needs_a_word
def check_keywords_present(response: str, keywords: Sequence[str]) -> bool:
    return all(_whole_word(k).search(response) for k in keywords)


@_needs_a_word
def check_keyword_frequency(response: str, keyword: str, relation: Relation, frequency: int) -> bool:
    return _compare(len(_whole_word(keyword).findall(response)), relation, frequency)


@_needs_a_word
def check_forbidden_words(response: str, forbidden_words: Sequence[str]) -> bool:
    return not any(_whole_word(w).search(response) for w in forbidden_words)


@_needs_a_word
def check_letter_frequency(response: str, letter: str, relation: Relation, frequency: int) -> bool:
    return _compare(response.casefold().count(letter.casefold()), relation, frequency)


@_needs_a_word
def check_all_lowercase(response: str) -> bool:
    return response.islower()  # at least one cased letter, none of them upper case


@_needs_a_word
def check_all_uppercase(response: str) -> bool:
    return response.isupper()


@_needs_a_word
def check_capital_word_frequency(response: str, relation: Relation, frequency: int) -> bool:
    return _compare(sum(w.isupper() for w in words(response)), relation, frequency)


_JSON_FENCE_OPEN = re.compile(r"^```(?:json)?[ \t]*\n?", re.IGNORECASE)
_JSON_FENCE_CLOSE = re.compile(r"\n?```$")


@_needs_a_word
def check_json_format(response: str) -> bool:
    """The whole reply parses as JSON, optionally inside one ``` or ```json fence (as IFEval allows)."""
    text = _JSON_FENCE_CLOSE.sub("", _JSON_FENCE_OPEN.sub("", response.strip(), count=1), count=1).strip()
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


_BULLET = re.compile(r"^[ \t]*[*-][ \t]+(?=.*\w).+$", re.MULTILINE)


@_needs_a_word
def check_bullet_count(response: str, num_bullets: int) -> bool:
    """Exactly N markdown bullets (`* ` or `- ` opening a line, with a word in them)."""
    return len(_BULLET.findall(response)) == num_bullets


_HIGHLIGHT = re.compile(r"\*\*(?!\s)([^\n*]+?)(?<!\s)\*\*|\*(?!\s)([^\n*]+?)(?<!\s)\*")


@_needs_a_word
def check_highlighted_sections(response: str, num_highlights: int) -> bool:
    found = sum(1 for m in _HIGHLIGHT.finditer(response) if _has_word(m.group(1) or m.group(2)))
    return found >= num_highlights


_TITLE = re.compile(r"<<[^\n<>]*\w[^\n<>]*>>")


@_needs_a_word
def check_title(response: str) -> bool:
    return _TITLE.search(response) is not None


@_needs_a_word
def check_sections(response: str, num_sections: int, splitter: str) -> bool:
    """At least N sections (as IFEval), each opened by `<splitter> <number>` and holding a word; sections
    are told apart by their numbers, so repeating "SECTION 1" does not add a section."""
    markers = list(re.finditer(rf"(?<!\w){re.escape(splitter)}[ \t]+(\d+)(?!\w)", response))
    ends = [m.start() for m in markers[1:]] + [len(response)] * bool(markers)
    numbers = {
        int(m.group(1)) for m, end in zip(markers, ends, strict=True) if _has_word(response[m.end() : end])
    }
    return len(numbers) >= num_sections


def _marker_pattern(marker: str) -> str:
    return "".join(r"\.\s?" if ch == "." else re.escape(ch) for ch in marker)


@_needs_a_word
def check_postscript(response: str, marker: str) -> bool:
    """A line opening with the marker (case-insensitive, "P. S." too; markdown stars or `>` before it),
    followed by a word."""
    found = re.search(rf"^[ \t*_>]*{_marker_pattern(marker)}", response, re.IGNORECASE | re.MULTILINE)
    return found is not None and _has_word(response[found.end() :])


@_needs_a_word
def check_starts_with(response: str, phrase: str) -> bool:
    return response.lstrip().startswith(phrase)


@_needs_a_word
def check_ends_with(response: str, phrase: str) -> bool:
    return response.rstrip().endswith(phrase)


@_needs_a_word
def check_quoted(response: str) -> bool:
    text = response.strip()
    return len(text) >= 2 and text[0] == '"' and text[-1] == '"' and _has_word(text[1:-1])


@_needs_a_word
def check_no_commas(response: str) -> bool:
    return "," not in response


_PLACEHOLDER = re.compile(r"\[[^\[\]\n]*\w[^\[\]\n]*\](?!\()")  # not a markdown link's text


@_needs_a_word
def check_placeholders(response: str, num_placeholders: int) -> bool:
    return len(_PLACEHOLDER.findall(response)) >= num_placeholders


def _squash(text: str) -> str:
    return " ".join(text.split()).casefold()


@_needs_a_word
def check_repeat_prompt(response: str, prompt_to_repeat: str) -> bool:
    reply, request = _squash(response), _squash(prompt_to_repeat)
    return reply.startswith(request) and _has_word(reply[len(request) :])


@_needs_a_word
def check_two_responses(response: str) -> bool:
    parts = [p.strip() for p in re.split(r"(?<!\*)\*{6}(?!\*)", response)]
    if parts and not parts[0]:
        parts = parts[1:]
    if parts and not parts[-1]:
        parts = parts[:-1]
    return len(parts) == 2 and all(map(_has_word, parts)) and parts[0] != parts[1]


@_needs_a_word
def check_constrained_response(response: str) -> bool:
    return sum(option in response for option in CONSTRAINED_OPTIONS) == 1


# ---- args: validation and typed access ------------------------------------------------------------------


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("must be an integer >= 1")
    return value


def _phrase(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ValueError("must be a non-blank string without leading or trailing whitespace")
    return value


def _word(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"\w+", value):
        raise ValueError("must be one word (letters, digits or underscores)")
    return value


def _letter(value: object) -> str:
    if not isinstance(value, str) or len(value) != 1 or value.isspace():
        raise ValueError("must be one character, not whitespace (a letter, or a symbol such as '#')")
    return value.lower()


def _phrases(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple) or not value:
        raise ValueError("must be a non-empty list of strings")
    return tuple(_phrase(v) for v in value)


def _relation(value: object) -> str:
    try:
        return Relation(value).value
    except ValueError:
        raise ValueError(f"must be one of {', '.join(repr(r.value) for r in Relation)}") from None


def _separator(value: object) -> str:
    try:
        return ParagraphSeparator(value).value
    except ValueError:
        raise ValueError(f"must be one of {', '.join(repr(s.value) for s in ParagraphSeparator)}") from None


@dataclass(frozen=True)
class _Arg:
    name: str
    parse: Callable[[object], ArgValue]
    default: ArgValue | None = None  # None: required


def _int(args: Mapping[str, ArgValue], name: str) -> int:
    value = args[name]
    assert isinstance(value, int)
    return value


def _str(args: Mapping[str, ArgValue], name: str) -> str:
    value = args[name]
    assert isinstance(value, str)
    return value


def _strs(args: Mapping[str, ArgValue], name: str) -> tuple[str, ...]:
    value = args[name]
    assert isinstance(value, tuple)
    return value


def _rel(args: Mapping[str, ArgValue]) -> Relation:
    return Relation(_str(args, "relation"))


def _quoted_list(items: Sequence[str]) -> str:
    quoted = [f'"{i}"' for i in items]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


@dataclass(frozen=True)
class _Spec:
    args: tuple[_Arg, ...]
    check: Callable[[str, Mapping[str, ArgValue]], bool]
    instruction: Callable[[Mapping[str, ArgValue]], str]


K = ConstraintKind
_RELATION = _Arg("relation", _relation)
_SPECS: dict[ConstraintKind, _Spec] = {
    K.WORD_COUNT: _Spec(
        (_RELATION, _Arg("num_words", _count)),
        lambda r, a: check_word_count(r, _rel(a), _int(a, "num_words")),
        lambda a: f"Answer with {a['relation']} {a['num_words']} words.",
    ),
    K.SENTENCE_COUNT: _Spec(
        (_RELATION, _Arg("num_sentences", _count)),
        lambda r, a: check_sentence_count(r, _rel(a), _int(a, "num_sentences")),
        lambda a: f"Your response should contain {a['relation']} {a['num_sentences']} sentences.",
    ),
    K.PARAGRAPH_COUNT: _Spec(
        (_Arg("num_paragraphs", _count), _Arg("separator", _separator, ParagraphSeparator.DIVIDER.value)),
        lambda r, a: check_paragraph_count(
            r, _int(a, "num_paragraphs"), ParagraphSeparator(_str(a, "separator"))
        ),
        lambda a: (
            f"There should be exactly {a['num_paragraphs']} paragraphs, "
            + (
                "separated from each other by the markdown divider *** on a line of its own."
                if a["separator"] == ParagraphSeparator.DIVIDER
                else "separated from each other by one blank line."
            )
        ),
    ),
    K.PARAGRAPH_FIRST_WORD: _Spec(
        (_Arg("num_paragraphs", _count), _Arg("nth_paragraph", _count), _Arg("first_word", _word)),
        lambda r, a: check_paragraph_first_word(
            r, _int(a, "num_paragraphs"), _int(a, "nth_paragraph"), _str(a, "first_word")
        ),
        lambda a: (
            f"There should be exactly {a['num_paragraphs']} paragraphs, separated from each other by "
            f'one blank line. Paragraph {a["nth_paragraph"]} must start with the word "{a["first_word"]}".'
        ),
    ),
    K.KEYWORDS_PRESENT: _Spec(
        (_Arg("keywords", _phrases),),
        lambda r, a: check_keywords_present(r, _strs(a, "keywords")),
        lambda a: f"Include the keywords {_quoted_list(_strs(a, 'keywords'))} in your response.",
    ),
    K.KEYWORD_FREQUENCY: _Spec(
        (_Arg("keyword", _phrase), _RELATION, _Arg("frequency", _count)),
        lambda r, a: check_keyword_frequency(r, _str(a, "keyword"), _rel(a), _int(a, "frequency")),
        lambda a: (
            f'In your response, the word "{a["keyword"]}" should appear {a["relation"]} '
            f"{_times(_int(a, 'frequency'))}."
        ),
    ),
    K.FORBIDDEN_WORDS: _Spec(
        (_Arg("forbidden_words", _phrases),),
        lambda r, a: check_forbidden_words(r, _strs(a, "forbidden_words")),
        lambda a: f"Do not include the words {_quoted_list(_strs(a, 'forbidden_words'))} in your response.",
    ),
    K.LETTER_FREQUENCY: _Spec(
        (_Arg("letter", _letter), _RELATION, _Arg("frequency", _count)),
        lambda r, a: check_letter_frequency(r, _str(a, "letter"), _rel(a), _int(a, "frequency")),
        lambda a: (
            f'In your response, the letter "{a["letter"]}" should appear {a["relation"]} '
            f"{_times(_int(a, 'frequency'))}."
        ),
    ),
    K.ALL_LOWERCASE: _Spec(
        (),
        lambda r, a: check_all_lowercase(r),
        lambda a: (
            "Your entire response should be in English, in lowercase letters only: no capital letters "
            "are allowed."
        ),
    ),
    K.ALL_UPPERCASE: _Spec(
        (),
        lambda r, a: check_all_uppercase(r),
        lambda a: "Your entire response should be in English, in capital letters only.",
    ),
    K.CAPITAL_WORD_FREQUENCY: _Spec(
        (_RELATION, _Arg("frequency", _count)),
        lambda r, a: check_capital_word_frequency(r, _rel(a), _int(a, "frequency")),
        lambda a: (
            f"Your response should contain {a['relation']} {a['frequency']} words written in all "
            "capital letters."
        ),
    ),
    K.JSON_FORMAT: _Spec(
        (),
        lambda r, a: check_json_format(r),
        lambda a: (
            "Your entire output should be wrapped in JSON format. You may use markdown ticks such as ```."
        ),
    ),
    K.BULLET_COUNT: _Spec(
        (_Arg("num_bullets", _count),),
        lambda r, a: check_bullet_count(r, _int(a, "num_bullets")),
        lambda a: (
            f"Your answer must contain exactly {a['num_bullets']} bullet points. Use markdown bullet "
            "points such as:\n* This is point 1.\n* This is point 2"
        ),
    ),
    K.HIGHLIGHTED_SECTIONS: _Spec(
        (_Arg("num_highlights", _count),),
        lambda r, a: check_highlighted_sections(r, _int(a, "num_highlights")),
        lambda a: (
            f"Highlight at least {a['num_highlights']} sections in your answer with markdown, i.e. "
            "*highlighted section*."
        ),
    ),
    K.TITLE: _Spec(
        (),
        lambda r, a: check_title(r),
        lambda a: (
            "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."
        ),
    ),
    K.SECTIONS: _Spec(
        (_Arg("num_sections", _count), _Arg("splitter", _word, "SECTION")),
        lambda r, a: check_sections(r, _int(a, "num_sections"), _str(a, "splitter")),
        lambda a: (
            f"Your response must have {a['num_sections']} sections. Mark the beginning of each section "
            f"with {a['splitter']} X, such as: {a['splitter']} 1."
        ),
    ),
    K.POSTSCRIPT: _Spec(
        (_Arg("marker", _phrase, "P.S."),),
        lambda r, a: check_postscript(r, _str(a, "marker")),
        lambda a: (
            f"At the end of your response, please explicitly add a postscript starting with {a['marker']}"
        ),
    ),
    K.STARTS_WITH: _Spec(
        (_Arg("phrase", _phrase),),
        lambda r, a: check_starts_with(r, _str(a, "phrase")),
        lambda a: f'Start your response with the exact phrase "{a["phrase"]}".',
    ),
    K.ENDS_WITH: _Spec(
        (_Arg("phrase", _phrase),),
        lambda r, a: check_ends_with(r, _str(a, "phrase")),
        lambda a: (
            f'Finish your response with this exact phrase "{a["phrase"]}". No other words should '
            "follow this phrase."
        ),
    ),
    K.QUOTED: _Spec(
        (),
        lambda r, a: check_quoted(r),
        lambda a: "Wrap your entire response with double quotation marks.",
    ),
    K.NO_COMMAS: _Spec(
        (),
        lambda r, a: check_no_commas(r),
        lambda a: "In your entire response, refrain from the use of any commas.",
    ),
    K.PLACEHOLDERS: _Spec(
        (_Arg("num_placeholders", _count),),
        lambda r, a: check_placeholders(r, _int(a, "num_placeholders")),
        lambda a: (
            f"The response must contain at least {a['num_placeholders']} placeholders represented by "
            "square brackets, such as [address]."
        ),
    ),
    K.REPEAT_PROMPT: _Spec(
        (_Arg("prompt_to_repeat", _phrase),),
        lambda r, a: check_repeat_prompt(r, _str(a, "prompt_to_repeat")),
        lambda a: (
            "First repeat the request word for word without change, then give your answer (1. do not "
            "say any words or characters before repeating the request; 2. the request you need to repeat does "
            "not include this sentence)"
        ),
    ),
    K.TWO_RESPONSES: _Spec(
        (),
        lambda r, a: check_two_responses(r),
        lambda a: (
            "Give two different responses. Responses and only responses should be separated by 6 "
            f"asterisk symbols: {TWO_RESPONSES_SEPARATOR}."
        ),
    ),
    K.CONSTRAINED_RESPONSE: _Spec(
        (),
        lambda r, a: check_constrained_response(r),
        lambda a: f"Answer with one of the following options: {_quoted_list(CONSTRAINED_OPTIONS)}.",
    ),
}
assert set(_SPECS) == set(ConstraintKind), "every kind has a spec"


def arg_names(kind: ConstraintKind) -> tuple[str, ...]:
    """The args a kind takes, in order (those with defaults included)."""
    return tuple(a.name for a in _SPECS[kind].args)


def _validate_args(kind: ConstraintKind, args: Mapping[str, object]) -> dict[str, ArgValue]:
    spec = _SPECS[kind]
    known = {a.name for a in spec.args}
    unknown = sorted(set(args) - known)
    if unknown:
        expected = ", ".join(sorted(known)) or "none"
        raise ValueError(f"constraint {kind}: unknown arg {unknown[0]!r} (it takes: {expected})")
    out: dict[str, ArgValue] = {}
    for arg in spec.args:
        if arg.name not in args:
            if arg.default is None:
                raise ValueError(f"constraint {kind}: missing arg {arg.name!r}")
            out[arg.name] = arg.default
            continue
        try:
            out[arg.name] = arg.parse(args[arg.name])
        except ValueError as e:
            raise ValueError(f"constraint {kind}: arg {arg.name!r} {e}, got {args[arg.name]!r}") from None
    if kind == K.PARAGRAPH_FIRST_WORD and _int(out, "nth_paragraph") > _int(out, "num_paragraphs"):
        raise ValueError(
            f"constraint {kind}: arg 'nth_paragraph' must be <= num_paragraphs ({out['num_paragraphs']}), "
            f"got {out['nth_paragraph']!r}"
        )
    return out


# ---- the constraint -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Constraint:
    """One verifiable constraint. `args` are validated on construction (a ValueError names the kind and the
    arg); omitted args with a default get it; lists become tuples; the mapping is read-only."""

    kind: ConstraintKind
    args: Mapping[str, ArgValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            kind = ConstraintKind(self.kind)
        except ValueError:
            raise ValueError(
                f"constraint kind must be one of {', '.join(ConstraintKind)}, got {self.kind!r}"
            ) from None
        if not isinstance(self.args, Mapping):
            raise ValueError(f"constraint {kind}: args must be an object, got {self.args!r}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "args", MappingProxyType(_validate_args(kind, self.args)))

    def __hash__(self) -> int:  # args is a read-only mapping of hashable values
        return hash((self.kind, tuple(sorted(self.args.items()))))

    def instruction(self) -> str:
        """The English sentence appended to a prompt (IFEval-style)."""
        return _SPECS[self.kind].instruction(self.args)

    def check(self, response: str) -> bool:
        return _SPECS[self.kind].check(response, self.args)

    def to_json(self) -> dict[str, object]:
        """`{kind, args}` as a task row holds it (tuples as lists)."""
        return {
            "kind": self.kind.value,
            "args": {k: list(v) if isinstance(v, tuple) else v for k, v in self.args.items()},
        }

    @classmethod
    def of(cls, kind: ConstraintKind | str, args: Mapping[str, object] | None = None) -> Constraint:
        """A constraint from unchecked args (from JSON): validated as on construction."""
        return cls(cast(ConstraintKind, kind), cast("Mapping[str, ArgValue]", args or {}))

    @classmethod
    def from_json(cls, obj: object) -> Constraint:
        """From a row's `{kind, args}` object; a ValueError says what is wrong."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"a constraint must be an object {{kind, args}}, got {obj!r}")
        unknown = sorted(set(obj) - {"kind", "args"})
        if unknown:
            raise ValueError(f"a constraint has only 'kind' and 'args', got {unknown[0]!r}")
        if "kind" not in obj:
            raise ValueError("a constraint needs 'kind'")
        args = obj.get("args") or {}
        if not isinstance(args, Mapping):
            raise ValueError(f"a constraint's 'args' must be an object, got {args!r}")
        return cls.of(str(obj["kind"]), args)


# ---- scoring --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstructionScore:
    """A reply's score on a task's constraints, in the task's order.

    `passed[i]`: constraint i holds on the reply as it is; `fraction`: the share that holds (partial credit);
    `strict`: all hold. `loose_*`: the same under IFEval's loose rule (module docstring)."""

    passed: tuple[bool, ...]
    loose_passed: tuple[bool, ...]
    fraction: float
    strict: bool
    loose_fraction: float
    loose: bool


def loose_variants(response: str) -> tuple[str, ...]:
    """The eight variants loose scoring tries (module docstring), blank ones left out."""
    lines = response.split("\n")
    trimmed = [response, "\n".join(lines[1:]), "\n".join(lines[:-1]), "\n".join(lines[1:-1])]
    variants = trimmed + [t.replace("*", "") for t in trimmed]
    return tuple(v for v in variants if v.strip())


def score(response: str, constraints: Sequence[Constraint]) -> InstructionScore:
    if not constraints:
        raise ValueError("score needs at least one constraint (a task without constraints has no reward)")
    passed = tuple(c.check(response) for c in constraints)
    variants = loose_variants(response)
    loose = tuple(p or any(c.check(v) for v in variants) for c, p in zip(constraints, passed, strict=True))
    return InstructionScore(
        passed=passed,
        loose_passed=loose,
        fraction=sum(passed) / len(passed),
        strict=all(passed),
        loose_fraction=sum(loose) / len(loose),
        loose=all(loose),
    )
