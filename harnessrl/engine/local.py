"""Local inference engine on transformers with continuous (step-level) batching.

One background thread owns the model. Each iteration it applies pending weight syncs and aborts, admits
waiting requests (prefill each alone, sample its first token, append its KV rows to the batch), then runs
ONE decode step for every active request together and samples each row with its own settings. Requests
therefore join and leave between steps, and a request's tokens never depend on its batch neighbours beyond
float noise: rows are left-padded and masked, and position ids are per row.

Just over 400 lines: the scheduling loop, its admission and its weight sync share the model thread's state;
request records and weight loading already live in local_requests.py and weights.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
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

from harnessrl.engine import kv
from harnessrl.engine.base import (
    DType,
    EngineError,
    FinishReason,
    Generation,
    GenerationDelta,
    SamplingParams,
)
from harnessrl.engine.local_requests import LocalRequest, validate_request
from harnessrl.engine.sampling import RowSampling, SampledToken, sample
from harnessrl.engine.weights import copy_weights, read_checkpoint

logger = logging.getLogger(__name__)

_TRIM_MIN_COLUMNS = 64  # drop shared left padding once it is at least this wide and a quarter of the batch


def default_threads() -> int:
    """Half the cores, at least 1, at most 8. torch's default (all cores) collapses under contention: OpenMP
    workers spin-wait, and on a 2-core machine shared with a gateway, sandboxes and a trainer one 8-row decode
    step measured 9x slower with 2 threads than with 1."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


@dataclass
class _WeightSync:
    state: dict[str, torch.Tensor]
    version: int
    done: Future


class LocalEngine:
    """`Engine` on a local transformers causal LM. Thread-safe; `generate` may be awaited from any event loop.

    - `max_batch`: most requests decoded together; more wait in a queue.
    - `threads`: torch CPU threads, set process-wide (None: `default_threads()`; 0: leave torch's setting).
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
    ) -> None:
        from harnessrl.tinymodel import load_model, load_tokenizer, tiny_model_dir

        self.model_dir = Path(model_dir) if model_dir else tiny_model_dir()
        if not (self.model_dir / "config.json").is_file():
            raise EngineError(f"{self.model_dir}: not a Hugging Face model directory (no config.json)")
        self.threads = default_threads() if threads is None else threads
        if self.threads > 0:  # 0: leave torch's setting alone
            torch.set_num_threads(self.threads)
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
        self.max_batch = max_batch
        self.policy_version = policy_version
        self.steps = 0  # decode steps run (for tests and metrics)

        self._lock = threading.Condition()
        self._waiting: deque[LocalRequest] = deque()
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
            return len(self._active) + len(self._waiting)

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
                    admitted = []
                    while self._waiting and len(self._active) + len(admitted) < self.max_batch:
                        admitted.append(self._waiting.popleft())
                    closed = self._closed
                for sync in syncs:
                    try:
                        copy_weights(self.model, sync.state)
                        self.policy_version = sync.version
                        logger.info("weights of version %d loaded", sync.version)
                        sync.done.set_result(None)
                    except Exception as e:  # reported to the caller that asked for the sync
                        sync.done.set_exception(EngineError(f"weight sync failed: {e}"))
                for request in self._active:
                    if abort_all or request.id in abort_ids:
                        request.aborted = True
                try:
                    for request in admitted:
                        self._prefill(request)
                    self._retire_finished()
                    if self._active:
                        self._decode_step()
                        self._retire_finished()
                except Exception as e:  # a crash fails the requests in flight, not the engine
                    self._fail_all(admitted, e)
                if closed and not self._active:
                    with self._lock:
                        for request in self._waiting:
                            self._finish(request, FinishReason.ABORT)
                        self._waiting.clear()
                    return

    def _prefill(self, request: LocalRequest) -> None:
        if request.aborted or request.result.done():
            self._finish(request, FinishReason.ABORT)
            return
        start = time.perf_counter()
        cache = kv.new_cache(self.num_layers)
        ids = torch.tensor([request.prompt], device=self.device)
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        request.cached = len(request.prompt)
        request.prefill_s = time.perf_counter() - start
        self._accept(request, sample(out.logits[:, -1], [request.row])[0])
        if request.result.done() or self._finished_reason(request):
            self._finish(request, self._finished_reason(request) or FinishReason.ABORT)
            return
        grown = kv.append_rows(self._cache, cache)
        del grown  # existing rows' padding is derived from the cache length; nothing else to update
        self._active.append(request)

    def _decode_step(self) -> None:
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
        for request in rows:
            request.cached += 1
        for request, token in zip(rows, sample(out.logits[:, -1], [r.row for r in rows]), strict=True):
            self._accept(request, token)

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
        keep: list[int] = []
        for i, request in enumerate(self._active):
            reason = FinishReason.ABORT if request.result.done() else self._finished_reason(request)
            if reason:
                self._finish(request, reason)
            else:
                keep.append(i)
        if len(keep) == len(self._active):
            return
        self._active = [self._active[i] for i in keep]
        if not self._active:
            self._cache = kv.new_cache(self.num_layers)
            return
        length = kv.cache_length(self._cache)
        shared_pad = length - max(r.cached for r in self._active)
        drop = shared_pad if shared_pad >= _TRIM_MIN_COLUMNS and shared_pad * 4 >= length else 0
        kv.select_rows(self._cache, keep, drop_left=drop)

    def _finish(self, request: LocalRequest, reason: FinishReason) -> None:
        if request.result.done():
            return
        with contextlib.suppress(Exception):  # the caller may have cancelled the future
            request.result.set_result(request.generation(reason, self.policy_version))
        self._notify_end(request)

    @staticmethod
    def _notify_end(request: LocalRequest) -> None:
        if request.listener is not None:
            with contextlib.suppress(RuntimeError):  # the consumer's event loop is closed
                request.listener(None)

    def _fail_all(self, admitted: list[LocalRequest], error: Exception) -> None:
        message = EngineError(f"local engine step failed: {type(error).__name__}: {error}")
        logger.error("%s (failing %d requests)", message, len(self._active) + len(admitted))
        for request in [*self._active, *admitted]:
            if not request.result.done():
                request.result.set_exception(message)
                self._notify_end(request)
        self._active = []
        self._cache = kv.new_cache(self.num_layers)
