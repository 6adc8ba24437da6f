"""Chat messages in the gateway's internal form, their canonical hashes, and OpenAI/Anthropic conversion.

Internal message: `Msg(role, content, tool_calls, name)`; `content` is plain text, tool calls carry parsed
arguments. Canonicalization drops what harnesses change freely between calls (call ids, `None` vs `""`
content, argument JSON formatting, extra SDK fields), so a message echoed back hashes the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .toolcalls import ToolCall


class RequestError(ValueError):
    """A malformed harness request: answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class Msg:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    name: str | None = None  # tool name on tool-result messages (informational, not hashed)

    def canonical_key(self) -> tuple:
        calls = tuple(
            (c.name, json.dumps(c.arguments, sort_keys=True, ensure_ascii=False)) for c in self.tool_calls
        )
        return (self.role, self.content, calls)

    @cached_property
    def digest(self) -> bytes:
        return _digest(json.dumps(self.canonical_key(), ensure_ascii=False).encode())


ROLES = ("system", "user", "assistant", "tool")


# Parts a text-only policy cannot see: replaced by a placeholder that says what was there (never a 400: a CLI
# agent reading a PNG must go on).
MEDIA_PARTS = ("image", "image_url", "input_image", "document", "input_file")


def media_placeholder(part: dict) -> str:
    kind = part.get("type")
    source = part.get("source")
    media = source.get("media_type") if isinstance(source, dict) else None
    return f"[{kind}{f' ({media})' if isinstance(media, str) else ''} omitted: this model reads text only]"


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") in MEDIA_PARTS:
                parts.append(media_placeholder(part))
            else:
                raise RequestError(
                    f"{where}.content[{j}]: only text and media parts are supported, got {part!r:.80}"
                )
        return "".join(parts)
    raise RequestError(
        f"{where}.content: expected a string or a list of text parts, got {type(content).__name__}"
    )


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if raw in (None, ""):
        return {}
    if isinstance(raw, str):
        try:
            val = json.loads(raw)
        except json.JSONDecodeError as e:
            raise RequestError(f"{where}: arguments are not valid JSON ({e.msg})") from None
        if isinstance(val, dict):
            return val
    raise RequestError(f"{where}: arguments must be a JSON object")


class PlainMessageCache:
    """Per-session memo of `{"role", "content": str}` messages -> the same `Msg` object (and so its cached
    digest): a history the session has seen costs one dict lookup per message on the next call."""

    def __init__(self, max_entries: int = 65536) -> None:
        self._d: dict[tuple[str, str], Msg] = {}
        self._max = max_entries

    def get(self, m: dict) -> Msg | None:
        if len(m) != 2:
            return None
        role, content = m.get("role"), m.get("content")
        if type(content) is not str or role not in ("system", "user", "assistant", "tool"):
            return None
        key = (role, content)
        msg = self._d.get(key)
        if msg is None:
            if len(self._d) >= self._max:
                self._d.clear()
            msg = self._d[key] = Msg(role, content)
        return msg


def from_openai(messages: Any, cache: PlainMessageCache | None = None) -> list[Msg]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list")
    out: list[Msg] = []
    for i, m in enumerate(messages):
        if cache is not None and type(m) is dict:
            hit = cache.get(m)
            if hit is not None:
                out.append(hit)
                continue
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where}: expected an object")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise RequestError(f"{where}.role: expected one of {ROLES}, got {role!r}")
        calls: list[ToolCall] = []
        raw_calls = m.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise RequestError(f"{where}.tool_calls: expected a list, got {type(raw_calls).__name__}")
        for j, tc in enumerate(raw_calls):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(f"{where}.tool_calls[{j}]: expected {{function: {{name, arguments}}}}")
            calls.append(ToolCall(fn["name"], _arguments(fn.get("arguments"), f"{where}.tool_calls[{j}]")))
        out.append(Msg(role, _text(m.get("content"), where), tuple(calls), m.get("name")))
    return out


