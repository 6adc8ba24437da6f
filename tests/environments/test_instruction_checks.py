"""Hand-computed tables for every constraint kind: passing, failing, empty and adversarial replies."""

from __future__ import annotations

import pytest

from harnessrl.environments.instruction.checks import (
    Constraint,
    ConstraintKind,
    loose_variants,
    score,
    split_sentences,
    words,
)

K = ConstraintKind


def c(kind: ConstraintKind, **args: object) -> Constraint:
    return Constraint.of(kind, args)


TWENTY_WORDS = " ".join(["word"] * 20)

CASES = [
    # word_count: words are \w+ runs
    pytest.param(
        c(K.WORD_COUNT, relation="at least", num_words=5),
        "One two three four five.",
        True,
        id="words-at-least-exact",
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="at least", num_words=5),
        "One two three four.",
        False,
        id="words-at-least-short",
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="at most", num_words=3), "Hi there friend", True, id="words-at-most-ok"
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="at most", num_words=3), "Hi there my friend", False, id="words-at-most-over"
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="less than", num_words=3), "Hi there friend", False, id="words-less-than"
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="around", num_words=20), " ".join(["w"] * 18), True, id="words-around-in"
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="around", num_words=20), " ".join(["w"] * 23), False, id="words-around-out"
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="at least", num_words=3), "don't stop", True, id="words-apostrophe-splits"
    ),
    pytest.param(
        c(K.WORD_COUNT, relation="at least", num_words=5),
        "ok !!! ??? ### --- ...",
        False,
        id="words-symbols-dont-count",
    ),
    # sentence_count
    pytest.param(
        c(K.SENTENCE_COUNT, relation="at least", num_sentences=3),
        "I woke up. Dr. Smith called! Was it late?",
        True,
        id="sentences-abbreviation",
    ),
    pytest.param(
        c(K.SENTENCE_COUNT, relation="at most", num_sentences=2),
        "I woke up. Dr. Smith called! Was it late?",
        False,
        id="sentences-too-many",
    ),
    pytest.param(
        c(K.SENTENCE_COUNT, relation="at least", num_sentences=3),
        "Hi. . . . . .",
        False,
        id="sentences-dots-dont-count",
    ),
    pytest.param(
        c(K.SENTENCE_COUNT, relation="at least", num_sentences=2),
        "First one. second without end",
        True,
        id="sentences-trailing-piece",
    ),
    pytest.param(
        c(K.SENTENCE_COUNT, relation="at most", num_sentences=1),
        "Use tools, e.g. a hammer. Then rest.",
        False,
        id="sentences-eg-not-an-end",
    ),
    # paragraph_count
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=2), "Para one.\n***\nPara two.", True, id="paragraphs-divider"
    ),
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=3),
        "Para one.\n***\nPara two.",
        False,
        id="paragraphs-divider-too-few",
    ),
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=2),
        "***\nPara one.\n***\nPara two.\n***",
        True,
        id="paragraphs-divider-edges",
    ),
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=2),
        "Para one.\n***\n\n***\nPara two.",
        False,
        id="paragraphs-empty-middle",
    ),
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=2),
        "Para one.\n\nPara two.",
        False,
        id="paragraphs-blank-is-not-divider",
    ),
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=3, separator="blank_line"),
        "A.\n\nB.\n \n\nC.",
        True,
        id="paragraphs-blank-lines",
    ),
    pytest.param(
        c(K.PARAGRAPH_COUNT, num_paragraphs=2, separator="blank_line"),
        "A.\n\nB.\n\nC.",
        False,
        id="paragraphs-blank-too-many",
    ),
    # paragraph_first_word
    pytest.param(
        c(K.PARAGRAPH_FIRST_WORD, num_paragraphs=2, nth_paragraph=2, first_word="however"),
        "Intro here.\n\nHowever, it rained.",
        True,
        id="first-word-ok",
    ),
    pytest.param(
        c(K.PARAGRAPH_FIRST_WORD, num_paragraphs=2, nth_paragraph=2, first_word="however"),
        "Intro.\n\n**However** it rained.",
        True,
        id="first-word-markdown",
    ),
    pytest.param(
        c(K.PARAGRAPH_FIRST_WORD, num_paragraphs=2, nth_paragraph=2, first_word="however"),
        "Intro.\n\nBut it rained.",
        False,
        id="first-word-wrong",
    ),
    pytest.param(
        c(K.PARAGRAPH_FIRST_WORD, num_paragraphs=2, nth_paragraph=1, first_word="however"),
        "However one.\n\nTwo.\n\nThree.",
        False,
        id="first-word-count",
    ),
    # keywords: whole words, case-insensitive
    pytest.param(
        c(K.KEYWORDS_PRESENT, keywords=["cat", "blue sky"]),
        "My Cat loves the Blue Sky.",
        True,
        id="keywords-present",
    ),
    pytest.param(
        c(K.KEYWORDS_PRESENT, keywords=["cat", "blue sky"]),
        "My cat loves the sea.",
        False,
        id="keywords-one-missing",
    ),
    pytest.param(
        c(K.KEYWORD_FREQUENCY, keyword="cat", relation="at least", frequency=2),
        "A cat and a CAT.",
        True,
        id="keyword-frequency-ok",
    ),
    pytest.param(
        c(K.KEYWORD_FREQUENCY, keyword="cat", relation="at least", frequency=2),
        "A cat in a catalog.",
        False,
        id="keyword-frequency-substring",
    ),
    pytest.param(
        c(K.KEYWORD_FREQUENCY, keyword="cat", relation="less than", frequency=2),
        "Just one cat.",
        True,
        id="keyword-frequency-less-than",
    ),
    pytest.param(
        c(K.FORBIDDEN_WORDS, forbidden_words=["very"]),
        "Everything is quite nice.",
        True,
        id="forbidden-substring-ok",
    ),
    pytest.param(
        c(K.FORBIDDEN_WORDS, forbidden_words=["very", "nice"]),
        "It is Very good.",
        False,
        id="forbidden-present",
    ),
    # letter frequency: case-insensitive character count
    pytest.param(
        c(K.LETTER_FREQUENCY, letter="a", relation="at least", frequency=4),
        "A banana",
        True,
        id="letter-at-least",
    ),
    pytest.param(
        c(K.LETTER_FREQUENCY, letter="a", relation="at most", frequency=3),
        "A banana",
        False,
        id="letter-at-most",
    ),
    pytest.param(
        c(K.LETTER_FREQUENCY, letter="z", relation="less than", frequency=2),
        "pizza",
        False,
        id="letter-less-than",
    ),
    # case
    pytest.param(c(K.ALL_LOWERCASE), "hello world 42.", True, id="lowercase-ok"),
    pytest.param(c(K.ALL_LOWERCASE), "Hello world", False, id="lowercase-capital"),
    pytest.param(c(K.ALL_LOWERCASE), "123 456", False, id="lowercase-no-letters-fails"),
    pytest.param(c(K.ALL_UPPERCASE), "HELLO WORLD, 2 TIMES!", True, id="uppercase-ok"),
    pytest.param(c(K.ALL_UPPERCASE), "HELLO world", False, id="uppercase-lower"),
    pytest.param(
        c(K.CAPITAL_WORD_FREQUENCY, relation="at least", frequency=3),
        "I like NASA and the USA.",
        True,
        id="capitals-at-least",
    ),
    pytest.param(
        c(K.CAPITAL_WORD_FREQUENCY, relation="at most", frequency=2),
        "I like NASA and the USA.",
        False,
        id="capitals-at-most",
    ),
    pytest.param(
        c(K.CAPITAL_WORD_FREQUENCY, relation="less than", frequency=3),
        "Both NASA and ESA.",
        True,
        id="capitals-less-than",
    ),
    # json
    pytest.param(c(K.JSON_FORMAT), '{"a": 1}', True, id="json-plain"),
    pytest.param(c(K.JSON_FORMAT), '```json\n{"a": [1, 2]}\n```', True, id="json-fenced"),
    pytest.param(c(K.JSON_FORMAT), '```\n["x", "y"]\n```\n', True, id="json-bare-fence"),
    pytest.param(c(K.JSON_FORMAT), '{"a": 1', False, id="json-broken"),
    pytest.param(c(K.JSON_FORMAT), '{"a": 1}\nHope this helps!', False, id="json-trailing-prose"),
    pytest.param(c(K.JSON_FORMAT), "{}", False, id="json-empty-object-no-word"),
    # bullets: exactly N, each holding a word
    pytest.param(c(K.BULLET_COUNT, num_bullets=3), "Intro:\n* one\n* two\n  - three", True, id="bullets-ok"),
    pytest.param(c(K.BULLET_COUNT, num_bullets=2), "* one\n* two\n* three", False, id="bullets-too-many"),
    pytest.param(
        c(K.BULLET_COUNT, num_bullets=2),
        "**Bold** line\n* one\n*\n* \n- !!!\n* two\n***",
        True,
        id="bullets-ignore-empty",
    ),
    # highlights: *text* or **text**, at least N
    pytest.param(c(K.HIGHLIGHTED_SECTIONS, num_highlights=2), "*one* and **two**", True, id="highlights-ok"),
    pytest.param(
        c(K.HIGHLIGHTED_SECTIONS, num_highlights=2), "Only *one* here.", False, id="highlights-too-few"
    ),
    pytest.param(
        c(K.HIGHLIGHTED_SECTIONS, num_highlights=1), "2 * 3 * 4 is 24", False, id="highlights-multiplication"
    ),
    pytest.param(
        c(K.HIGHLIGHTED_SECTIONS, num_highlights=1),
        "* item one\n* item two",
        False,
        id="highlights-bullets-are-not",
    ),
    # title
    pytest.param(c(K.TITLE), "<<My Title>>\nSome text.", True, id="title-ok"),
    pytest.param(c(K.TITLE), "<<>> Some text.", False, id="title-empty"),
    pytest.param(c(K.TITLE), "<My Title> Some text.", False, id="title-single-brackets"),
    # sections: at least N, each with content
    pytest.param(
        c(K.SECTIONS, num_sections=2), "SECTION 1\nIntro.\nSECTION 2\nBody.", True, id="sections-ok"
    ),
    pytest.param(
        c(K.SECTIONS, num_sections=3), "SECTION 1\nIntro.\nSECTION 2\nBody.", False, id="sections-too-few"
    ),
    pytest.param(c(K.SECTIONS, num_sections=2), "SECTION 1\nSECTION 2\n", False, id="sections-empty"),
    pytest.param(
        c(K.SECTIONS, num_sections=2), "SECTION 1 a.\nSECTION 1 b.", False, id="sections-repeated-number"
    ),
    pytest.param(
        c(K.SECTIONS, num_sections=2), "Section 1 a. Section 2 b.", False, id="sections-case-sensitive"
    ),
    pytest.param(
        c(K.SECTIONS, num_sections=2, splitter="PART"), "PART 1: a. PART 2: b.", True, id="sections-splitter"
    ),
    # postscript
    pytest.param(c(K.POSTSCRIPT), "Hello.\nP.S. See you soon.", True, id="ps-ok"),
    pytest.param(c(K.POSTSCRIPT), "Hello.\n**p. s.** see you", True, id="ps-case-space-markdown"),
    pytest.param(c(K.POSTSCRIPT), "Hello. P.S. see you", False, id="ps-not-line-start"),
    pytest.param(c(K.POSTSCRIPT), "Hello.\nP.S.", False, id="ps-empty"),
    pytest.param(c(K.POSTSCRIPT, marker="P.P.S"), "Hi.\nP.P.S. Bye.", True, id="pps-ok"),
    pytest.param(c(K.POSTSCRIPT, marker="P.P.S"), "Hi.\nP.S. Bye.", False, id="pps-wrong-marker"),
    # start / end: exact, whitespace only ignored
    pytest.param(c(K.STARTS_WITH, phrase="Dear Sam,"), "  Dear Sam, hello.", True, id="starts-ok"),
    pytest.param(c(K.STARTS_WITH, phrase="Dear Sam,"), "dear Sam, hello.", False, id="starts-case"),
    pytest.param(c(K.STARTS_WITH, phrase="Dear Sam,"), "Hi. Dear Sam, hello.", False, id="starts-later"),
    pytest.param(
        c(K.ENDS_WITH, phrase="Any other questions?"), "Text. Any other questions?  \n", True, id="ends-ok"
    ),
    pytest.param(
        c(K.ENDS_WITH, phrase="Any other questions?"),
        "Text. Any other questions?.",
        False,
        id="ends-extra-period",
    ),
    pytest.param(
        c(K.ENDS_WITH, phrase="Any other questions?"), "Text. any other questions?", False, id="ends-case"
    ),
    # quotes, commas
    pytest.param(c(K.QUOTED), '  "Hello there"\n', True, id="quoted-ok"),
    pytest.param(c(K.QUOTED), 'Hello "there"', False, id="quoted-partial"),
    pytest.param(c(K.QUOTED), '"Hello there', False, id="quoted-unclosed"),
    pytest.param(c(K.NO_COMMAS), "No commas here.", True, id="no-commas-ok"),
    pytest.param(c(K.NO_COMMAS), "One, two", False, id="no-commas-comma"),
    # placeholders: at least N, non-empty, not link text
    pytest.param(
        c(K.PLACEHOLDERS, num_placeholders=2), "[name] lives at [address].", True, id="placeholders-ok"
    ),
    pytest.param(
        c(K.PLACEHOLDERS, num_placeholders=2), "[] and [ ] and [name]", False, id="placeholders-empty"
    ),
    pytest.param(
        c(K.PLACEHOLDERS, num_placeholders=2),
        "[site](http://x.org) and [name]",
        False,
        id="placeholders-link",
    ),
    # repeat prompt
    pytest.param(
        c(K.REPEAT_PROMPT, prompt_to_repeat="Write a poem."),
        "Write a poem.\nRoses are red.",
        True,
        id="repeat-ok",
    ),
    pytest.param(
        c(K.REPEAT_PROMPT, prompt_to_repeat="Write a poem."),
        "write  a\npoem. Roses",
        True,
        id="repeat-whitespace-case",
    ),
    pytest.param(
        c(K.REPEAT_PROMPT, prompt_to_repeat="Write a poem."), "Write a poem.", False, id="repeat-no-answer"
    ),
    pytest.param(
        c(K.REPEAT_PROMPT, prompt_to_repeat="Write a poem."),
        "Sure! Write a poem. Roses",
        False,
        id="repeat-preamble",
    ),
    # two responses
    pytest.param(c(K.TWO_RESPONSES), "First answer.\n******\nSecond answer.", True, id="two-ok"),
    pytest.param(c(K.TWO_RESPONSES), "Same.\n******\nSame.", False, id="two-identical"),
    pytest.param(c(K.TWO_RESPONSES), "A.\n******\nB.\n******\nC.", False, id="two-three"),
    pytest.param(c(K.TWO_RESPONSES), "A.\n*******\nB.", False, id="two-seven-stars"),
    pytest.param(c(K.TWO_RESPONSES), "A.\n******\n", False, id="two-one-part"),
    # constrained response
    pytest.param(c(K.CONSTRAINED_RESPONSE), "I think so. My answer is maybe.", True, id="constrained-ok"),
    pytest.param(
        c(K.CONSTRAINED_RESPONSE), "My answer is yes. My answer is no.", False, id="constrained-two-options"
    ),
    pytest.param(c(K.CONSTRAINED_RESPONSE), "my answer is yes", False, id="constrained-inexact"),
]


