"""The token-level inference interface every engine implements (local transformers engine, vLLM client)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from harnessrl.engine.vllm_worker import BroadcastInit
    from harnessrl.train.lora import Adapter, LoraSettings

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
    """Weight dtypes the local engine serves in (torch dtype names); `auto`: float32 or bfloat16, whichever this
    host multiplies faster at the model's shapes (measured once per host and cached: `harnessrl.numformat`)."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    AUTO = "auto"


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


class EngineUnreachable(EngineError):
    """The engine did not answer (connection refused or reset): it may be gone; a router fails over."""


class EngineRequestError(EngineError):
    """The request itself is invalid (empty or too long prompt, bad sampling values): fix the caller."""


class WeightSyncUnsupported(EngineError):
    """The engine cannot take new weights (the way asked); the message is one line naming the engine and the
    fix."""


class WeightSyncMode(StrEnum):
    """How new weights reach an engine after an optimizer step (harnessrl.rl.publish sends them)."""

    CHECKPOINT = "checkpoint"  # safetensors under OUT/work/sync; every engine loads the path (shared volume)
    BROADCAST = "broadcast"  # trainer rank 0 broadcasts to every engine worker (nccl on GPUs, gloo on CPU)


@dataclass(frozen=True)
class EngineStats:
    """What an engine reports about its work since it started: the figures the RL loop and the reports read,
    typed, and every figure the engine reported (`figures`, JSON values) for the gateway's metrics."""

    prefill_forward_s: float = 0.0  # forward passes that computed prompt tokens
    prefill_forward_tokens: int = 0  # prompt tokens computed (not served from the prefix cache)
    decode_forward_s: float = 0.0  # forward passes of decode rows alone
    decode_emitted_tokens: int = 0  # tokens decode rows emitted (speculative drafts kept included)
    prefix_cache_hit_rate: float | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def busy_s(self) -> float:
        """Seconds of forward passes."""
        return self.prefill_forward_s + self.decode_forward_s

    @classmethod
    def from_figures(cls, figures: Mapping[str, Any]) -> EngineStats:
        """Reads an engine's report (`GET /stats` of `harnessrl engine serve`, `LocalEngine` counters)."""

        def number(name: str) -> float:
            value = figures.get(name, 0)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0

        hit = figures.get("prefix_cache_hit_rate")
        return cls(
            prefill_forward_s=number("prefill_forward_s"),
            prefill_forward_tokens=int(number("prefill_forward_tokens")),
            decode_forward_s=number("decode_forward_s"),
            decode_emitted_tokens=int(number("decode_emitted_tokens")),
            prefix_cache_hit_rate=float(hit) if isinstance(hit, int | float) else None,
            figures=dict(figures),
        )

    @classmethod
    def total(cls, parts: Sequence[EngineStats]) -> EngineStats:
        """The sum over replicas (`figures` lists each replica's)."""
        hits = [p.prefix_cache_hit_rate for p in parts if p.prefix_cache_hit_rate is not None]
        return cls(
            prefill_forward_s=sum(p.prefill_forward_s for p in parts),
            prefill_forward_tokens=sum(p.prefill_forward_tokens for p in parts),
            decode_forward_s=sum(p.decode_forward_s for p in parts),
            decode_emitted_tokens=sum(p.decode_emitted_tokens for p in parts),
            prefix_cache_hit_rate=sum(hits) / len(hits) if hits else None,
            figures={"replicas": [dict(p.figures) for p in parts]},
        )


class Engine(Protocol):
    """The token-level interface every engine implements, and the abilities a long-running caller (gateway,
    RL loop) uses. One convention: every method is a coroutine, awaited on the caller's event loop (an HTTP
    engine's connections live on it; an in-process engine answers at once). An engine declares itself by
    subclassing `Engine` (or the ability protocols below) and overrides what it can do; the defaults here
    answer "cannot" in the documented way, so callers never probe for a method."""

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> Generation: ...

    async def stats(self) -> EngineStats | None:
        """Counters since the engine started; None when it reports none."""
        return None

    async def abort(self, request_ids: list[str] | None = None) -> bool:
        """Stops the given requests (all when None): they finish with "abort" and the tokens sampled so far.
        False when the engine cannot (callers then cancel their requests instead)."""
        return False

    async def context_length(self) -> int | None:
        """Prompt + completion tokens one request may hold; None when the engine does not say."""
        return None

    async def health(self) -> bool:
        """Whether the engine answers (a router's health check); an in-process engine always does."""
        return True

    async def release(self) -> None:
        """Lets go of what the engine holds on the running event loop (an HTTP client's connections); the
        engine itself keeps serving. Its owner stops an in-process engine."""
        return None


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that can hand out tokens as they are sampled (optional: `generate_stream` adapts others)."""

    def generate_stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> AsyncIterator[GenerationDelta]: ...


@runtime_checkable
class WeightLoadingEngine(Engine, Protocol):
    """An engine that can swap in new weights, tagging later tokens with their version."""

    async def check_weight_sync(self, mode: WeightSyncMode = WeightSyncMode.CHECKPOINT) -> None:
        """Raises `WeightSyncUnsupported` (harnessrl.engine.weight_sync: one line naming the engine and the
        fix) unless the engine can take weights the way `mode` sends them."""
        ...

    async def load_weights(self, checkpoint_dir: str, version: int) -> None: ...

    async def load_adapter(self, adapter_dir: str, version: int) -> None:
        """A LoRA adapter (PEFT's layout, harnessrl.train.lora) as the weights of `version`: every adapted
        weight becomes the base's + scale · B @ A, the base being what the engine served before its first
        adapter (each version replaces the last). Only the adapter travels; raises on any failure, and a
        refused adapter changes nothing."""
        ...


@runtime_checkable
class InProcessEngine(WeightLoadingEngine, Protocol):
    """An engine in the trainer's own process (the LocalEngine): it takes new weights as tensors in memory,
    copied into its own between two decode steps, with no file between them."""

    def load_state_sync(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Blocks until applied; `state` is read, never kept (the caller may change it afterwards)."""
        ...

    def load_adapter_sync(self, adapter: Adapter, version: int) -> None:
        """A LoRA run's adapter as the weights of `version` (every adapted weight: the base's + scale · B @ A);
        blocks until applied. The base is the weights the engine served before its first adapter."""
        ...

    def release_until_sync(self) -> None:
        """The engine will generate nothing until the next weight sync (the trainer steps meanwhile): it frees
        what that sync makes again anyway (its prefix cache, its weights' packed copies). Returns at once; a
        request that comes before the sync is served, at full speed again."""
        ...


@runtime_checkable
class BroadcastEngine(WeightLoadingEngine, Protocol):
    """An engine whose workers can join the trainer's broadcast group (`harnessrl.engine.broadcast`) and
    receive each update from it: a server (`harnessrl engine serve`, vLLM with the worker extension) or a
    Router of them."""

    @property
    def workers(self) -> int:
        """Ranks this engine brings to the group (known once `check_weight_sync` asked)."""
        ...

    def endpoints(self) -> list[str]:
        """The base URLs of its servers (the trainer listens on the route to them)."""
        ...

    async def init_weight_broadcast(self, init: BroadcastInit) -> list[Any]: ...

    async def receive_weights_broadcast(self, version: int, adapter: LoraSettings | None = None) -> None:
        """One update by broadcast, tagged `version`: every weight, or (with `adapter`) a LoRA adapter of those
        settings, merged onto the base weights."""
        ...


async def generate_stream(
    engine: Engine,
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
