"""The token-level inference interface every engine implements (local transformers engine, vLLM client)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch.Generator accepts

# LocalEngine defaults (here, not in local.py, so that the CLI's help needs no torch)
DEFAULT_PREFIX_CACHE_MB = 1024  # prefix cache budget
DEFAULT_STEP_TOKENS = 256  # tokens per scheduler step: one per decoding request + prefill chunks
DEFAULT_BLOCK_TOKENS = 16  # prefix cache block size
DEFAULT_SPECULATIVE_TOKENS = 6  # prompt-lookup drafts a decoding request may feed per step (0: off)


class FinishReason(StrEnum):
    """Why a generation stopped (the OpenAI / vLLM `finish_reason` values an engine answers)."""

    STOP = "stop"  # a stop token was sampled (it is part of the tokens)
    LENGTH = "length"  # max_tokens reached, or the model's context is full
    ABORT = "abort"  # aborted (weight sync, caller gone); the tokens sampled so far are kept


class DType(StrEnum):
    """Weight dtypes the local engine serves in (torch dtype names)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class ModelImpl(StrEnum):
    """Whose forward pass the local engine runs (as vLLM's `--model-impl`): its own for Llama-family
    checkpoints (`native`, `llama.py`), transformers' model (`transformers`), or the first that serves the
    checkpoint (`auto`)."""

    AUTO = "auto"
    NATIVE = "native"
    TRANSFORMERS = "transformers"


@dataclass(frozen=True)
class SamplingParams:
    """Raises ValueError naming the field for values no engine can sample with (NaN, inf, a negative
    temperature, top_p outside (0, 1], a seed beyond 64 bits, booleans or strings)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (_real(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature: must be a finite number >= 0, got {self.temperature!r}")
        if not (_real(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p: must be a number in (0, 1], got {self.top_p!r}")
        seed = self.seed
        if seed is not None and not (
            isinstance(seed, int) and not isinstance(seed, bool) and SEED_RANGE[0] <= seed <= SEED_RANGE[1]
        ):
            raise ValueError(f"seed: must be an integer in [-2**63, 2**64 - 1] or null, got {seed!r}")


def _real(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # logprob of each sampled token under the distribution actually sampled from
    finish_reason: FinishReason
    policy_version: int = 0  # weight version that produced these tokens
    timings: dict[str, float] = field(default_factory=dict)
    # Weight version of each sampled token: differs from `policy_version` only for tokens sampled before a
    # weight sync that happened mid-request (then `policy_version` is the version of the last token).
    token_policy_versions: list[int] = field(default_factory=list)
    # Per sampled token, the best alternatives as (token id, logprob), when the caller asked for them.
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # Prompt tokens whose keys/values the engine took from its prefix cache instead of computing them.
    cached_prompt_tokens: int = 0


@dataclass
class GenerationDelta:
    """What one streaming step adds: new sampled token ids, their logprobs and weight versions. The last
    delta of a stream carries `finish_reason` (and may hold no tokens)."""

    token_ids: list[int]
    logprobs: list[float]
    token_policy_versions: list[int]
    finish_reason: FinishReason | None = None


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


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that can hand out tokens as they are sampled (optional: `generate_stream` adapts others)."""

    def generate_stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> AsyncIterator[GenerationDelta]: ...


@runtime_checkable
class WeightLoadingEngine(Protocol):
    """An engine that can swap in the weights of a checkpoint directory (tagging later tokens `version`)."""

    async def load_weights(self, checkpoint_dir: str, version: int) -> None: ...


async def generate_stream(
    engine: Any,
    prompt_ids: list[int],
    sampling: SamplingParams,
    max_tokens: int,
    stop_token_ids: list[int] | None = None,
) -> AsyncIterator[GenerationDelta]:
    """Streams from `engine.generate_stream` when the engine has it (optional in the protocol); otherwise
    adapts `generate`: one delta at the end with every token and the finish reason."""
    if isinstance(engine, StreamingEngine):
        async for delta in engine.generate_stream(prompt_ids, sampling, max_tokens, stop_token_ids):
            yield delta
        return
    gen = await engine.generate(prompt_ids, sampling, max_tokens, stop_token_ids)
    versions = list(gen.token_policy_versions or [gen.policy_version] * len(gen.token_ids))
    yield GenerationDelta(list(gen.token_ids), list(gen.logprobs), versions, gen.finish_reason)
