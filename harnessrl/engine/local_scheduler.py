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

from harnessrl import memory
from harnessrl.engine import kv, layout
from harnessrl.engine.base import EngineError, FinishReason
from harnessrl.engine.kv import Cache
from harnessrl.engine.local_requests import LocalRequest
from harnessrl.engine.local_stats import EngineCounters, ModelShape
from harnessrl.engine.packed import Chunk, StepForward, StepPlan
from harnessrl.engine.prefix_cache import PrefixCache, block_keys
from harnessrl.engine.sampling import SampledToken, sample, verify
from harnessrl.engine.speculative import ENGINE_DECAY, DraftRecord, NgramIndex, draft_room
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
    speculative_tokens: int
    policy_version: int
    steps: int
    prefix_cache: PrefixCache
    _kv_shape: tuple[int, int, int, int, int]
    _shape: ModelShape
    _stats: EngineCounters
    _adaptive: AdaptiveThreads | None
    _forward: StepForward
    _lock: threading.Condition
    _waiting: deque[LocalRequest]
    _prefilling: deque[LocalRequest]
    _syncs: deque[WeightSync]
    _abort_ids: set[str]
    _abort_all: bool
    _active: list[LocalRequest]
    _cache: Cache
    _drafted: dict[bool, DraftRecord]  # the engine's speculative drafts over recent requests, greedy or not
    # [rows, window] bool: the batch cache's columns that hold each row's tokens (left padding, and the drafts
    # it did not keep where another row kept more, are not its own)
    _columns: torch.Tensor
    # holes tolerated in the decode batch: this many columns, or this share of its longest row
    _hole_slack: int = 64
    _hole_share: float = 0.25
    _closed: bool

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not (
                        self._closed
                        or self._waiting
                        or self._syncs
                        or self._release
                        or self._active
                        or self._prefilling
                        or self._abort_ids
                        or self._abort_all
                    ):
                        self._lock.wait()
                    syncs = list(self._syncs)
                    self._syncs.clear()
                    release, self._release = self._release, False
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
                if release:
                    self._release_until_sync()
                for sync in syncs:
                    self._apply_sync(sync)
                if self._released and (self._active or self._prefilling):
                    layout.repack(self.model)  # generating before a sync came: at full speed again
                    self._released = False
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

    def _release_until_sync(self) -> None:
        """Frees what the next weight sync makes again: the prefix cache (stale under new weights) and MKL's
        packed weight copies (made again from the new weights)."""
        self.prefix_cache.clear()
        layout.unpack(self.model)
        self._released = True
        memory.trim()

    def _apply_sync(self, sync: WeightSync) -> None:
        try:
            copy_weights(self.model, sync.state)
            layout.repack(self.model)  # MKL's packed copies of the new weights
            self._released = False
        except Exception as e:  # reported to the caller that asked for the sync
            sync.done.set_exception(EngineError(f"weight sync failed: {e}"))
            return
        finally:
            self.prefix_cache.clear()  # keys/values of the old weights (or of half-copied ones) are stale
            memory.trim()  # the flushed blocks' pages back to the system
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
        """One forward pass: the tokens of every decoding request plus prefill chunks within the step's token
        budget (`packed.py`). A decoding request feeds the tokens it has sampled but not yet fed (usually one)
        and, with speculative decoding, prompt-lookup drafts; it then emits the tokens the model itself
        produces (`sampling.verify`). A request whose whole prompt is now in its cache samples its first token
        and joins the decode batch."""
        rows = list(self._active)  # joining requests are appended to self._active below
        feeds = [r.unfed() for r in rows]
        drafts = self._drafts(rows, sum(len(f) for f in feeds))
        decode_tokens = sum(len(f) + len(d) for f, d in zip(feeds, drafts, strict=True))
        chunks = self._plan_chunks(max(self.step_tokens - decode_tokens, self.prefix_cache.block_tokens))
        if not rows and not chunks:
            return
        start = time.perf_counter()
        ids: list[int] = []
        positions: list[int] = []
        keep: list[int] = []  # logits rows: after each row's last unfed token and after each draft, ...
        slots: list[int] = []
        columns = max((len(f) + len(d) for f, d in zip(feeds, drafts, strict=True)), default=1)
        for r, (request, fed, draft) in enumerate(zip(rows, feeds, drafts, strict=True)):
            keep += range(len(ids) + len(fed) - 1, len(ids) + len(fed) + len(draft))
            slots += range(r * columns, r * columns + len(fed) + len(draft))
            ids += fed + draft
            positions += range(request.cached, request.cached + len(fed) + len(draft))
        plan = StepPlan()
        read = 0.0
        if rows:
            plan = self._decode_plan(rows, columns, slots)
            if not chunks:  # counted for decode-only steps
                read = self._shape.decode_bytes(len(rows), kv.cache_length(self._cache) + columns)
        completing: list[LocalRequest] = []
        for request, n in chunks:
            assert request.prefill_cache is not None
            plan.chunks.append(Chunk(request.prefill_cache, len(ids), n))
            ids += request.prompt[request.cached : request.cached + n]
            positions += range(request.cached, request.cached + n)
            if request.cached + n == len(request.prompt):
                keep.append(len(ids) - 1)  # ... then each completing prefill's last token
                completing.append(request)
        logits = self._forward(
            torch.tensor(ids, device=self.device),
            torch.tensor(positions, device=self.device),
            torch.tensor(keep, dtype=torch.long, device=self.device),
            plan,
        )
        flops = 0.0
        for request, fed, draft in zip(rows, feeds, drafts, strict=True):
            flops += self._shape.flops(len(fed) + len(draft), request.cached, logits_rows=len(draft) + 1)
        for request, n in chunks:
            flops += self._shape.flops(n, request.cached, logits_rows=int(request in completing))
            request.cached += n
            assert request.prefill_cache is not None
            self._share(request, request.prefill_cache, 0)
        decode_logits = len(keep) - len(completing)
        emitted = 0
        if rows:
            emitted = self._verify(rows, feeds, drafts, columns, logits[:decode_logits])
            self.steps += 1
        for i, request in enumerate(completing):
            self._prefilling.remove(request)
            self._join_batch(request, logits[decode_logits + i : decode_logits + i + 1])
        self._count_step(
            time.perf_counter() - start,
            flops,
            len(rows),
            sum(n for _, n in chunks),
            decode_tokens,
            sum(len(d) for d in drafts),
            emitted,
            read,
        )

    def _drafts(self, rows: list[LocalRequest], fed: int) -> list[list[int]]:
        """Each decoding row's prompt-lookup drafts (`speculative.py`): at most `speculative_tokens`, none past
        the request's end, none for a request whose drafts the model mostly rejects, and all of them together
        within half of the step's token budget."""
        budget = self.step_tokens // 2 - fed
        drafts: list[list[int]] = []
        for request in rows:
            most = min(self.speculative_tokens, request.remaining(self.max_context) - 1, budget)
            room = draft_room(request.drafts, self._drafted[request.row.greedy], most, len(request.out_ids))
            draft = request.index.draft(room) if request.index is not None and room > 0 else []
            budget -= len(draft)
            drafts.append(draft)
        return drafts

    def _decode_plan(self, rows: list[LocalRequest], columns: int, slots: list[int]) -> StepPlan:
        """The decode rows' part of the step: their attention mask (the row's own window columns; among the
        new columns, those at or before the query's) and, for several tokens per row, where each goes."""
        assert self._columns.shape == (len(rows), kv.cache_length(self._cache))
        own = self._columns
        if columns == 1:
            mask = torch.cat((own, torch.ones(len(rows), 1, dtype=torch.bool)), dim=1)
            return StepPlan(
                self._cache, len(rows), mask[:, None, None, :].to(self.device), decode_tokens=len(rows)
            )
        causal = torch.ones(columns, columns, dtype=torch.bool).tril_()
        mask = torch.cat(
            (own[:, None, :].expand(-1, columns, -1), causal[None].expand(len(rows), -1, -1)), dim=2
        )
        return StepPlan(
            self._cache,
            len(rows),
            mask.to(self.device),
            columns=columns,
            slots=torch.tensor(slots, dtype=torch.long, device=self.device),
            decode_tokens=len(slots),
        )

    def _verify(
        self,
        rows: list[LocalRequest],
        feeds: list[list[int]],
        drafts: list[list[int]],
        columns: int,
        logits: torch.Tensor,
    ) -> int:
        """Emits each decode row's tokens (its drafts the model keeps, then one of its own). Every row wrote
        `columns` new columns; the batch keeps as many as the row that kept most needs, and a row that kept
        fewer marks the rest as not its own (holes its mask hides from then on). Returns the tokens emitted."""
        valid: list[int] = []
        emitted = 0
        checked = verify(logits, [r.row for r in rows], drafts)
        for request, fed, draft, tokens in zip(rows, feeds, drafts, checked, strict=True):
            kept = 0
            for token in tokens:
                self._accept(request, token)
                kept += int(kept < len(draft) and token.token_id == draft[kept])
                if token.token_id in request.stop:
                    break
            new = len(request.out_ids) - (request.cached + len(fed) - len(request.prompt))
            emitted += new
            if draft:
                request.drafts.record(len(draft), kept)
                self._drafted[request.row.greedy].record(len(draft), kept, ENGINE_DECAY)
            # the keys/values of the fed tokens and the kept drafts, less the last emitted token's (a draft
            # that was a stop token): as in a plain step, the last token is never fed
            valid.append(len(fed) + min(kept, new - 1))
        most = max(valid)
        if columns > most:
            kv.drop_right(self._cache, columns - most)
        counts = torch.tensor(valid)
        self._columns = torch.cat((self._columns, torch.arange(most)[None, :] < counts[:, None]), dim=1)
        for request, v in zip(rows, valid, strict=True):
            request.cached += v
        if most > min(valid):
            self._compact_holes()
        return emitted

    def _count_step(
        self,
        seconds: float,
        flops: float,
        rows: int,
        prefill_tokens: int,
        decode_tokens: int = 0,
        drafted: int = 0,
        emitted: int = 0,
        decode_bytes: float = 0.0,
    ) -> None:
        """Steps that carried prefill tokens count as prefill (with the decode rows that rode along), the
        others as decode."""
        stats = self._stats
        stats.decode_fed_tokens += decode_tokens
        stats.speculative_drafted_tokens += drafted
        stats.decode_emitted_tokens += emitted
        if prefill_tokens:
            stats.prefill_forward_s += seconds
            stats.prefill_flops += flops
            stats.prefill_forward_tokens += prefill_tokens
        else:
            stats.decode_forward_s += seconds
            stats.decode_forward_steps += 1
            stats.decode_flops += flops
            stats.decode_bytes += decode_bytes
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

    def _share(
        self, request: LocalRequest, cache: Cache, row: int, columns: torch.Tensor | None = None
    ) -> None:
        """Adds the request's newly complete blocks to the prefix cache (its tokens are in window `columns` of
        `row`; None: token i at column i), unless the weights changed since its keys/values started."""
        if request.kv_epoch != self.prefix_cache.epoch or not self.prefix_cache.enabled:
            return
        block = self.prefix_cache.block_tokens
        full = request.cached // block
        have = request.blocks_in_prefix_cache
        if full <= have:
            return
        lo, hi = have * block, full * block
        values = (
            kv.row_kv(cache, row, lo, hi) if columns is None else kv.row_kv_at(cache, row, columns[lo:hi])
        )
        self.prefix_cache.insert(request.tokens()[: full * block], have, values)
        request.blocks_in_prefix_cache = full

    def _join_batch(self, request: LocalRequest, logits: torch.Tensor) -> None:
        self._accept(request, sample(logits, [request.row])[0])
        if self.speculative_tokens:
            request.index = NgramIndex(request.prompt + request.out_ids)
        single, request.prefill_cache = request.prefill_cache, None
        if request.result.done() or self._finished_reason(request):
            self._finish(request, self._finished_reason(request) or FinishReason.ABORT)
            return
        assert single is not None
        if kv.rows(self._cache) == 0:
            self._reset_batch()
        kv.add_row(self._cache, single)
        width, before = kv.cache_length(self._cache), self._columns
        grown = torch.zeros(before.shape[0], width - before.shape[1], dtype=torch.bool)
        row = torch.arange(width) >= width - request.cached  # right-aligned at the write column
        self._columns = torch.cat((torch.cat((grown, before), dim=1), row[None]))
        self._active.append(request)

    def _accept(self, request: LocalRequest, token: SampledToken) -> None:
        request.accept(token, self.policy_version)

    def _finished_reason(self, request: LocalRequest) -> FinishReason | None:
        """How the request ended, if it has; one that ended before an abort reached it ended that way."""
        if request.out_ids and request.out_ids[-1] in request.stop:
            return FinishReason.STOP
        if request.remaining(self.max_context) <= 0:
            return FinishReason.LENGTH
        if request.aborted:
            return FinishReason.ABORT
        return None

    def _retire_finished(self) -> None:
        """Finishes the requests that are done; their keys/values (prompt and output) go to the prefix
        cache first, then their rows leave the batch and padding every row shares is dropped."""
        done: dict[int, FinishReason] = {}
        for i, request in enumerate(self._active):
            reason = FinishReason.ABORT if request.result.done() else self._finished_reason(request)
            if reason:
                done[i] = reason
        if not done:
            return
        for i, reason in done.items():
            request = self._active[i]
            self._share(request, self._cache, i, torch.nonzero(self._columns[i]).flatten())
            self._finish(request, reason)
        order = kv.remove_rows(self._cache, set(done))
        self._active = [self._active[i] for i in order]
        self._columns = self._columns[order]
        if not self._active:
            self._reset_batch()
            return
        shared_pad = int(self._columns.any(dim=0).int().argmax())  # leading columns no row owns
        if shared_pad:
            kv.drop_left(self._cache, shared_pad)
            self._columns = self._columns[:, shared_pad:]

    def _compact_holes(self) -> None:
        """Drops the holes rejected drafts left in the decode batch once they exceed a quarter of the longest
        row (and 64 columns): every step reads the whole window, so a row that keeps many
        drafts beside rows that keep none must not widen it for good. One copy of the batch's keys/values."""
        if not self._active:
            return
        longest = int(self._columns.sum(dim=1).max())
        if self._columns.shape[1] - longest <= max(self._hole_slack, int(longest * self._hole_share)):
            return
        kv.compact(self._cache, self._columns)
        counts = self._columns.sum(dim=1, keepdim=True)
        self._columns = torch.arange(longest)[None, :] >= longest - counts

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
        self._reset_batch()

    def _reset_batch(self) -> None:
        """An empty decode batch: its KV cache, and which window columns hold each row's tokens."""
        self._cache = kv.new_cache(self.num_layers)
        self._columns = torch.zeros(0, 0, dtype=torch.bool)