def from_anthropic(system: Any, messages: Any) -> list[Msg]:
    """Anthropic Messages -> internal: tool_use blocks become tool calls, tool_result blocks tool messages.

    - `role: "system"` inside `messages` (Claude Code puts its agent list there) is a system message where it
      stands; the renderer shows it as the chat template allows (`ChatRenderer.mid_system_role`).
    - Tool results are matched to their calls by `tool_use_id`: a user turn's results are put in the order of
      the calls of the assistant turn before it (parallel calls answered in another order would otherwise be
      rendered against the wrong call), and carry the tool's name.
    - Images and documents (also inside a tool result) become a text placeholder; thinking blocks are dropped
      (a ChatML template does not render them).
    """
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list")
    out: list[Msg] = []
    if system:
        out.append(Msg("system", _text(system, "system")))
    call_order: dict[str, tuple[int, str]] = {}  # tool_use id of the last assistant turn -> (index, name)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            raise RequestError(f"{where}: expected an object with role 'user', 'assistant' or 'system'")
        content = m.get("content")
        if role == "system":
            out.append(Msg("system", _text(content, where)))
            continue
        if isinstance(content, str):
            out.append(Msg(role, content))
            if role == "assistant":
                call_order = {}
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content: expected a string or a list of blocks")
        if role == "assistant":
            out.append(_anthropic_assistant(content, where, call_order))
        else:
            out.extend(_anthropic_user(content, where, call_order))
    return out


def _anthropic_assistant(content: list, where: str, call_order: dict[str, tuple[int, str]]) -> Msg:
    texts: list[str] = []
    calls: list[ToolCall] = []
    call_order.clear()
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            inp = block.get("input") or {}
            if not isinstance(inp, dict):
                raise RequestError(f"{where}.content[{j}].input: expected an object")
            name = str(block.get("name"))
            if isinstance(block.get("id"), str):
                call_order[block["id"]] = (len(calls), name)
            calls.append(ToolCall(name, inp))
        elif kind in ("thinking", "redacted_thinking"):
            continue  # not rendered by ChatML templates
        else:
            raise RequestError(f"{where}.content[{j}]: unsupported block type {kind!r} for role assistant")
    return Msg("assistant", "".join(texts), tuple(calls))


def _anthropic_user(content: list, where: str, call_order: dict[str, tuple[int, str]]) -> list[Msg]:
    items: list[str | Msg] = []
    results: list[tuple[int, int, Msg]] = []  # (index of its call, position among the results, message)
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            items.append(str(block.get("text", "")))
        elif kind in MEDIA_PARTS:
            items.append(media_placeholder(block))
        elif kind == "tool_result":
            index, name = call_order.get(str(block.get("tool_use_id")), (len(call_order), None))
            msg = Msg("tool", _text(block.get("content"), f"{where}.content[{j}]"), (), name)
            results.append((index, len(results), msg))
            items.append(msg)
        else:
            raise RequestError(f"{where}.content[{j}]: unsupported block type {kind!r} for role user")
    if len(results) > 1:  # the results keep their places among the texts, in the order of their calls
        ordered = iter(msg for _, _, msg in sorted(results, key=lambda r: r[:2]))
        items = [next(ordered) if isinstance(item, Msg) else item for item in items]
    out: list[Msg] = []
    texts: list[str] = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
            continue
        if texts:
            out.append(Msg("user", "".join(texts)))
            texts = []
        out.append(item)
    if texts:
        out.append(Msg("user", "".join(texts)))
    return out


def anthropic_tools_to_openai(tools: Any) -> list[dict]:
    if not tools:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools: expected a list")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise RequestError(f"tools[{i}]: expected an object with a name")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
        )
    return out


def validate_openai_tools(tools: Any) -> list[dict]:
    if not tools:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools: expected a list")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance((t.get("function") or {}).get("name"), str):
            raise RequestError(f"tools[{i}]: expected {{type: 'function', function: {{name, parameters}}}}")
    return tools