@pytest.mark.parametrize("constraint, response, expected", CASES)
def test_check_table(constraint: Constraint, response: str, expected: bool) -> None:
    assert constraint.check(response) is expected


def test_table_covers_every_kind() -> None:
    covered = {v.kind for p in CASES for v in p.values[:1] if isinstance(v, Constraint)}
    assert covered == set(ConstraintKind)


EXAMPLES: dict[ConstraintKind, Constraint] = {
    K.WORD_COUNT: c(K.WORD_COUNT, relation="at most", num_words=50),
    K.SENTENCE_COUNT: c(K.SENTENCE_COUNT, relation="at most", num_sentences=3),
    K.PARAGRAPH_COUNT: c(K.PARAGRAPH_COUNT, num_paragraphs=1),
    K.PARAGRAPH_FIRST_WORD: c(K.PARAGRAPH_FIRST_WORD, num_paragraphs=1, nth_paragraph=1, first_word="a"),
    K.KEYWORDS_PRESENT: c(K.KEYWORDS_PRESENT, keywords=["cat"]),
    K.KEYWORD_FREQUENCY: c(K.KEYWORD_FREQUENCY, keyword="cat", relation="less than", frequency=2),
    K.FORBIDDEN_WORDS: c(K.FORBIDDEN_WORDS, forbidden_words=["cat"]),
    K.LETTER_FREQUENCY: c(K.LETTER_FREQUENCY, letter="z", relation="less than", frequency=2),
    K.ALL_LOWERCASE: c(K.ALL_LOWERCASE),
    K.ALL_UPPERCASE: c(K.ALL_UPPERCASE),
    K.CAPITAL_WORD_FREQUENCY: c(K.CAPITAL_WORD_FREQUENCY, relation="less than", frequency=2),
    K.JSON_FORMAT: c(K.JSON_FORMAT),
    K.BULLET_COUNT: c(K.BULLET_COUNT, num_bullets=1),
    K.HIGHLIGHTED_SECTIONS: c(K.HIGHLIGHTED_SECTIONS, num_highlights=1),
    K.TITLE: c(K.TITLE),
    K.SECTIONS: c(K.SECTIONS, num_sections=1),
    K.POSTSCRIPT: c(K.POSTSCRIPT),
    K.STARTS_WITH: c(K.STARTS_WITH, phrase="***"),
    K.ENDS_WITH: c(K.ENDS_WITH, phrase="!!!"),
    K.QUOTED: c(K.QUOTED),
    K.NO_COMMAS: c(K.NO_COMMAS),
    K.PLACEHOLDERS: c(K.PLACEHOLDERS, num_placeholders=1),
    K.REPEAT_PROMPT: c(K.REPEAT_PROMPT, prompt_to_repeat="***"),
    K.TWO_RESPONSES: c(K.TWO_RESPONSES),
    K.CONSTRAINED_RESPONSE: c(K.CONSTRAINED_RESPONSE),
}


