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
            else:
                raise RequestError(f"{where}.content[{j}]: only text parts are supported, got {part!r:.80}")
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
    """Anthropic Messages -> internal: tool_use blocks become tool calls, tool_result blocks tool messages."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list")
    out: list[Msg] = []
    if system:
        out.append(Msg("system", _text(system, "system")))
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise RequestError(f"{where}: expected an object with role 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append(Msg(m["role"], content))
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content: expected a string or a list of blocks")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use" and m["role"] == "assistant":
                inp = block.get("input") or {}
                if not isinstance(inp, dict):
                    raise RequestError(f"{where}.content[{j}].input: expected an object")
                calls.append(ToolCall(str(block.get("name")), inp))
            elif kind == "tool_result" and m["role"] == "user":
                if texts:
                    out.append(Msg("user", "".join(texts)))
                    texts = []
                out.append(Msg("tool", _text(block.get("content"), f"{where}.content[{j}]")))
            elif kind == "thinking":
                continue  # not rendered by ChatML templates
            else:
                raise RequestError(
                    f"{where}.content[{j}]: unsupported block type {kind!r} for role {m['role']}"
                )
        if texts or calls or m["role"] == "assistant":
            out.append(Msg(m["role"], "".join(texts), tuple(calls)))
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
