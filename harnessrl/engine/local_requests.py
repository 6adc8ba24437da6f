"""One request of the local engine: the checks it passes before it is queued, its record on the scheduler
thread (tokens sampled so far, KV bookkeeping, timings) and the `Generation` it resolves to."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from harnessrl.engine.base import EngineRequestError, FinishReason, Generation, SamplingParams
from harnessrl.engine.kv import Cache
from harnessrl.engine.sampling import RowSampling, SampledToken
from harnessrl.engine.speculative import DraftRecord, NgramIndex


def validate_request(
    prompt_ids: list[int],
    sampling: SamplingParams,
    max_tokens: int,
    stop_token_ids: list[int] | None,
    *,
    vocab_size: int,
    max_context: int,
) -> None:
    """Raises EngineRequestError saying what is wrong with the request (the caller's to fix)."""
    if not prompt_ids:
        raise EngineRequestError("prompt_ids is empty: send at least one token id")
    bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise EngineRequestError(
            f"prompt_ids holds {len(bad)} id(s) outside the vocabulary [0, {vocab_size}), e.g. {bad[0]!r}"
        )
    if len(prompt_ids) >= max_context:
        raise EngineRequestError(
            f"prompt has {len(prompt_ids)} tokens; the model's context is {max_context}: "
            "shorten the history (compaction) before calling the engine"
        )
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise EngineRequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
        raise EngineRequestError(f"need temperature >= 0 and 0 < top_p <= 1, got {sampling}")
    if any(not isinstance(t, int) for t in stop_token_ids or ()):
        raise EngineRequestError(f"stop_token_ids must be integers, got {stop_token_ids!r}")


@dataclass
class LocalRequest:
    id: str
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: frozenset[int]
    row: RowSampling
    result: Future
    submitted: float = field(default_factory=time.perf_counter)
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    cached: int = 0  # tokens of this request in the KV cache
    aborted: bool = False
    # prefill: its own one-row KV cache until the whole prompt is in it (then it joins the decode batch)
    prefill_cache: Cache | None = None
    prefix_hit: int = 0  # prompt tokens whose keys/values came from the prefix cache
    blocks_in_prefix_cache: int = 0  # leading full blocks of prompt + output known to be in the prefix cache
    kv_epoch: int = -1  # prefix cache epoch when its KV started (a flush since: its KV must not be shared)
    index: NgramIndex | None = None  # prompt + output, for speculative drafts (set when decoding starts)
    drafts: DraftRecord = field(default_factory=DraftRecord)
    prefill_started_at: float = 0.0
    prefill_s: float = 0.0
    first_token_at: float = 0.0
    # Called on the scheduler thread after each sampled token (token id, logprob, version) and once with
    # None when the request finishes; must be cheap and thread-safe (it hands off to an event loop).
    listener: Callable[[tuple[int, float, int] | None], None] | None = None

    def accept(self, token: SampledToken, version: int) -> None:
        """Records a token sampled under weight `version`; it is fed to the model at the next step."""
        if not self.out_ids:
            self.first_token_at = time.perf_counter()
            self.prefill_s = self.first_token_at - (self.prefill_started_at or self.first_token_at)
        self.out_ids.append(token.token_id)
        self.out_logprobs.append(token.logprob)
        self.versions.append(version)
        if token.top is not None:
            self.tops.append(token.top)
        if self.index is not None:
            self.index.extend([token.token_id])
        if self.listener is not None:
            self.listener((token.token_id, token.logprob, version))

    def unfed(self) -> list[int]:
        """Tokens sampled but not yet fed to the model (their keys/values are not in the cache): the last one,
        or a few more after a speculative step that kept more tokens for this row than for another."""
        return self.out_ids[self.cached - len(self.prompt) :]

    def remaining(self, max_context: int) -> int:
        """Tokens it may still emit (max_tokens, and the model's context)."""
        return min(self.max_tokens, max_context - len(self.prompt)) - len(self.out_ids)

    def tokens(self) -> list[int]:
        """The tokens whose keys/values are in the KV cache: the prompt, then the sampled tokens fed back."""
        return (self.prompt + self.out_ids)[: self.cached]

    def generation(self, reason: FinishReason, current_version: int) -> Generation:
        """What the request resolves to when it finishes now, for `reason`."""
        now = time.perf_counter()
        first = self.first_token_at or now
        return Generation(
            token_ids=list(self.out_ids),
            logprobs=list(self.out_logprobs),
            finish_reason=reason,
            policy_version=self.versions[-1] if self.versions else current_version,
            timings={
                "queue_s": max(0.0, first - self.submitted - self.prefill_s),
                "prefill_s": self.prefill_s,
                "decode_s": now - first,
                "total_s": now - self.submitted,
            },
            token_policy_versions=list(self.versions),
            top_logprobs=list(self.tops) if self.row.top_logprobs > 0 else None,
            cached_prompt_tokens=self.prefix_hit,
        )