@pytest.mark.parametrize(
    "response", ["", "   \n\t", "*** --- !!! ... ******"], ids=["empty", "blank", "symbols"]
)
@pytest.mark.parametrize("kind", list(ConstraintKind))
def test_a_reply_without_a_word_fails_every_kind(kind: ConstraintKind, response: str) -> None:
    # negative constraints (no commas, forbidden words, at most N, less than N) included: see the module docstring
    assert EXAMPLES[kind].check(response) is False


ADVERSARIAL = [
    pytest.param(
        [c(K.WORD_COUNT, relation="at least", num_words=50)], "ok " + "!!! ... --- " * 40, id="symbol-padding"
    ),
    pytest.param(
        [
            c(K.KEYWORDS_PRESENT, keywords=["cat"]),
            c(K.KEYWORD_FREQUENCY, keyword="cat", relation="at least", frequency=3),
        ],
        "concatenate catalogue cats scatter bobcat concatenation",
        id="keyword-stuffing-inside-words",
    ),
    pytest.param([c(K.JSON_FORMAT)], 'Sure! Here is the JSON: {"name": "Ann"}', id="json-inside-prose"),
    pytest.param([c(K.ALL_LOWERCASE), c(K.ALL_UPPERCASE)], "123 456 789 !!!", id="case-without-letters"),
    pytest.param(
        [c(K.BULLET_COUNT, num_bullets=3), c(K.HIGHLIGHTED_SECTIONS, num_highlights=2)],
        "text\n*\n* \n- ...\n* * ** **",
        id="empty-markup",
    ),
    pytest.param(
        [
            c(K.NO_COMMAS),
            c(K.FORBIDDEN_WORDS, forbidden_words=["bad"]),
            c(K.WORD_COUNT, relation="at most", num_words=5),
        ],
        "",
        id="empty-reply-negatives",
    ),
    pytest.param(
        [c(K.REPEAT_PROMPT, prompt_to_repeat="Write a poem.")],
        "  Write a poem. ",
        id="echo-without-answering",
    ),
    pytest.param([c(K.TWO_RESPONSES)], "Yes.\n******\n  Yes.", id="two-identical-responses"),
    pytest.param(
        [c(K.PLACEHOLDERS, num_placeholders=3), c(K.TITLE), c(K.SECTIONS, num_sections=2)],
        "[ ] [] [ ] <<  >> SECTION 1 SECTION 2",
        id="empty-placeholders-title-sections",
    ),
]


