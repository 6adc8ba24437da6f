"""For tests that run the real Claude Code CLI: a skip marker naming why it cannot run here, and a scripted engine
(not a model) that drives the CLI through a task.

The engine is the cold-start SFT stage's `ScriptedEngine` (components/sft/demos.py) behind the engine server,
given scripts of Claude Code tool calls in the gateway's tool-call format: for each model call it finds the task
by its problem statement in the prompt and answers the script's next reply (the first one not yet in the prompt).
A compaction request (Claude Code's "CRITICAL: Respond with TEXT ONLY" turn, Codex's "CONTEXT CHECKPOINT
COMPACTION") gets a summary that names the task (a `stateful` engine then goes on with the script after it). Every answer's token ids are kept, in order,
in `sampled`.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.sft.demos import Demonstration, ScriptedEngine
from harnessrl.engine.base import Generation
from harnessrl.harness.cli_agents import CLAUDE_CODE, skip_reason

_why = skip_reason(CLAUDE_CODE)
requires_claude_code = pytest.mark.skipif(_why is not None, reason=_why or "")

COMPACT_MARK = "CRITICAL: Respond with TEXT ONLY"
CODEX_COMPACT_MARK = "CONTEXT CHECKPOINT COMPACTION"  # Codex's (tests/harness/test_codex.py)


def call(name: str, text: str = "", **arguments: Any) -> str:
    """One scripted reply: optional text, then a tool call as the gateway's hermes parser reads it."""
    block = "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
    return f"{text}\n{block}" if text else block


class CliScriptEngine(ScriptedEngine):
    """`stateful`: the next reply is the script's next one whatever the prompt holds (one rollout at a time):
    after a compaction the prompt holds a summary, not the replies so far."""

    def __init__(self, demos: list[Demonstration], tokenizer: Any, model_dir: Any, stateful: bool = False):
        super().__init__(demos, tokenizer, model_dir)
        self.sampled: list[list[int]] = []
        self.compactions = 0
        self.stateful = stateful
        self._next: dict[str, int] = {}

    def reply_for(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        last_turn = text[text.rfind("<|im_start|>user") :]
        demo = next((d for d in self.demos if d.problem_statement in text), None)
        if COMPACT_MARK in last_turn or CODEX_COMPACT_MARK in last_turn:
            self.compactions += 1
            return f"<summary>\nThe task: {demo.problem_statement if demo else ''}\n</summary>"
        if not self.stateful or demo is None:
            return super().reply_for(prompt_ids)
        i = self._next.get(demo.instance_id, 0)
        self._next[demo.instance_id] = i + 1
        return demo.replies[min(i, len(demo.replies) - 1)]

    async def generate(self, *args: Any, **kw: Any) -> Generation:
        gen = await super().generate(*args, **kw)
        self.sampled.append(list(gen.token_ids))
        return gen
