"""Token-level chat rendering: full renders (new chains, drift checks) and incremental renders of only the new
messages, computed as a token-level suffix diff against a small synthetic prefix (cost independent of history).

Templates without tool support (SmolLM2's ChatML) get tools Hermes-style: a tool list in the system prompt,
tool calls as `<tool_call>` text, tool results as `tool` messages wrapped in `<tool_response>`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .messages import Msg
from .toolcalls import ToolCall, get_parser

_SYNTH = [
    {"role": "system", "content": "synthetic system"},
    {"role": "user", "content": "synthetic user"},
    {"role": "assistant", "content": "synthetic assistant"},
]

TOOLS_PREAMBLE = (
    "# Tools\n\nYou can call functions to do the task. The available functions, one JSON schema per line:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "To call a function, write a JSON object with its name and arguments between tags:\n"
    '<tool_call>\n{{"name": "<function-name>", "arguments": {{<arguments>}}}}\n</tool_call>'
)


class DiffError(RuntimeError):
    """The template's rendering of a prefix is not a token prefix of its rendering with more messages."""


class SegmentEncoder:
    """Exact tokenization with a memo per piece of text between special tokens.

    Hugging Face tokenizers cut the text at added tokens before normalizing and pre-tokenizing, and encode
    each piece on its own; so when no added token strips whitespace around it (`lstrip`/`rstrip`/`single_word`
    all off, and matched on the raw text), encode(text) is the concatenation of the pieces' encodings and the special tokens' ids. Chat
    renders repeat most of their pieces (the synthetic prefix of every message delta; a rollout's system prompt
    and tool list in every new chain of every session), so each distinct piece is tokenized once. Tokenizers
    where the cut does not hold, or that fail the self-check, are used whole (`enabled` False)."""

    def __init__(self, tokenizer: Any, max_chars: int = 32 << 20, max_piece_chars: int = 1 << 16) -> None:
        self.tokenizer = tokenizer
        self._memo: dict[str, tuple[int, ...]] = {}
        self._chars = 0
        self._max_chars, self._max_piece = max_chars, max_piece_chars
        self._split: re.Pattern | None = None
        added = getattr(tokenizer, "added_tokens_decoder", None)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if isinstance(added, dict) and added and backend is not None:
            toks = list(added.values())
            normalizer = getattr(backend, "normalizer", None)
            if all(
                not (t.lstrip or t.rstrip or t.single_word)
                and isinstance(t.content, str)
                and t.content
                and not (t.normalized and normalizer is not None)
                for t in toks
            ):
                # longest first: the tokenizer matches added tokens leftmost-longest
                alts = sorted({t.content for t in toks}, key=len, reverse=True)
                self._split = re.compile("(" + "|".join(map(re.escape, alts)) + ")")
                self._specials = {t.content: (self._whole(t.content)) for t in toks}
                if any(len(v) != 1 for v in self._specials.values()):
                    self._split = None

    @property
    def enabled(self) -> bool:
        return self._split is not None

    def _whole(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def disable(self) -> None:
        self._split = None
        self._memo.clear()

    def check(self, texts: list[str]) -> None:
        """Turns the memo off unless it reproduces the tokenizer's own ids on these texts."""
        if self._split is not None and any(self.encode(t) != self._whole(t) for t in texts):
            self.disable()

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return self._whole(text)
        out: list[int] = []
        for piece in self._split.split(text):
            if not piece:
                continue
            ids = self._specials.get(piece) or self._memo.get(piece)
            if ids is None:
                ids = tuple(self._whole(piece))
                if len(piece) <= self._max_piece:
                    if self._chars + len(piece) > self._max_chars:
                        self._memo.clear()
                        self._chars = 0
                    self._memo[piece] = ids
                    self._chars += len(piece)
            out.extend(ids)
        return out


class ChatRenderer:
    def __init__(self, tokenizer: Any, tool_format: str = "hermes", segment_memo: bool = True) -> None:
        self.tokenizer = tokenizer
        self.parser = get_parser(tool_format)
        self.segments = SegmentEncoder(tokenizer)
        if not segment_memo:  # plain tokenization of every render (benchmark baselines)
            self.segments.disable()
        probe = [
            {"role": "system", "content": "probe  system\n\n"},
            {"role": "user", "content": " héllo\t x"},
            {"role": "assistant", "content": "\n<tool_call>\n{}\n</tool_call> "},
        ]
        self.segments.check(
            [
                self._render_text(_SYNTH, False),
                self._render_text(probe, True),
                "a<|im_end|>b " + "".join(self.segments._specials) if self.segments.enabled else "",
            ]
        )
        template = getattr(tokenizer, "chat_template", None) or ""
        self.native_tools = "tools" in template
        self.mid_system_role = self._mid_system_role()
        synth_ids = self._encode(self._render_text(_SYNTH, add_generation_prompt=False))
        self._synth_ids = synth_ids
        self.generation_prompt_ids = self._suffix(
            synth_ids, self._encode(self._render_text(_SYNTH, True)), "generation prompt"
        )
        self.end_of_turn_ids = self._assistant_close()
        # Sampling stops at the first token the template puts after an assistant message's content.
        self.stop_token_ids = sorted({self.end_of_turn_ids[0]} | ({tokenizer.eos_token_id} - {None}))

    # -- primitives -----------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return self.segments.encode(text)

    def _render_text(
        self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None
    ) -> str:
        kwargs: dict[str, Any] = {}
        if tools and self.native_tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def _mid_system_role(self) -> str:
        """How a system message after the first turn is rendered: as `system` where the template renders it
        there (ChatML does), else as `user` (templates that allow a system message only first raise or drop
        it). Claude Code sends such messages."""
        probe = "harnessrl mid-conversation system probe"
        try:
            text = self._render_text([*_SYNTH, {"role": "system", "content": probe}], False)
        except Exception:  # jinja2's raise_exception, or a template that indexes what it expects
            return "user"
        return "system" if probe in text else "user"

    @staticmethod
    def _suffix(prefix: list[int], full: list[int], what: str) -> list[int]:
        if full[: len(prefix)] != prefix:
            raise DiffError(f"suffix diff failed for {what}: the template does not render it append-only")
        return full[len(prefix) :]

    def _assistant_close(self) -> list[int]:
        head = self._encode(self._render_text(_SYNTH[:2], True))
        full = self._encode(self._render_text(_SYNTH, False))
        rest = self._suffix(head, full, "assistant turn")
        content = self._encode(_SYNTH[2]["content"])
        if rest[: len(content)] != content or len(rest) == len(content):
            raise DiffError("cannot locate the end-of-turn tokens of an assistant message in this template")
        return rest[len(content) :]

    # -- message conversion -----------------------------------------------------------------------------
    def template_message(self, msg: Msg, tools: list[dict] | None = None, first: bool = False) -> dict:
        if msg.role == "system" and not first and self.mid_system_role != "system":
            msg = Msg(self.mid_system_role, msg.content)
        if self.native_tools:
            d: dict[str, Any] = {"role": msg.role, "content": msg.content}
            if msg.tool_calls:
                d["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in msg.tool_calls
                ]
            return d
        if msg.role == "assistant":
            text = msg.content
            if msg.tool_calls:
                text = (text + "\n" if text else "") + self.parser.render(list(msg.tool_calls))
            return {"role": "assistant", "content": text}
        if msg.role == "tool":
            return {"role": "tool", "content": f"<tool_response>\n{msg.content}\n</tool_response>"}
        if msg.role == "system" and first and tools:
            return {
                "role": "system",
                "content": (msg.content + "\n\n" if msg.content else "") + self.tools_block(tools),
            }
        return {"role": msg.role, "content": msg.content}

    def tools_block(self, tools: list[dict]) -> str:
        lines = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        return TOOLS_PREAMBLE.format(tools=lines)

    def template_messages(self, msgs: list[Msg], tools: list[dict] | None) -> list[dict]:
        out = [self.template_message(m, tools, first=(i == 0)) for i, m in enumerate(msgs)]
        if tools and not self.native_tools and (not msgs or msgs[0].role != "system"):
            out.insert(0, {"role": "system", "content": self.tools_block(tools)})
        return out

    # -- renders ---------------------------------------------------------------------------------------
    def full_prompt(
        self, msgs: list[Msg], tools: list[dict] | None, add_generation_prompt: bool = True
    ) -> list[int]:
        """The template's whole rendering, tokenized at once (what a re-tokenizing gateway would send)."""
        return self._encode(
            self._render_text(self.template_messages(msgs, tools), add_generation_prompt, tools)
        )

    def message_delta(self, msg: Msg, tools: list[dict] | None = None) -> list[int]:
        """Tokens the template adds for `msg` after a complete turn: diff against the synthetic prefix."""
        tm = self.template_message(msg, tools)
        full = self._encode(self._render_text([*_SYNTH, tm], False, tools))
        return self._suffix(self._synth_ids, full, f"a {msg.role} message")

    def close_assistant(self, sampled_ids: list[int]) -> list[int]:
        """Template tokens that end an assistant turn and that the model did not sample (mask 0)."""
        close = self.end_of_turn_ids
        if sampled_ids and sampled_ids[-1] == close[0]:
            return close[1:]
        if sampled_ids and sampled_ids[-1] in self.stop_token_ids:
            return close[1:]
        return list(close)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def completion_text(self, sampled_ids: list[int]) -> str:
        ids = sampled_ids[:-1] if sampled_ids and sampled_ids[-1] in self.stop_token_ids else sampled_ids
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def parse_completion(self, text: str) -> tuple[str, list[ToolCall]]:
        return self.parser.parse(text)
