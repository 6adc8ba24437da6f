"""Local inference engine on transformers with continuous (step-level) batching, chunked prefill and
automatic prefix caching.

One background thread owns the model. Each iteration it applies pending weight syncs (flushing the prefix
cache) and aborts, admits waiting requests, spends the step's token budget on prefill chunks (a request's
prompt starts from the longest block-aligned prefix in the prefix cache; once the whole prompt is in, its
first token is sampled and its KV row joins the batch), then runs ONE decode step for every active request
together and samples each row with its own settings. Requests therefore join and leave between steps, a long
prompt delays the running sessions by at most one chunk per step, and a request's tokens never depend on its
batch neighbours beyond float noise: rows are left-padded and masked, and position ids are per row.

Over 400 lines: the scheduling loop, its prefill chunks, the prefix cache and the weight sync share the model
thread's state; request records, the KV layout, the prefix cache, stats and weight loading live in
local_requests.py, kv.py, prefix_cache.py, local_stats.py and weights.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache

from harnessrl.engine import kv
from harnessrl.engine.base import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_PREFIX_CACHE_MB,
    DEFAULT_STEP_TOKENS,
    DType,
    EngineError,
    FinishReason,
    Generation,
    GenerationDelta,
    SamplingParams,
)
from harnessrl.engine.local_requests import LocalRequest, validate_request
from harnessrl.engine.local_stats import EngineStats, ModelShape
from harnessrl.engine.prefix_cache import PrefixCache
from harnessrl.engine.sampling import RowSampling, SampledToken, sample
from harnessrl.engine.threads import AdaptiveThreads, engine_cores
from harnessrl.engine.weights import copy_weights, read_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class _WeightSync:
    state: dict[str, torch.Tensor]
    version: int
    done: Future


class LocalEngine:
    """`Engine` on a local transformers causal LM. Thread-safe; `generate` may be awaited from any event loop.

    - `max_batch`: most requests in flight together (prefilling or decoding); more wait in a queue.
    - `threads`: torch CPU threads, set process-wide. None: adaptive — all the engine's cores while other
      processes leave them idle, 1 while they do not (`threads.AdaptiveThreads`); 0: leave torch's setting.
    - `prefix_cache_mb`: memory budget of the prefix cache (None: 1024; 0 turns it off); `block_tokens`: its
      block size.
    - `step_tokens`: tokens one scheduler step computes: one per decoding request plus prefill chunks.
    - Default stop tokens: the tokenizer's eos and `<|im_end|>`; `stop_token_ids` adds to them (as in vLLM).
      The stop token is included in `token_ids` (it was sampled, so it is trainable).
    - `finish_reason`: a `FinishReason` (stop token, max_tokens or a full context, abort).
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        max_batch: int = 32,
        dtype: DType = DType.FLOAT32,
        device: str | None = None,
        threads: int | None = None,
        policy_version: int = 0,
        prefix_cache_mb: float | None = None,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
    ) -> None:
        from harnessrl.tinymodel import load_model, load_tokenizer, tiny_model_dir

        self.model_dir = Path(model_dir) if model_dir else tiny_model_dir()
        if not (self.model_dir / "config.json").is_file():
            raise EngineError(f"{self.model_dir}: not a Hugging Face model directory (no config.json)")
        self._adaptive = AdaptiveThreads(engine_cores()) if threads is None else None
        if threads:  # 0: leave torch's setting alone
            torch.set_num_threads(threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = load_tokenizer(self.model_dir)
        # transformers declares PreTrainedModel.to as torch's unbound Module.to (functools.wraps): call that
        self.model = torch.nn.Module.to(load_model(self.model_dir, dtype=DType(dtype)), self.device).eval()
        config = self.model.config
        if not isinstance(config, PretrainedConfig):
            raise EngineError(f"{self.model_dir}: the model has no Hugging Face config")
        self.num_layers = int(config.num_hidden_layers)
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.vocab_size = int(config.vocab_size)
        self.default_stop = self._default_stop_ids()
        prefix_cache_mb = DEFAULT_PREFIX_CACHE_MB if prefix_cache_mb is None else prefix_cache_mb
        if max_batch < 1 or step_tokens < 1 or block_tokens < 1 or prefix_cache_mb < 0:
            raise EngineError(
                "need max_batch, step_tokens and block_tokens >= 1 and prefix_cache_mb >= 0, got "
                f"{max_batch}, {step_tokens}, {block_tokens} and {prefix_cache_mb}"
            )
        self.max_batch = max_batch
        self.step_tokens = step_tokens
        self.policy_version = policy_version
        self.steps = 0  # decode steps run (for tests and metrics)
        heads = int(config.num_key_value_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self._kv_shape = (self.num_layers, 2, heads, 0, head_dim)
        self.dtype = next(self.model.parameters()).dtype
        dtype_bytes = torch.empty((), dtype=self.dtype).element_size()
        self.prefix_cache = PrefixCache(
            block_tokens,
            int(prefix_cache_mb * 2**20),
            bytes_per_token=self.num_layers * 2 * heads * head_dim * dtype_bytes,
        )
        self._shape = ModelShape.of(self.model, config)
        self._stats = EngineStats(prefix_cache=self.prefix_cache.stats)

        self._lock = threading.Condition()
        self._waiting: deque[LocalRequest] = deque()
        self._prefilling: deque[LocalRequest] = deque()
        self._syncs: deque[_WeightSync] = deque()
        self._abort_ids: set[str] = set()
        self._abort_all = False
        self._active: list[LocalRequest] = []
        self._cache = kv.new_cache(self.num_layers)
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="harnessrl-engine", daemon=True)
        self._thread.start()

    def _default_stop_ids(self) -> frozenset[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != self.tokenizer.unk_token_id:
            ids.add(im_end)
        return frozenset(ids)

    # ---- public API -------------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        *,
        request_id: str | None = None,
        top_logprobs: int = 0,
    ) -> Generation:
        request = self.submit(
            prompt_ids, sampling, max_tokens, stop_token_ids, request_id=request_id, top_logprobs=top_logprobs
        )
        try:
            return await asyncio.wrap_future(request.result)
        except asyncio.CancelledError:
            self.abort([request.id])  # the caller went away: free the batch slot
            raise

    async def generate_stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        *,
        request_id: str | None = None,
    ) -> AsyncGenerator[GenerationDelta, None]:
        """One delta per decode step (tokens reach the caller as they are sampled); the last delta carries
        `finish_reason` and no tokens. Same tokens as `generate` for the same seed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float, int] | None] = asyncio.Queue()

        def listener(item: tuple[int, float, int] | None) -> None:
            with contextlib.suppress(RuntimeError):  # the consumer's event loop is closed
                loop.call_soon_threadsafe(queue.put_nowait, item)

        request = self.submit(
            prompt_ids, sampling, max_tokens, stop_token_ids, request_id=request_id, listener=listener
        )
        try:
            finished = False
            while not finished:
                ready = [await queue.get()]
                while not queue.empty():  # batch what is ready
                    ready.append(queue.get_nowait())
                finished = ready[-1] is None  # the listener's last call, once, after every token
                items = [i for i in ready if i is not None]
                if items:
                    yield GenerationDelta([i[0] for i in items], [i[1] for i in items], [i[2] for i in items])
            generation: Generation = await asyncio.wrap_future(request.result)
            yield GenerationDelta([], [], [], generation.finish_reason)
        finally:
            if not request.result.done():  # the consumer stopped early: free the batch slot
                self.abort([request.id])

    def submit(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        *,
        request_id: str | None = None,
        top_logprobs: int = 0,
        listener: Callable[[tuple[int, float, int] | None], None] | None = None,
    ) -> LocalRequest:
        """Queues a request; its `.result` (a concurrent Future) resolves to a Generation."""
        validate_request(
            prompt_ids,
            sampling,
            max_tokens,
            stop_token_ids,
            vocab_size=self.vocab_size,
            max_context=self.max_context,
        )
        generator = torch.Generator()
        generator.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(62))
        request = LocalRequest(
            id=request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}",
            prompt=[int(t) for t in prompt_ids],
            sampling=sampling,
            max_tokens=int(max_tokens),
            stop=self.default_stop | frozenset(int(t) for t in stop_token_ids or ()),
            row=RowSampling(sampling.temperature, sampling.top_p, generator, top_logprobs),
            result=Future(),
            listener=listener,
        )
        with self._lock:
            if self._closed:
                raise EngineError("engine is closed")
            self._waiting.append(request)
            self._lock.notify()
        return request

    def abort(self, request_ids: list[str] | None = None) -> None:
        """Aborts the given requests (all in flight and queued if None); they finish with "abort" and the
        tokens sampled so far."""
        with self._lock:
            if request_ids is None:
                self._abort_all = True
            else:
                self._abort_ids.update(request_ids)
            self._lock.notify()

    def load_weights_sync(self, checkpoint_dir: str | Path, version: int) -> None:
        """Swaps in the weights of a Hugging Face checkpoint dir (safetensors) between two decode steps.
        Blocks until applied. Requests in flight continue on the new weights (their tokens record the
        version that sampled them)."""
        state = read_checkpoint(self.model, Path(checkpoint_dir))
        sync = _WeightSync(state, int(version), Future())
        with self._lock:
            if self._closed:
                raise EngineError("engine is closed")
            self._syncs.append(sync)
            self._lock.notify()
        sync.done.result()

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, self.load_weights_sync, checkpoint_dir, version
        )

    def inflight(self) -> int:
        with self._lock:
            return len(self._active) + len(self._prefilling) + len(self._waiting)

    def stats(self) -> dict[str, object]:
        """Counters since start: requests, queue/prefill/decode seconds (also per request), forward-pass
        seconds and FLOPs of prefill and decode, the prefix cache's hits (`prefix_cache_hit_rate`)."""
        out = self._stats.as_dict()
        out.update(
            prefix_cache_blocks=self.prefix_cache.blocks,
            prefix_cache_capacity_blocks=self.prefix_cache.capacity_blocks,
            block_tokens=self.prefix_cache.block_tokens,
            step_tokens=self.step_tokens,
            threads=torch.get_num_threads(),
            adaptive_threads=self._adaptive is not None,
            thread_switches=self._adaptive.switches if self._adaptive else 0,
            other_processes_cores=round(self._adaptive.others, 3) if self._adaptive else None,
            dtype=str(self.dtype).removeprefix("torch."),
        )
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._abort_all = True
            self._lock.notify()
        self._thread.join(timeout=30)

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- scheduler thread ---------------------------------------------------------------------------------

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
                    self._prefill_step()
                    self._retire_finished()
                    if self._active:
                        self._decode_step()
                        self._retire_finished()
                except Exception as e:  # a crash fails the requests in flight, not the engine
                    self._fail_all(e)
                if closed and not self._active and not self._prefilling:
                    with self._lock:
                        for request in self._waiting:
                            self._finish(request, FinishReason.ABORT)
                        self._waiting.clear()
                    return

    def _apply_sync(self, sync: _WeightSync) -> None:
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

    def _prefill_step(self) -> None:
        """Spends this step's token budget (what the decode step leaves, at least one block) on prefill
        chunks, oldest request first; a request whose whole prompt is in its cache samples its first token
        and joins the decode batch."""
        budget = max(self.step_tokens - len(self._active), self.prefix_cache.block_tokens)
        while self._prefilling and budget > 0:
            request = self._prefilling[0]
            if request.aborted or request.result.done():
                self._prefilling.popleft()
                self._finish(request, FinishReason.ABORT)
                continue
            if request.prefill_cache is None:
                self._start_prefill(request)
            n = min(len(request.prompt) - request.cached, budget)
            logits = self._prefill_chunk(request, n)
            budget -= n
            if request.cached == len(request.prompt):
                self._prefilling.popleft()
                self._join_batch(request, logits)

    def _start_prefill(self, request: LocalRequest) -> None:
        """Its one-row KV cache, starting from the longest cached prefix of its prompt (matched now, not at
        admission, so that it finds what the requests ahead of it just computed)."""
        request.prefill_started_at = time.perf_counter()
        hit, prefix = self.prefix_cache.match(request.prompt)
        if prefix is None:
            prefix = torch.empty(self._kv_shape, dtype=self.dtype, device=self.device)
        request.prefill_cache = kv.new_cache(self.num_layers)
        kv.fill(request.prefill_cache, prefix.to(self.device), spare=len(request.prompt) - hit)
        request.cached = request.prefix_hit = hit
        request.blocks_in_prefix_cache = hit // self.prefix_cache.block_tokens
        request.kv_epoch = self.prefix_cache.epoch

    def _prefill_chunk(self, request: LocalRequest, n: int) -> torch.Tensor:
        """Computes the next `n` prompt tokens into the request's cache; returns the last one's logits."""
        start = time.perf_counter()
        done = request.cached
        out = self.model(
            input_ids=torch.tensor([request.prompt[done : done + n]], device=self.device),
            position_ids=torch.arange(done, done + n, device=self.device)[None],
            cache=request.prefill_cache,
            use_cache=True,
            logits_to_keep=1,
        )
        request.cached += n
        stats = self._stats
        stats.prefill_forward_s += time.perf_counter() - start
        stats.prefill_forward_tokens += n
        stats.prefill_flops += self._shape.flops(n, done, logits_rows=1)
        assert request.prefill_cache is not None
        self._share(request, request.prefill_cache, 0, 0)
        return out.logits[:, -1]

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

    def _decode_step(self) -> None:
        start = time.perf_counter()
        length = kv.cache_length(self._cache)
        rows = self._active
        pads = torch.tensor([length - r.cached for r in rows])
        columns = torch.arange(length + 1)
        mask = (columns[None, :] >= pads[:, None]).to(torch.long)
        ids = torch.tensor([[r.pending_token] for r in rows], device=self.device)
        positions = torch.tensor([[r.cached] for r in rows], device=self.device)
        out = self.model(
            input_ids=ids,
            attention_mask=mask.to(self.device),
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
        )
        self.steps += 1
        stats = self._stats
        for request in rows:
            stats.decode_flops += self._shape.flops(1, request.cached, logits_rows=1)
            request.cached += 1
        for request, token in zip(rows, sample(out.logits[:, -1], [r.row for r in rows]), strict=True):
            self._accept(request, token)
        stats.decode_forward_s += time.perf_counter() - start
        stats.decode_steps += 1
        stats.decode_row_tokens += len(rows)

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
