"""Incremental rendering vs the template's full render, tool-call parsers, canonical message hashing."""

from __future__ import annotations

import pytest

from harnessrl.gateway.messages import (
    MessageHasher,
    Msg,
    RequestError,
    from_anthropic,
    from_openai,
)
from harnessrl.gateway.render import ChatRenderer
from harnessrl.gateway.toolcalls import ToolCall, get_parser

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def test_deltas_concatenate_to_the_full_render(tokenizer):
    r = ChatRenderer(tokenizer)
    msgs = [
        Msg("system", "You fix bugs."),
        Msg("user", "Fix having/had in utils.py"),
        Msg("assistant", "Looking.", (ToolCall("bash", {"command": "cat utils.py"}),)),
        Msg("tool", "def f():\n    return 'having'"),
        Msg("user", "continue"),
    ]
    head = r.full_prompt(msgs[:2], TOOLS, add_generation_prompt=False)
    incremental = head + [t for m in msgs[2:] for t in r.message_delta(m, TOOLS)] + r.generation_prompt_ids
    assert incremental == r.full_prompt(msgs, TOOLS)
    assert r.decode(r.generation_prompt_ids) == "<|im_start|>assistant\n"
    assert r.decode(r.end_of_turn_ids) == "<|im_end|>\n"
    assert "<tools>" in r.decode(head) and '"name": "bash"' in r.decode(head)


def test_close_assistant_masks_only_unsampled_boundary(tokenizer):
    r = ChatRenderer(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert r.close_assistant([42, im_end]) == r.end_of_turn_ids[1:]  # newline only: <|im_end|> was sampled
    assert r.close_assistant([42, 43]) == r.end_of_turn_ids  # cut by length: the whole end of turn is context
    assert r.stop_token_ids == [im_end]


@pytest.mark.parametrize(
    "fmt,text",
    [
        ("hermes", 'ok <tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}</tool_call>'),
        (
            "qwen",
            'ok\n<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls -la\\"}"}\n</tool_call>',
        ),
        (
            "qwen3_coder",
            "ok\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call>",
        ),
    ],
)
def test_tool_call_parsers_round_trip(fmt, text):
    p = get_parser(fmt)
    content, calls = p.parse(text)
    assert content == "ok"
    assert calls == [ToolCall("bash", {"command": "ls -la"})]
    assert p.parse(p.render(calls))[1] == calls


def test_malformed_tool_call_stays_visible_in_content():
    content, calls = get_parser("hermes").parse("<tool_call>{not json}</tool_call>")
    assert calls == [] and "{not json}" in content
    with pytest.raises(ValueError, match="unknown tool-call format"):
        get_parser("nope")


def test_canonical_hash_ignores_call_ids_and_formatting():
    a = from_openai(
        [
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command":"ls","x":1}'},
                    }
                ],
            }
        ]
    )
    b = from_openai(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "other",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"x": 1, "command": "ls"}'},
                    }
                ],
            }
        ]
    )
    h = MessageHasher()
    assert h.chain(b"s", a) == h.chain(b"s", b)
    c = from_openai(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "x",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "ls -l"}'},
                    }
                ],
            }
        ]
    )
    assert h.chain(b"s", a)[-1] != h.chain(b"s", c)[-1]


def test_anthropic_blocks_convert_to_internal_messages():
    msgs = from_anthropic(
        "sys",
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "run"},
                    {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"},
                    {"type": "text", "text": "go on"},
                ],
            },
        ],
    )
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "user"]
    assert msgs[2].tool_calls == (ToolCall("bash", {"command": "ls"}),)


def test_bad_messages_name_the_field():
    with pytest.raises(RequestError, match=r"messages\[1\].role"):
        from_openai([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])
    with pytest.raises(RequestError, match=r"messages\[0\].tool_calls\[0\]: arguments are not valid JSON"):
        from_openai([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}])


def test_light_tokenizer_matches_transformers(tokenizer):
    from harnessrl.light_tokenizer import load_gateway_tokenizer

    light = load_gateway_tokenizer()
    convs = [
        [Msg("user", "hi")],
        [
            Msg("system", "S"),
            Msg("user", "Fix the bug in `utils.py` — ünïcode, tabs\tand\nnewlines"),
            Msg("assistant", "ok", (ToolCall("bash", {"command": "grep -rn having ."}),)),
            Msg("tool", "x.py:1: having"),
        ],
    ]
    for msgs in convs:
        for tools in ([], TOOLS):
            a = ChatRenderer(tokenizer).full_prompt(msgs, tools)
            b = ChatRenderer(light).full_prompt(msgs, tools)
            assert a == b
    text = "def having():\n    return 'héllo' <|im_end|>"
    assert light.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert light.decode(light.encode(text)) == text
    assert light.eos_token_id == tokenizer.eos_token_id
    assert light.unk_token_id == tokenizer.unk_token_id
    chat = [{"role": "user", "content": "Name a fruit."}]
    ids = light.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    assert ids == tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_segment_memo_tokenizes_exactly_like_the_tokenizer(tokenizer):
    """The per-piece memo (pieces between special tokens) gives the tokenizer's own ids, on first and on
    repeated (memoized) encodes, for texts full of special tokens, near-misses, whitespace and non-ASCII."""
    import random

    from harnessrl.light_tokenizer import load_gateway_tokenizer

    rng = random.Random(7)
    alphabet = list("ab def\n\t  XYZé漢😀{}\"'.,:-_ 09") + [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_",
        "|>",
        "having",
        " h",
        "<file_sep>",
    ]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(400)]
    for tok in (tokenizer, load_gateway_tokenizer()):
        r = ChatRenderer(tok)
        assert r.segments.enabled
        for _ in range(2):
            for t in texts:
                assert r._encode(t) == list(tok.encode(t, add_special_tokens=False)), t


def test_segment_memo_is_off_when_a_special_token_strips_whitespace():
    from tokenizers import AddedToken

    from harnessrl.light_tokenizer import load_gateway_tokenizer

    tok = load_gateway_tokenizer()
    tok.backend_tokenizer.add_special_tokens([AddedToken("<strip>", rstrip=True)])
    r = ChatRenderer(tok)
    assert not r.segments.enabled
    assert r._encode("a <strip>  b") == tok.encode("a <strip>  b")
