"""The token-level inference interface every engine implements (local transformers engine, vLLM client)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # logprob of each sampled token under the distribution actually sampled from
    finish_reason: str  # "stop" | "length" | "abort"
    policy_version: int = 0  # weight version that produced these tokens
    timings: dict[str, float] = field(default_factory=dict)


class EngineError(RuntimeError):
    """The engine failed (unreachable, crashed, rejected the request): the rollout is marked failed, not 0."""


class Engine(Protocol):
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> Generation: ...
