"""The tool-call parser comes from the model (its chat template) or the generate config, and reaches the gateway."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from harnessrl.gateway.toolcalls import ToolParser, detect_tool_parser
from harnessrl.io import read_jsonl
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource, resolve_tool_parser
from harnessrl.rollout.specs import parse_specs
from tests.support.fixtures import requires_bwrap

QWEN3_CODER_TEMPLATE = (
    "{%- for tool_call in message.tool_calls %}<tool_call>\n<function={{ tool_call.name }}>\n"
    "{%- for k, v in tool_call.arguments.items() %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{%- endfor %}"
    "</function>\n</tool_call>{%- endfor %}"
)
HERMES_TEMPLATE = '{%- for tool_call in message.tool_calls %}<tool_call>\n{"name": "{{ tool_call.name }}"}'


def test_parser_is_read_off_the_chat_template(tokenizer):
    assert detect_tool_parser(tokenizer) is None  # SmolLM2's template shows no tool calls: hermes
    assert resolve_tool_parser(None, tokenizer, Path("tiny")) is ToolParser.HERMES
    assert resolve_tool_parser(ToolParser.QWEN, tokenizer, Path("tiny")) is ToolParser.QWEN
    for template, expected in (
        (QWEN3_CODER_TEMPLATE, ToolParser.QWEN3_CODER),
        (HERMES_TEMPLATE, ToolParser.HERMES),
    ):
        tok = copy.copy(tokenizer)
        tok.chat_template = template
        assert detect_tool_parser(tok) is expected
    assert ModelSource(tool_parser="qwen3_coder").tool_parser is ToolParser.QWEN3_CODER  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_parser must be one of hermes, qwen, qwen3_coder"):
        ModelSource(tool_parser="llama3_json")  # type: ignore[arg-type]


@requires_bwrap
@pytest.mark.parametrize("parser, parsed", [(ToolParser.QWEN3_CODER, True), (None, False)])
def test_generate_passes_the_parser_to_the_gateway(synth_taskset, fast_engine, tmp_path, parser, parsed):
    """The engine writes Qwen3-Coder XML: only the qwen3_coder parser turns it into tool calls (the tiny model's
    template shows no format, so the default, None, parses hermes)."""
    engine = fast_engine(
        [
            {
                "text": "<tool_call>\n<function=bash>\n<parameter=command>\necho from-the-sandbox\n"
                "</parameter>\n</function>\n</tool_call>"
            },
            {"text": "<tool_call>\n<function=submit>\n</function>\n</tool_call>"},
        ]
    )
    out = tmp_path / "gen"
    run_generate(
        synth_taskset,
        out,
        parse_specs({"limits": {"turns": 2}}),
        ModelSource(engine_url=engine.base_url, tool_parser=parser),
        GenerateConfig(group_size=1, max_tasks=1),
    )
    (row,) = read_jsonl(out / "rollouts.jsonl")
    transcript = (out / "transcripts" / f"{row['rollout_id']}.json").read_text()
    if parsed:
        assert row["tool_calls"] == 2 and row["finish_reason"] == "submitted", row
        assert "from-the-sandbox" in transcript
    else:
        assert row["tool_calls"] == 0 and row["finish_reason"] != "submitted", row