def argument_defaults(tools: list[dict]) -> dict[str, dict[str, Any]]:
    """tool name -> {argument: the default its JSON schema declares} (top-level properties only)."""
    out: dict[str, dict[str, Any]] = {}
    for t in tools:
        fn = t.get("function", t) if isinstance(t, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        props = params.get("properties") if isinstance(params, dict) else None
        if not isinstance(props, dict) or not isinstance(fn, dict):
            continue
        found = {k: v["default"] for k, v in props.items() if isinstance(v, dict) and "default" in v}
        if found:
            out[str(fn.get("name"))] = found
    return out


def without_defaults(call: ToolCall, defaults: dict[str, dict[str, Any]]) -> ToolCall:
    """The same action without the arguments that only restate their schema default: a harness that echoes a
    call back with its defaults filled in (Claude Code adds `"replace_all": false` to every Edit) sent the call
    the model sampled, and must extend its chain instead of rolling the sampled tokens back."""
    known = defaults.get(call.name)
    if not known:
        return call
    args = {
        k: v
        for k, v in call.arguments.items()
        if not (k in known and type(v) is type(known[k]) and v == known[k])
    }
    return call if len(args) == len(call.arguments) else ToolCall(call.name, args)


def same_actions(msgs: list[Msg], defaults: dict[str, dict[str, Any]]) -> list[Msg]:
    """`msgs` with every tool call judged on its action (`without_defaults`), not on the arguments' bytes."""
    if not defaults:
        return msgs
    out = []
    for m in msgs:
        if m.tool_calls:
            calls = tuple(without_defaults(c, defaults) for c in m.tool_calls)
            if calls != m.tool_calls:
                m = Msg(m.role, m.content, calls, m.name)
        out.append(m)
    return out


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class MessageHasher:
    """Chained message hashes: h_0 = H(tools), h_i = H(h_{i-1} || H(canonical(m_i))).

    A message's own digest is cached on the `Msg`, and sessions reuse `Msg` objects for messages they have
    seen. The chains of the last few requests are remembered: when a request starts with one of them (the
    same `Msg` objects — one pointer comparison per message, in C), only the new messages are hashed.
    """

    def __init__(self, remember: int = 8) -> None:
        self._recent: list[tuple[bytes, list[Msg], list[bytes]]] = []
        self._remember = remember

    @staticmethod
    def seed(tools: list[dict]) -> bytes:
        return _digest(b"tools:" + json.dumps(tools, sort_keys=True, ensure_ascii=False).encode())

    def chain(self, seed: bytes, msgs: list[Msg]) -> list[bytes]:
        """Returns [h_0, h_1, ..., h_n]."""
        out: list[bytes] = [seed]
        start = 0
        for i, (s0, prev, cums) in enumerate(self._recent):
            if s0 == seed and start < len(prev) <= len(msgs) and msgs[: len(prev)] == prev:
                out, start = cums[:], len(prev)
                del self._recent[i]
                break
        h = out[-1]
        for m in msgs[start:]:
            h = _digest(h + m.digest)
            out.append(h)
        self._recent.insert(0, (seed, list(msgs), out))
        del self._recent[self._remember :]
        return out

    @staticmethod
    def extend(prev: bytes, msg: Msg) -> bytes:
        return _digest(prev + msg.digest)


# -- OpenAI Responses API -------------------------------------------------------------------------------------
# Input items a text policy has nothing to render for: reasoning (its encrypted content is the provider's), the
# provider's hosted tools' calls (web search, image generation, ...), and provider-side compaction.
RESPONSES_SKIPPED_ITEMS = (
    "reasoning",
    "web_search_call",
    "file_search_call",
    "image_generation_call",
    "code_interpreter_call",
    "computer_call",
    "computer_call_output",
    "mcp_list_tools",
    "compaction",
    "compaction_summary",
    "item_reference",
    "additional_tools",  # tools declared inside `input` (Codex's code mode): read by responses_request_tools
)
# Tools the provider runs itself: the policy cannot, so they are not offered to it.
RESPONSES_HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "local_shell",
    "mcp",
)
CUSTOM_INPUT = "input"  # a custom (freeform) tool's one string argument, as the policy sees it


def _responses_output(raw: Any, where: str) -> str:
    """A tool result's `output`: a string, a list of content parts, or Codex's `{content, success}` object."""
    if isinstance(raw, dict) and "content" in raw:
        raw = raw.get("content")
    return _text(raw, where)