@pytest.mark.parametrize("constraints, response", ADVERSARIAL)
def test_adversarial_replies_score_zero(constraints: list[Constraint], response: str) -> None:
    result = score(response, constraints)
    assert result.fraction == 0.0 and not result.strict
    assert result.loose_fraction == 0.0


def test_score_partial_credit_and_strict() -> None:
    constraints = [
        c(K.NO_COMMAS),
        c(K.WORD_COUNT, relation="at least", num_words=3),
        c(K.TITLE),
    ]
    full = score("<<T>>\nhello there friend", constraints)
    assert (full.passed, full.fraction, full.strict) == ((True, True, True), 1.0, True)
    partial = score("hello, there friend", constraints)
    assert partial.passed == (False, True, False)
    assert partial.fraction == pytest.approx(1 / 3)
    assert not partial.strict and not partial.loose


@pytest.mark.parametrize(
    "constraint, response",
    [
        pytest.param(c(K.ENDS_WITH, phrase="Bye."), "Text here. Bye.\nLet me know!", id="closing-line"),
        pytest.param(c(K.STARTS_WITH, phrase="Hello"), "Sure, here you go:\nHello there", id="preamble-line"),
        pytest.param(c(K.QUOTED), '**"Hi there"**', id="stars-around"),
    ],
)
def test_loose_forgives_first_last_line_and_stars(constraint: Constraint, response: str) -> None:
    result = score(response, [constraint])
    assert result.passed == (False,) and result.loose_passed == (True,)
    assert (result.strict, result.loose, result.loose_fraction) == (False, True, 1.0)


