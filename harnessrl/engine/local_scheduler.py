"""The local engine's scheduler thread (a mixin of `LocalEngine`, which owns the state it uses).

Each iteration it applies pending weight syncs (flushing the prefix cache) and aborts, admits waiting requests,
then runs ONE forward pass for the step (`packed.py`): a token for every decoding request plus prefill chunks
up to the step's token budget (a request's prompt starts from the longest block-aligned prefix in the prefix
cache). Decoding rows sample their next token with their own settings; a request whose whole prompt is now in
its cache samples its first token and its KV row joins the batch. Requests therefore join and leave between
steps, a long prompt costs the running sessions at most one chunk per step, and a request's tokens never
depend on its batch neighbours beyond float noise: rows are left-padded and masked, and position ids are per
row.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from harnessrl.engine import kv
from harnessrl.engine.base import EngineError, FinishReason
from harnessrl.engine.local_requests import LocalRequest
from harnessrl.engine.local_stats import EngineStats, ModelShape
from harnessrl.engine.packed import Chunk, StepPlan
from harnessrl.engine.prefix_cache import PrefixCache, block_keys
from harnessrl.engine.sampling import SampledToken, sample
from harnessrl.engine.threads import AdaptiveThreads
from harnessrl.engine.weights import copy_weights

logger = logging.getLogger(__name__)


@dataclass
class WeightSync:
    state: dict[str, torch.Tensor]
    version: int
    done: Future


class SchedulerLoop:
    # set by LocalEngine.__init__
    model: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    num_layers: int
    max_context: int
    max_batch: int
    step_tokens: int
    policy_version: int
    steps: int
    prefix_cache: PrefixCache
    _kv_shape: tuple[int, int, int, int, int]
    _shape: ModelShape
    _stats: EngineStats
    _adaptive: AdaptiveThreads | None
    _no_mask: torch.Tensor
    _lock: threading.Condition
    _waiting: deque[LocalRequest]
    _prefilling: deque[LocalRequest]
    _syncs: deque[WeightSync]
    _abort_ids: set[str]
    _abort_all: bool
    _active: list[LocalRequest]
    _cache: Cache
    _closed: bool

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not (
                        self._closed
                        or self._waiting
                        or self._syncs
                        or self._active
                        or self._prefilling
                        or self._abort_ids
                        or self._abort_all
                    ):
                        self._lock.wait()
                    syncs = list(self._syncs)
                    self._syncs.clear()
                    abort_all, abort_ids = self._abort_all, set(self._abort_ids)
                    self._abort_all = False
                    self._abort_ids.clear()
                    if abort_all or abort_ids:
                        kept = deque()
                        for request in self._waiting:
                            if abort_all or request.id in abort_ids:
                                self._finish(request, FinishReason.ABORT)
                            else:
                                kept.append(request)
                        self._waiting = kept
                    while self._waiting and len(self._active) + len(self._prefilling) < self.max_batch:
                        self._prefilling.append(self._waiting.popleft())
                    closed = self._closed
                if self._adaptive is not None:
                    self._adaptive.update()
                for sync in syncs:
                    self._apply_sync(sync)
                for request in [*self._active, *self._prefilling]:
                    if abort_all or request.id in abort_ids:
                        request.aborted = True
                try:
                    self._step()
                    self._retire_finished()
                except Exception as e:  # a crash fails the requests in flight, not the engine
                    self._fail_all(e)
                if closed and not self._active and not self._prefilling:
                    with self._lock:
                        for request in self._waiting:
                            self._finish(request, FinishReason.ABORT)
                        self._waiting.clear()
                    return

    def _apply_sync(self, sync: WeightSync) -> None:
        try:
            copy_weights(self.model, sync.state)
        except Exception as e:  # reported to the caller that asked for the sync
            sync.done.set_exception(EngineError(f"weight sync failed: {e}"))
            return
        finally:
            self.prefix_cache.clear()  # keys/values of the old weights (or of half-copied ones) are stale
        self.policy_version = sync.version
        logger.info("weights of version %d loaded; prefix cache flushed", sync.version)
        sync.done.set_result(None)

    def _plan_chunks(self, budget: int) -> list[tuple[LocalRequest, int]]:
        """Prefill chunks for this step within `budget` tokens, oldest request first. A request starts (finds
        its cached prefix) only if the blocks it misses first are not being computed in this very step by a
        request ahead of it: it then waits a step and reuses them (a group of identical prompts is computed
        once)."""
        chunks: list[tuple[LocalRequest, int]] = []
        planned: set[bytes] = set()
        block = self.prefix_cache.block_tokens
        for request in list(self._prefilling):
            if budget <= 0:
                break
            if request.aborted or request.result.done():
                self._prefilling.remove(request)
                self._finish(request, FinishReason.ABORT)
                continue
            if request.prefill_cache is None:
                if planned and self.prefix_cache.first_missing(request.prompt) in planned:
                    break
                self._start_prefill(request)
            n = min(len(request.prompt) - request.cached, budget)
            chunks.append((request, n))
            budget -= n
            end = request.cached + n
            planned.update(block_keys(request.prompt, block, end // block)[request.cached // block :])
        return chunks

    def _step(self) -> None:
        """One forward pass: a token for every decoding request plus prefill chunks within the step's token
        budget (`packed.py`). Then the decode rows sample, and a request whose whole prompt is now in its cache
        samples its first token and joins the decode batch."""
        rows = list(self._active)  # joining requests are appended to self._active below
        chunks = self._plan_chunks(max(self.step_tokens - len(rows), self.prefix_cache.block_tokens))
        if not rows and not chunks:
            return
        start = time.perf_counter()
        ids = [r.pending_token for r in rows]
        positions = [r.cached for r in rows]
        plan = StepPlan()
        if rows:
            width = kv.cache_length(self._cache)
            pads = torch.tensor([width - r.cached for r in rows])
            mask = torch.arange(width + 1)[None, :] >= pads[:, None]
            plan = StepPlan(self._cache, len(rows), mask[:, None, None, :].to(self.device))
        keep = list(range(len(rows)))
        completing: list[LocalRequest] = []
        for request, n in chunks:
            assert request.prefill_cache is not None
            plan.chunks.append(Chunk(request.prefill_cache, len(ids), n))
            ids += request.prompt[request.cached : request.cached + n]
            positions += range(request.cached, request.cached + n)
            if request.cached + n == len(request.prompt):
                keep.append(len(ids) - 1)
                completing.append(request)
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            position_ids=torch.tensor([positions], device=self.device),
            attention_mask=self._no_mask,  # 4D: transformers skips building a mask; each part has its own
            logits_to_keep=torch.tensor(keep, dtype=torch.long, device=self.device),
            use_cache=False,
            harnessrl_step=plan,
        )
        logits = out.logits[0]
        flops = 0.0
        for request in rows:
            flops += self._shape.flops(1, request.cached, logits_rows=1)
            request.cached += 1
        for request, n in chunks:
            flops += self._shape.flops(n, request.cached, logits_rows=int(request in completing))
            request.cached += n
            assert request.prefill_cache is not None
            self._share(request, request.prefill_cache, 0, 0)
        if rows:
            for request, token in zip(rows, sample(logits[: len(rows)], [r.row for r in rows]), strict=True):
                self._accept(request, token)
            self.steps += 1
        for i, request in enumerate(completing):
            self._prefilling.remove(request)
            self._join_batch(request, logits[len(rows) + i : len(rows) + i + 1])
        self._count_step(time.perf_counter() - start, flops, len(rows), sum(n for _, n in chunks))

    def _count_step(self, seconds: float, flops: float, rows: int, prefill_tokens: int) -> None:
        """Steps that carried prefill tokens count as prefill (with the decode rows that rode along), the
        others as decode."""
        stats = self._stats
        if prefill_tokens:
            stats.prefill_forward_s += seconds
            stats.prefill_flops += flops
            stats.prefill_forward_tokens += prefill_tokens
        else:
            stats.decode_forward_s += seconds
            stats.decode_flops += flops
        if rows:
            stats.decode_steps += 1
            stats.decode_row_tokens += rows

    def _start_prefill(self, request: LocalRequest) -> None:
        """Its one-row KV cache, starting from the longest cached prefix of its prompt (matched when it starts,
        not at admission, so that it finds what the requests ahead of it just computed)."""
        request.prefill_started_at = time.perf_counter()
        hit, prefix = self.prefix_cache.match(request.prompt)
        if prefix is None:
            prefix = torch.empty(self._kv_shape, dtype=self.dtype, device=self.device)
        request.prefill_cache = kv.new_cache(self.num_layers)
        kv.fill(request.prefill_cache, prefix.to(self.device), spare=len(request.prompt) - hit)
        request.cached = request.prefix_hit = hit
        request.blocks_in_prefix_cache = hit // self.prefix_cache.block_tokens
        request.kv_epoch = self.prefix_cache.epoch

    def _share(self, request: LocalRequest, cache: Cache, row: int, first_column: int) -> None:
        """Adds the request's newly complete blocks to the prefix cache (its tokens start at window column
        `first_column` of `row`), unless the weights changed since its keys/values started."""
        if request.kv_epoch != self.prefix_cache.epoch or not self.prefix_cache.enabled:
            return
        block = self.prefix_cache.block_tokens
        full = request.cached // block
        have = request.blocks_in_prefix_cache
        if full <= have:
            return
        lo, hi = first_column + have * block, first_column + full * block
        self.prefix_cache.insert(request.tokens()[: full * block], have, kv.row_kv(cache, row, lo, hi))
        request.blocks_in_prefix_cache = full

    def _join_batch(self, request: LocalRequest, logits: torch.Tensor) -> None:
        self._accept(request, sample(logits, [request.row])[0])
        single, request.prefill_cache = request.prefill_cache, None
        if request.result.done() or self._finished_reason(request):
            self._finish(request, self._finished_reason(request) or FinishReason.ABORT)
            return
        assert single is not None
        if kv.rows(self._cache) == 0:
            self._cache = kv.new_cache(self.num_layers)
        kv.add_row(self._cache, single)
        self._active.append(request)

    def _accept(self, request: LocalRequest, token: SampledToken) -> None:
        request.accept(token, self.policy_version)

    def _finished_reason(self, request: LocalRequest) -> FinishReason | None:
        if request.aborted:
            return FinishReason.ABORT
        if request.out_ids and request.out_ids[-1] in request.stop:
            return FinishReason.STOP
        if len(request.out_ids) >= request.max_tokens or request.cached + 1 >= self.max_context:
            return FinishReason.LENGTH
        return None

    def _retire_finished(self) -> None:
        """Finishes the requests that are done; their keys/values (prompt and output) go to the prefix
        cache first, then their rows leave the batch and padding every row shares is dropped."""
        width = kv.cache_length(self._cache) if self._active else 0
        done: dict[int, FinishReason] = {}
        for i, request in enumerate(self._active):
            reason = FinishReason.ABORT if request.result.done() else self._finished_reason(request)
            if reason:
                done[i] = reason
        if not done:
            return
        for i, reason in done.items():
            request = self._active[i]
            self._share(request, self._cache, i, width - request.cached)
            self._finish(request, reason)
        order = kv.remove_rows(self._cache, set(done))
        self._active = [self._active[i] for i in order]
        if not self._active:
            self._cache = kv.new_cache(self.num_layers)
            return
        shared_pad = width - max(r.cached for r in self._active)
        if shared_pad:
            kv.drop_left(self._cache, shared_pad)

    def _finish(self, request: LocalRequest, reason: FinishReason) -> None:
        if request.result.done():
            return
        generation = request.generation(reason, self.policy_version)
        stats = self._stats
        stats.requests += 1
        stats.prompt_tokens += len(request.prompt)
        stats.output_tokens += len(request.out_ids)
        stats.queue_s += generation.timings["queue_s"]
        stats.prefill_s += generation.timings["prefill_s"]
        stats.decode_s += generation.timings["decode_s"]
        with contextlib.suppress(Exception):  # the caller may have cancelled the future
            request.result.set_result(generation)
        self._notify_end(request)

    @staticmethod
    def _notify_end(request: LocalRequest) -> None:
        if request.listener is not None:
            with contextlib.suppress(RuntimeError):  # the consumer's event loop is closed
                request.listener(None)

    def _fail_all(self, error: Exception) -> None:
        failed = [*self._active, *self._prefilling]
        message = EngineError(f"local engine step failed: {type(error).__name__}: {error}")
        logger.error("%s (failing %d requests)", message, len(failed))
        for request in failed:
            request.prefill_cache = None
            if not request.result.done():
                request.result.set_exception(message)
                self._notify_end(request)
        self._active = []
        self._prefilling.clear()
        self._cache = kv.new_cache(self.num_layers)