def from_responses(instructions: Any, items: Any) -> list[Msg]:
    """OpenAI Responses `instructions` + `input` -> internal messages.

    - `instructions` is the first system message; `developer` and `system` messages are system messages where
      they stand (Codex sends its instructions as developer messages inside `input`);
    - an assistant `message` and the `function_call` / `custom_tool_call` items after it (until the next item of
      another kind; reasoning between them is skipped) are one assistant turn, as the policy sampled them;
    - `function_call_output` / `custom_tool_call_output` items become tool messages, matched to their calls by
      `call_id`: a run of results is put in the order of the calls of the turn before it, each with its
      tool's name;
    - images and files become a text placeholder; reasoning and hosted-tool items are dropped.
    """
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if not isinstance(items, list):
        raise RequestError("input: expected a string or a list of items")
    out: list[Msg] = []
    if instructions:
        out.append(Msg("system", _text(instructions, "instructions")))
    turn: tuple[list[str], list[ToolCall]] | None = None  # the assistant turn being read
    call_order: dict[str, tuple[int, str]] = {}  # call_id of the last assistant turn -> (index, name)
    results: list[tuple[int, int, Msg]] = []  # the run of tool results being read

    def close_turn() -> None:
        nonlocal turn
        if turn is not None:
            out.append(Msg("assistant", "".join(turn[0]), tuple(turn[1])))
            turn = None

    def close_results() -> None:
        out.extend(msg for _, _, msg in sorted(results, key=lambda r: r[:2]))
        results.clear()

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where}: expected an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind in RESPONSES_SKIPPED_ITEMS:
            continue
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                close_results()
                close_turn()
                turn = ([_text(item.get("content"), where)], [])
                call_order = {}
                continue
            if role not in ("user", "system", "developer"):
                raise RequestError(
                    f"{where}.role: expected user, assistant, system or developer, got {role!r}"
                )
            close_results()
            close_turn()
            out.append(Msg("user" if role == "user" else "system", _text(item.get("content"), where)))
        elif kind in ("function_call", "custom_tool_call"):
            close_results()
            if turn is None:
                turn = ([], [])
                call_order = {}
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise RequestError(f"{where}.name: expected the tool's name")
            if kind == "function_call":
                arguments = _arguments(item.get("arguments"), where)
            else:
                raw = item.get("input")
                if not isinstance(raw, str):
                    raise RequestError(f"{where}.input: expected a string")
                arguments = {CUSTOM_INPUT: raw}
            if isinstance(item.get("call_id"), str):
                call_order[item["call_id"]] = (len(turn[1]), name)
            turn[1].append(ToolCall(name, arguments))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            close_turn()
            index, name = call_order.get(str(item.get("call_id")), (len(call_order), None))
            msg = Msg("tool", _responses_output(item.get("output"), f"{where}.output"), (), name)
            results.append((index, len(results), msg))
        else:
            raise RequestError(f"{where}.type: unsupported input item type {kind!r}")
    close_results()
    close_turn()
    if not out:
        raise RequestError("input: expected at least one message")
    return out


def responses_request_tools(tools: Any, items: Any) -> list[Any]:
    """A Responses request's tools: its `tools`, then those of `additional_tools` input items (Codex declares its
    code-mode tools there, with `tools` empty)."""
    out = list(tools) if isinstance(tools, list) else ([] if not tools else [tools])
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("type") == "additional_tools":
            extra = item.get("tools")
            if not isinstance(extra, list):
                raise RequestError("input[].tools of an additional_tools item: expected a list")
            out.extend(extra)
    return out


def responses_tools_to_openai(tools: Any) -> tuple[list[dict], dict[str, str]]:
    """Responses tools -> (chat-completions tools the renderer shows the policy, tool name -> its item kind).

    `function` tools as they are; `custom` (freeform) tools as a function with one string argument `input`;
    a `namespace`'s tools flattened; tools the provider hosts (web search, ...) are not offered: the policy
    cannot run them. The kinds say which output item a call becomes (`function_call` / `custom_tool_call`)."""
    if not tools:
        return [], {}
    if not isinstance(tools, list):
        raise RequestError("tools: expected a list")
    out: list[dict] = []
    kinds: dict[str, str] = {}

    def add(t: Any, where: str) -> None:
        if not isinstance(t, dict):
            raise RequestError(f"{where}: expected an object")
        kind = t.get("type")
        if kind in RESPONSES_HOSTED_TOOLS:
            return
        if kind == "namespace":
            inner = t.get("tools")
            if not isinstance(inner, list):
                raise RequestError(f"{where}.tools: expected a list")
            for j, sub in enumerate(inner):
                add(sub, f"{where}.tools[{j}]")
            return
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"{where}: expected a tool with a name")
        if kind == "function":
            params = t.get("parameters") or {"type": "object", "properties": {}}
            kinds[name] = "function_call"
        elif kind == "custom":
            params = {
                "type": "object",
                "properties": {CUSTOM_INPUT: {"type": "string", "description": "the tool's raw input"}},
                "required": [CUSTOM_INPUT],
            }
            kinds[name] = "custom_tool_call"
        else:
            raise RequestError(f"{where}.type: unsupported tool type {kind!r}")
        out.append(
            {
                "type": "function",
                "function": {"name": name, "description": t.get("description") or "", "parameters": params},
            }
        )

    for i, t in enumerate(tools):
        add(t, f"tools[{i}]")
    return out, kinds
