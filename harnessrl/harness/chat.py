"""`ChatHarness`: the task's prompt as one user message, the model's reply as the answer — no tools, no
workspace, nothing executed. The harness of environments whose reward reads the reply alone (instruction
following, question answering, procedural puzzles); the call goes through the gateway like any other, so its
tokens are recorded and trained exactly as sampled.

Spec options: `system_prompt` (default none: the chat template's own), `temperature` (1.0), `seed` (per
rollout by default), `http_retries`. Limits: `tokens` (most tokens in the reply), `wall_s`. A reply the
budget cut off ends the episode `token_budget` (still `ok`: its environment decides what it earns; the
instruction rewards give it 0), one the model ended, `submitted`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any, cast

import openai

from harnessrl.harness.base import Endpoint, EpisodeEnd, HarnessResult, TaskPrompt, model_error_status
from harnessrl.harness.runtime import ToolRuntime
from harnessrl.schema import RolloutStatus


@dataclass(frozen=True)
class ChatConfig:
    system_prompt: str = ""
    temperature: float = 1.0
    max_tokens: int = 256
    wall_s: float = 120.0
    seed: int | None = None
    http_retries: int = 2

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.wall_s <= 0 or self.temperature < 0 or self.http_retries < 0:
            raise ValueError(
                "chat harness: need max_tokens >= 1, wall_s > 0, temperature >= 0, http_retries >= 0"
            )

    @classmethod
    def from_spec(cls, limits: dict[str, Any], options: dict[str, Any]) -> ChatConfig:
        known = {f.name for f in fields(cls)} - {"max_tokens", "wall_s"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"chat harness: unknown option(s) {unknown}; allowed: {sorted(known)}")
        kw: dict[str, Any] = dict(options)
        if "tokens" in limits:
            kw["max_tokens"] = int(limits["tokens"])
        if "wall_s" in limits:
            kw["wall_s"] = float(limits["wall_s"])
        return cls(**kw)


class ChatHarness:
    def __init__(self, config: ChatConfig | None = None) -> None:
        self.config = config or ChatConfig()

    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime | None = None) -> HarnessResult:
        cfg = self.config
        res = HarnessResult()
        start = time.monotonic()
        messages = [{"role": "user", "content": task.problem_statement}]
        if cfg.system_prompt:
            messages.insert(0, {"role": "system", "content": cfg.system_prompt})
        client = openai.OpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=cfg.http_retries
        )
        extra: dict[str, Any] = {} if cfg.seed is None else {"seed": cfg.seed}
        try:
            completion = client.chat.completions.create(
                model=endpoint.model,
                messages=cast(Any, messages),
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
                timeout=cfg.wall_s,
                **extra,
            )
            reply = completion.choices[0].message.content or ""
            res.turns = 1
            res.final_answer = reply
            # a reply the budget cut off is no finished answer: its environment decides what it earns
            cut_off = completion.choices[0].finish_reason == "length"
            res.finish_reason = EpisodeEnd.TOKEN_BUDGET if cut_off else EpisodeEnd.SUBMITTED
            if completion.usage is not None:
                res.prompt_tokens_last = completion.usage.prompt_tokens
                res.completion_tokens = completion.usage.completion_tokens
            messages.append({"role": "assistant", "content": reply})
        except openai.APITimeoutError:
            res.status, res.finish_reason = RolloutStatus.TIMEOUT, EpisodeEnd.WALL_TIME
            res.error = f"the model call outlived the wall-clock limit ({cfg.wall_s:g} s)"
        except openai.APIStatusError as e:
            res.status, res.finish_reason = model_error_status(e.status_code), EpisodeEnd.MODEL_ERROR
            res.error = f"model endpoint answered {e.status_code}: {e.message}"
        except openai.APIConnectionError as e:
            res.status, res.finish_reason = model_error_status(None), EpisodeEnd.MODEL_ERROR
            res.error = f"model endpoint unreachable: {e}"
        res.model_s = res.wall_s = time.monotonic() - start
        res.transcript = messages
        return res
