"""Local inference engine on torch: continuous (step-level) batching, chunked prefill and automatic
prefix caching. This module is the engine's public side (requests in, generations and streams out, weight
syncs, aborts, stats); the scheduler thread that runs the model is `local_scheduler.py`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import secrets
import threading
import uuid
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.engine.base import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_PREFIX_CACHE_MB,
    DEFAULT_SPECULATIVE_TOKENS,
    DEFAULT_STEP_TOKENS,
    DType,
    EngineError,
    EngineStats,
    Generation,
    GenerationDelta,
    InProcessEngine,
    ModelImpl,
    SamplingParams,
    StreamingEngine,
    WeightSyncMode,
    WeightSyncUnsupported,
)
from harnessrl.engine.local_requests import LocalRequest, validate_request
from harnessrl.engine.local_scheduler import SchedulerLoop, WeightSync
from harnessrl.engine.local_stats import EngineCounters, ModelShape
from harnessrl.engine.packed import StepForward
from harnessrl.engine.prefix_cache import PrefixCache
from harnessrl.engine.sampling import RowSampling
from harnessrl.engine.speculative import DraftRecord
from harnessrl.engine.threads import AdaptiveThreads, engine_cores
from harnessrl.engine.weights import check_state, read_tensors

if TYPE_CHECKING:
    from harnessrl.train.lora import Adapter

logger = logging.getLogger(__name__)

_open_engines: weakref.WeakSet[LocalEngine] = weakref.WeakSet()


@atexit.register
def _close_open_engines() -> None:
    """Stops every engine's scheduler thread before the interpreter finalizes. A daemon thread still running
    then is ended by CPython from inside whatever it was doing, torch code included, and unwinding out of
    torch's tensor deallocation aborts the process ("terminate called without an active exception", or a
    segfault): measured 4 of 6 exits of a process that made one request and never closed its engine."""
    for engine in list(_open_engines):
        engine.close()


class LocalEngine(SchedulerLoop, StreamingEngine, InProcessEngine):
    """`Engine` on a local Hugging Face causal LM. Thread-safe; `generate` may be awaited from any event loop.

    - `max_batch`: most requests in flight together (prefilling or decoding); more wait in a queue.
    - `threads`: torch CPU threads, set process-wide. None: adaptive — all the engine's cores while other
      processes leave them idle, 1 while they do not (`threads.AdaptiveThreads`); 0: leave torch's setting.
    - `prefix_cache_mb`: memory budget of the prefix cache (None: 1024; 0 turns it off); `block_tokens`: its
      block size.
    - `step_tokens`: tokens one scheduler step computes: one per decoding request plus prefill chunks.
    - `speculative_tokens`: prompt-lookup drafts a decoding request may feed per step (`speculative.py`;
      0 turns speculative decoding off). Exact: the tokens, and their logprobs, are the model's.
    - Default stop tokens: the tokenizer's eos and `<|im_end|>`; `stop_token_ids` adds to them (as in vLLM).
      The stop token is included in `token_ids` (it was sampled, so it is trainable).
    - `finish_reason`: a `FinishReason` (stop token, max_tokens or a full context, abort).
    - `dtype`: the weights' (and keys/values') format; `auto`: float32 or bfloat16, whichever this host
      multiplies faster at the model's shapes (`harnessrl.numformat`: measured once per host, cached).
    - `model_impl`: the engine's own forward pass for Llama-family checkpoints (`llama.py`; no transformers
      import, ~2.6 s less to start) or transformers' model (`hf_forward.py`); `auto` takes the first that
      serves the checkpoint.
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
        speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS,
        model_impl: ModelImpl = ModelImpl.AUTO,
    ) -> None:
        from harnessrl.tinymodel import tiny_model_dir

        self.model_dir = Path(model_dir) if model_dir else tiny_model_dir()
        if not (self.model_dir / "config.json").is_file():
            raise EngineError(f"{self.model_dir}: not a Hugging Face model directory (no config.json)")
        self._adaptive = AdaptiveThreads(engine_cores()) if threads is None else None
        if threads:  # 0: leave torch's setting alone
            torch.set_num_threads(threads)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = _load_tokenizer(self.model_dir)
        dtype = _resolve_dtype(DType(dtype), self.model_dir, self.device)
        served = _load_model(self.model_dir, ModelImpl(model_impl), dtype, self.device)
        self.model, self._forward, self.model_impl = served.model, served.forward, served.impl
        config = served.config
        self.num_layers = int(config.num_hidden_layers)
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 1 << 30)
        self.vocab_size = int(config.vocab_size)
        self.default_stop = self._default_stop_ids()
        prefix_cache_mb = DEFAULT_PREFIX_CACHE_MB if prefix_cache_mb is None else prefix_cache_mb
        if (
            max_batch < 1
            or step_tokens < 1
            or block_tokens < 1
            or prefix_cache_mb < 0
            or speculative_tokens < 0
        ):
            raise EngineError(
                "need max_batch, step_tokens and block_tokens >= 1, prefix_cache_mb and speculative_tokens >= 0, "
                f"got {max_batch}, {step_tokens}, {block_tokens}, {prefix_cache_mb} and {speculative_tokens}"
            )
        self.max_batch = max_batch
        self.step_tokens = step_tokens
        self.speculative_tokens = speculative_tokens
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
        self._stats = EngineCounters(prefix_cache=self.prefix_cache.stats)

        self._lock = threading.Condition()
        self._waiting: deque[LocalRequest] = deque()
        self._prefilling: deque[LocalRequest] = deque()
        self._syncs: deque[WeightSync] = deque()
        self._adapter_base: dict[str, torch.Tensor] | None = None  # load_adapter_sync's base weights
        self._release = False  # asked: free what the next sync makes again (release_until_sync)
        self._released = False  # freed, and no sync since
        self._abort_ids: set[str] = set()
        self._abort_all = False
        self._active: list[LocalRequest] = []
        self._drafted = {greedy: DraftRecord() for greedy in (True, False)}
        self._reset_batch()
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="harnessrl-engine", daemon=True)
        self._thread.start()
        _open_engines.add(self)

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
            self.abort_requests([request.id])  # the caller went away: free the batch slot
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
                self.abort_requests([request.id])

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

    async def abort(self, request_ids: list[str] | None = None) -> bool:
        self.abort_requests(request_ids)
        return True

    def abort_requests(self, request_ids: list[str] | None = None) -> None:
        """Aborts the given requests (all in flight and queued if None); they finish with "abort" and the
        tokens sampled so far. Returns at once (thread-safe)."""
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
        self.load_state_sync(read_tensors(Path(checkpoint_dir)), version)

    def load_state_sync(self, state: dict[str, torch.Tensor], version: int) -> None:
        """The same swap from tensors in memory (checked against the model: `weights.check_state`), e.g.
        received by broadcast (`harnessrl engine serve`'s `/receive_weights`)."""
        check_state(self.model, state, f"weights of version {version}")
        self._adapter_base = None  # new base weights
        self._sync(state, version)

    def load_adapter_sync(self, adapter: Adapter, version: int) -> None:
        """Merged per version: each adapted weight is computed once here (from a copy of its base weight, kept
        at the first adapter) and copied in like any weight sync, so decoding costs what it costs without
        LoRA; the copy holds the adapted weights once more in the engine's format."""
        params = dict(self.model.named_parameters())
        unknown = sorted(set(adapter.pairs) - set(params))
        if unknown:
            raise EngineError(
                f"adapter of version {version}: {len(unknown)} weights the served model does not have, e.g. "
                f"{unknown[:3]}"
            )
        if self._adapter_base is None:
            self._adapter_base = {name: params[name].detach().clone() for name in adapter.pairs}
        if set(adapter.pairs) != set(self._adapter_base):
            raise EngineError(
                f"adapter of version {version} adapts other weights than the first adapter this engine took"
            )
        for name, base in self._adapter_base.items():
            a, b = adapter.pairs[name]
            if (b.shape[0], a.shape[1]) != tuple(base.shape):
                raise EngineError(
                    f"adapter of version {version}: {name} gets a {(b.shape[0], a.shape[1])} update, the served "
                    f"weight is {tuple(base.shape)}"
                )
        self._sync({name: adapter.merge(name, base) for name, base in self._adapter_base.items()}, version)

    def _sync(self, state: dict[str, torch.Tensor], version: int) -> None:
        sync = WeightSync(state, int(version), Future())
        with self._lock:
            if self._closed:
                raise EngineError("engine is closed")
            self._syncs.append(sync)
            self._lock.notify()
        sync.done.result()

    def release_until_sync(self) -> None:
        with self._lock:
            self._release = True
            self._lock.notify()

    async def check_weight_sync(self, mode: WeightSyncMode = WeightSyncMode.CHECKPOINT) -> None:
        if mode is WeightSyncMode.BROADCAST:
            raise WeightSyncUnsupported(
                "the in-process LocalEngine cannot join a weight broadcast (it shares the trainer's process); "
                "use --weight-sync checkpoint, or serve it (harnessrl engine serve, or vLLM with the worker "
                "extension) and pass --engine-url"
            )

    async def load_adapter(self, adapter_dir: str, version: int) -> None:
        from harnessrl.train.lora import Adapter

        try:
            adapter = Adapter.load(Path(adapter_dir))
        except ValueError as e:
            raise EngineError(f"adapter of version {version}: {e}") from None
        await asyncio.get_running_loop().run_in_executor(None, self.load_adapter_sync, adapter, version)

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        await asyncio.get_running_loop().run_in_executor(
            None, self.load_weights_sync, checkpoint_dir, version
        )

    def inflight(self) -> int:
        with self._lock:
            return len(self._active) + len(self._prefilling) + len(self._waiting)

    async def stats(self) -> EngineStats:
        return self.snapshot()

    async def context_length(self) -> int:
        return self.max_context

    def snapshot(self) -> EngineStats:
        """Counters since start (thread-safe, at once): requests, queue/prefill/decode seconds (also per
        request), forward-pass seconds and FLOPs of prefill and decode, the prefix cache's hits
        (`prefix_cache_hit_rate`); every figure in `.figures`."""
        out = self._stats.as_dict()
        out.update(
            prefix_cache_blocks=self.prefix_cache.blocks,
            prefix_cache_capacity_blocks=self.prefix_cache.capacity_blocks,
            block_tokens=self.prefix_cache.block_tokens,
            step_tokens=self.step_tokens,
            speculative_tokens=self.speculative_tokens,
            threads=torch.get_num_threads(),
            adaptive_threads=self._adaptive is not None,
            thread_switches=self._adaptive.switches if self._adaptive else 0,
            other_processes_cores=round(self._adaptive.others, 3) if self._adaptive else None,
            dtype=str(self.dtype).removeprefix("torch."),
            model_impl=str(self.model_impl),
        )
        return EngineStats.from_figures(out)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._abort_all = True
            self._lock.notify()
        self._thread.join(timeout=30)
        _open_engines.discard(self)

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class ServedModel:
    model: torch.nn.Module  # parameters named as in the checkpoint (weight syncs copy into them)
    config: Any  # its shape: num_hidden_layers, hidden_size, vocab_size, ... (transformers' names)
    forward: StepForward
    impl: ModelImpl


