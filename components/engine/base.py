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
    # Weight version of each sampled token: differs from `policy_version` only for tokens sampled before a
    # weight sync that happened mid-request (then `policy_version` is the version of the last token).
    token_policy_versions: list[int] = field(default_factory=list)
    # Per sampled token, the best alternatives as (token id, logprob), when the caller asked for them.
    top_logprobs: list[list[tuple[int, float]]] | None = None


class EngineError(RuntimeError):
    """The engine failed (unreachable, crashed, rejected the request): the rollout is marked failed, not 0."""


class EngineRequestError(EngineError):
    """The request itself is invalid (empty or too long prompt, bad sampling values): fix the caller."""


class Engine(Protocol):
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> Generation: ...
