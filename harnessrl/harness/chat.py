"""`ChatHarness`: the task's prompt as one user message, the model's reply as the answer — no tools, no
workspace, nothing executed. The harness of environments whose reward reads the reply alone (instruction
following, question answering, procedural puzzles); the call goes through the gateway like any other, so its
tokens are recorded and trained exactly as sampled.

Spec options: `system_prompt` (default none: the chat template's own), `temperature` (1.0), `seed` (per
rollout by default), `http_retries`, `reviews` (0). Limits: `tokens` (most tokens in the reply), `wall_s`
(the whole episode). A reply the budget cut off ends the episode `token_budget` (still `ok`: its environment
decides what it earns; the instruction rewards give it 0), one the model ended, `submitted`.

`reviews: N` makes a self-checking agent: after its reply, up to N rounds of a review call — a new
conversation holding the request and the current reply, asking whether the reply follows every instruction
(`review_tokens` tokens; an answer that starts with "yes" ends the rounds) — and, on any other answer, a
rewrite call, again a new conversation, whose reply becomes the answer. Every call starts from a context the
previous one did not sample, so the gateway splits: a rollout yields 2 to 1 + 2N samples, as many as the
model's own answers make it — the workload of `benchmarks/ablation_rollout_level.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import openai

from harnessrl.harness.base import (
    Endpoint,
    EpisodeEnd,
    HarnessResult,
    TaskPrompt,
    model_error_status,
    spec_kwargs,
)
from harnessrl.harness.runtime import ToolRuntime
from harnessrl.schema import RolloutStatus


@dataclass(frozen=True)
class ChatConfig:
    LIMITS: ClassVar[dict[str, str]] = {
        "tokens": "max_tokens",
        "wall_s": "wall_s",
    }  # tokens: its reply budget
    system_prompt: str = ""
    temperature: float = 1.0
    max_tokens: int = 256
    wall_s: float = 120.0
    seed: int | None = None
    http_retries: int = 2
    reviews: int = 0
    review_tokens: int = 8

    def __post_init__(self) -> None:
        if (
            self.max_tokens < 1
            or self.wall_s <= 0
            or self.temperature < 0
            or self.http_retries < 0
            or self.reviews < 0
            or self.review_tokens < 1
        ):
            raise ValueError(
                "chat harness: need max_tokens >= 1, wall_s > 0, temperature >= 0, http_retries >= 0, "
                "reviews >= 0, review_tokens >= 1"
            )

    @classmethod
    def from_spec(cls, limits: dict[str, Any], options: dict[str, Any]) -> ChatConfig:
        return cls(**spec_kwargs(cls, limits, options, "chat"))


class ChatHarness:
    def __init__(self, config: ChatConfig | None = None) -> None:
        self.config = config or ChatConfig()

    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime | None = None) -> HarnessResult:
        cfg = self.config
        res = HarnessResult()
        start = time.monotonic()
        client = openai.OpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=cfg.http_retries
        )

        def call(prompt: str, max_tokens: int) -> tuple[str, bool]:
            """One model call in a conversation of its own; its reply and whether the budget cut it off."""
            messages = [{"role": "user", "content": prompt}]
            if cfg.system_prompt:
                messages.insert(0, {"role": "system", "content": cfg.system_prompt})
            extra: dict[str, Any] = {} if cfg.seed is None else {"seed": cfg.seed + res.turns}
            completion = client.chat.completions.create(
                model=endpoint.model,
                messages=cast(Any, messages),
                max_tokens=max_tokens,
                temperature=cfg.temperature,
                timeout=max(1.0, cfg.wall_s - (time.monotonic() - start)),
                **extra,
            )
            reply = completion.choices[0].message.content or ""
            res.turns += 1
            if completion.usage is not None:
                res.prompt_tokens_last = completion.usage.prompt_tokens
                res.completion_tokens += completion.usage.completion_tokens
            res.transcript.extend([*messages, {"role": "assistant", "content": reply}])
            return reply, completion.choices[0].finish_reason == "length"

        try:
            reply, cut_off = call(task.problem_statement, cfg.max_tokens)
            for _ in range(cfg.reviews):
                verdict, _ = call(
                    REVIEW.format(request=task.problem_statement, reply=reply), cfg.review_tokens
                )
                if verdict.strip().lower().startswith("yes"):
                    break
                reply, cut_off = call(
                    REWRITE.format(request=task.problem_statement, reply=reply), cfg.max_tokens
                )
            res.final_answer = reply
            # a reply the budget cut off is no finished answer: its environment decides what it earns
            res.finish_reason = EpisodeEnd.TOKEN_BUDGET if cut_off else EpisodeEnd.SUBMITTED
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
        return res


REVIEW = (
    "Here is a request and a reply to it.\n\nRequest:\n{request}\n\nReply:\n{reply}\n\n"
    "Does the reply follow every instruction in the request? Answer yes or no."
)
REWRITE = (
    "{request}\n\nA previous reply did not follow every instruction above:\n{reply}\n\n"
    "Write a new reply that follows them all."
)