def _resolve_dtype(dtype: DType, model_dir: Path, device: torch.device) -> DType:
    """`auto`: the format this host multiplies faster at the model's shapes (`harnessrl.numformat`, cached)."""
    if dtype is not DType.AUTO:
        return dtype
    import json
    from types import SimpleNamespace

    from harnessrl import numformat

    config = SimpleNamespace(**json.loads((model_dir / "config.json").read_text()))
    return DType(numformat.resolve(DType.AUTO, "engine", config, device))


def _load_model(model_dir: Path, impl: ModelImpl, dtype: DType, device: torch.device) -> ServedModel:
    from harnessrl.engine import llama

    config = llama.read_config(model_dir)
    if impl is ModelImpl.NATIVE and isinstance(config, str):
        raise EngineError(
            f"{model_dir}: model_impl=native does not serve this checkpoint ({config}); "
            "use model_impl=auto or transformers"
        )
    if impl is not ModelImpl.TRANSFORMERS and not isinstance(config, str):
        model = llama.load(model_dir, config, getattr(torch, dtype), device)
        return ServedModel(model, config, model.step, ModelImpl.NATIVE)
    if isinstance(config, str):
        logger.info(
            "%s: served by transformers' model (the native forward pass does not: %s)", model_dir, config
        )
    from harnessrl.engine import hf_forward

    forward = hf_forward.load(model_dir, dtype, device)
    return ServedModel(forward.model, forward.model.config, forward.step, ModelImpl.TRANSFORMERS)


def _load_tokenizer(model_dir: Path) -> Any:
    """The light tokenizer (`tokenizers` + jinja2, no transformers import) where the directory has a
    `tokenizer.json` and a chat template; transformers' tokenizer otherwise."""
    from harnessrl.light_tokenizer import LightTokenizer, MissingTokenizerFile

    try:
        return LightTokenizer(model_dir)
    except MissingTokenizerFile as e:
        logger.info("%s; loading transformers' tokenizer", e)
        from harnessrl.tinymodel import load_tokenizer

        return load_tokenizer(model_dir)