def test_loose_variants_are_ifevals_eight() -> None:
    assert loose_variants("a*\nb\nc*") == ("a*\nb\nc*", "b\nc*", "a*\nb", "b", "a\nb\nc", "b\nc", "a\nb", "b")
    assert loose_variants("one line") == ("one line", "one line")  # blank variants left out


def test_tokenization_rules() -> None:
    assert words("don't state-of-the-art x_y 42 --") == ["don", "t", "state", "of", "the", "art", "x_y", "42"]
    assert split_sentences('He said "stop!" Then J. K. left. Wow') == [
        'He said "stop!"',
        "Then J. K. left.",
        "Wow",
    ]


@pytest.mark.parametrize(
    "kind, args, message",
    [
        pytest.param(
            K.WORD_COUNT, {"relation": "at least"}, "word_count: missing arg 'num_words'", id="missing"
        ),
        pytest.param(
            K.WORD_COUNT,
            {"relation": "more than", "num_words": 5},
            "word_count: arg 'relation' must be one of",
            id="relation",
        ),
        pytest.param(
            K.WORD_COUNT,
            {"relation": "at least", "num_words": 0},
            "arg 'num_words' must be an integer >= 1",
            id="zero",
        ),
        pytest.param(
            K.WORD_COUNT,
            {"relation": "at least", "num_words": True},
            "arg 'num_words' must be an integer",
            id="bool",
        ),
        pytest.param(K.NO_COMMAS, {"x": 1}, "no_commas: unknown arg 'x' (it takes: none)", id="unknown"),
        pytest.param(
            K.KEYWORDS_PRESENT,
            {"keywords": "cat"},
            "keywords_present: arg 'keywords' must be a non-empty list",
            id="str-not-list",
        ),
        pytest.param(
            K.KEYWORDS_PRESENT, {"keywords": []}, "arg 'keywords' must be a non-empty list", id="empty-list"
        ),
        pytest.param(
            K.STARTS_WITH,
            {"phrase": " Hi"},
            "starts_with: arg 'phrase' must be a non-blank string without leading",
            id="padded-phrase",
        ),
        pytest.param(
            K.LETTER_FREQUENCY,
            {"letter": "ab", "relation": "at least", "frequency": 2},
            "arg 'letter' must be one character",
            id="letter",
        ),
        pytest.param(
            K.PARAGRAPH_FIRST_WORD,
            {"num_paragraphs": 2, "nth_paragraph": 3, "first_word": "a"},
            "'nth_paragraph' must be <= num_paragraphs (2)",
            id="nth",
        ),
        pytest.param(
            K.PARAGRAPH_COUNT,
            {"num_paragraphs": 2, "separator": "---"},
            "paragraph_count: arg 'separator' must be one of",
            id="separator",
        ),
        pytest.param("bogus", {}, "constraint kind must be one of", id="kind"),
    ],
)
def test_bad_args_name_the_kind_and_arg(kind: str, args: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Constraint.of(kind, args)


def test_json_round_trip_defaults_and_instructions() -> None:
    original = c(K.KEYWORDS_PRESENT, keywords=["cat", "blue sky"])
    assert original.to_json() == {"kind": "keywords_present", "args": {"keywords": ["cat", "blue sky"]}}
    assert Constraint.from_json(original.to_json()) == original
    assert len({original, Constraint.from_json(original.to_json())}) == 1  # hashable, by value
    assert original.instruction() == 'Include the keywords "cat" and "blue sky" in your response.'
    assert c(K.WORD_COUNT, relation="at least", num_words=5).instruction() == "Answer with at least 5 words."
    letter = c(K.LETTER_FREQUENCY, letter="Q", relation="at least", frequency=1)
    assert letter.args["letter"] == "q"
    assert letter.instruction() == 'In your response, the letter "q" should appear at least once.'
    assert c(K.PARAGRAPH_COUNT, num_paragraphs=2).args["separator"] == "***"  # the default is filled in
    assert c(K.POSTSCRIPT).to_json() == {"kind": "postscript", "args": {"marker": "P.S."}}
    with pytest.raises(ValueError, match="has only 'kind' and 'args'"):
        Constraint.from_json({"kind": "title", "arg": {}})
    with pytest.raises(ValueError, match="'args' must be an object"):
        Constraint.from_json({"kind": "title", "args": [1]})
    with pytest.raises(ValueError, match="at least one constraint"):
        score("hi", [])
