"""Tool-call parsers: sampled assistant text -> (content, tool calls), one parser per model family.

Registry names: `hermes` (SmolLM2 / Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name":..,"arguments":..}</tool_call>`,
with or without the newlines Qwen puts inside the tags) and `qwen3_coder`
(`<tool_call><function=name><parameter=x>value</parameter></function></tool_call>`).
Each parser also renders a tool call back to text, so an assistant message replayed by the harness renders
the way the model writes it. `detect_tool_parser(tokenizer)` reads the format off the model's chat template.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ToolCall]]: ...

    def render(self, calls: list[ToolCall]) -> str: ...


_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class HermesParser:
    """JSON inside `<tool_call>` tags. A block that is not valid JSON stays in the content (the harness sees
    what the model wrote instead of a silently dropped call)."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for m in _HERMES_BLOCK.finditer(text):
            try:
                obj = json.loads(m.group(1))
                name = obj["name"]
                args = obj.get("arguments", obj.get("parameters", {}))
                if isinstance(args, str):
                    args = json.loads(args)
                if not isinstance(name, str) or not isinstance(args, dict):
                    raise TypeError
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                continue
            kept.append(text[pos : m.start()])
            pos = m.end()
            calls.append(ToolCall(name, args))
        kept.append(text[pos:])
        return "".join(kept).strip() if calls else text, calls

    def render(self, calls: list[ToolCall]) -> str:
        return "\n".join(
            "<tool_call>\n"
            + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n</tool_call>"
            for c in calls
        )


_CODER_FUNC = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_CODER_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_CODER_BLOCK = re.compile(
    r"(?:<tool_call>\s*)?<function=[^>\s]+>.*?</function>(?:\s*</tool_call>)?", re.DOTALL
)


class Qwen3CoderParser:
    """Qwen3-Coder XML: parameter values are JSON when they parse as JSON, else raw strings."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        for block in _CODER_BLOCK.finditer(text):
            func = _CODER_FUNC.search(block.group(0))
            if func is None:
                continue
            args: dict[str, Any] = {}
            for p in _CODER_PARAM.finditer(func.group(2)):
                raw = p.group(2)
                try:
                    args[p.group(1)] = json.loads(raw)
                except json.JSONDecodeError:
                    args[p.group(1)] = raw
            calls.append(ToolCall(func.group(1), args))
        if not calls:
            return text, []
        return _CODER_BLOCK.sub("", text).strip(), calls

    def render(self, calls: list[ToolCall]) -> str:
        out = []
        for c in calls:
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
                for k, v in c.arguments.items()
            )
            out.append(f"<tool_call>\n<function={c.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(out)


class ToolParser(StrEnum):
    """The tool-call formats the gateway parses (CLI `--tool-parser`, generate's `tool_parser`)."""

    HERMES = "hermes"
    QWEN = "qwen"  # Qwen2.5 / Qwen3: hermes JSON
    QWEN3_CODER = "qwen3_coder"


PARSERS: dict[str, type] = {
    ToolParser.HERMES: HermesParser,
    ToolParser.QWEN: HermesParser,
    ToolParser.QWEN3_CODER: Qwen3CoderParser,
}


def detect_tool_parser(tokenizer: object) -> ToolParser | None:
    """The format the model's chat template renders tool calls in; None when the template shows none."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str):  # several named templates: look at all of them
        template = "\n".join(map(str, template.values())) if isinstance(template, dict) else str(template)
    if "<function=" in template and "<parameter=" in template:
        return ToolParser.QWEN3_CODER
    if "<tool_call>" in template:
        return ToolParser.HERMES
    return None


def get_parser(name: str) -> ToolCallParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; choose one of {sorted(PARSERS)}") from None
