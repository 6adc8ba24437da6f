"""A CPU stand-in for a vLLM OpenAI server, for tests of the vLLM weight-sync path (tests/engine/test_weight_sync*).

It serves the real tiny model on loopback and speaks the endpoints harnessrl uses as vLLM answers them:
`GET /v1/models` (`owned_by: "vllm"`), `GET /health`, `POST /v1/completions` (token ids and logprobs, plain
and SSE; no harnessrl version fields) and, only with dev mode on (vLLM's VLLM_SERVER_DEV_MODE=1),
`POST /collective_rpc`, `/reset_prefix_cache`, `/pause`, `/resume` and `GET /is_paused`. `/collective_rpc`
runs the named method on each worker as vLLM does: the worker is `FakeWorker`, which inherits the REAL
`WeightSyncExtension` (as `--worker-extension-cls` makes vLLM's worker do) and has the vLLM 0.32 worker API the
extension uses (`model_runner.get_model()`, `model_config`, `vllm_config`, `reload_weights(weights_iterator=...)`)
over the real model's plain parameters, so the weights generation uses really change.

The real vLLM (tests/engine/test_vllm_real.py, `make vllm`) is what shows that harnessrl works with vLLM; this
stand-in stays for what the real one cannot show fast or at all: the protocol's error paths in seconds (a server
without dev mode, an update that fails after weights started changing: `FakeWorker.break_reload`), replicas
pulling an `s3://` checkpoint, a sync in the middle of a request on a slowed-down engine. What is not vLLM: generation is a plain loop (one token per forward,
its own key/value cache per request, which `reset_prefix_cache?reset_running_requests=true` drops so the
request recomputes on the new weights, as vLLM's preemption does), and the broadcast group runs over gloo on
the CPU (the extension builds it with the same code as over nccl; the worker's `rank` is 0, one worker).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from aiohttp import web

from harnessrl.engine.vllm_worker import WeightSyncExtension
from harnessrl.tinymodel import load_model, load_tokenizer


class VLLMModelAPI:
    """The served model with vLLM's weight-loading API: names not in the model raise KeyError (vLLM's
    `params_dict[name]`); a tied lm_head is skipped (vLLM's Llama does the same)."""

    def __init__(self, hf_model: torch.nn.Module) -> None:
        self.hf = hf_model
        config = getattr(hf_model, "config", None)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))

    def named_parameters(self) -> Iterable[tuple[str, torch.nn.Parameter]]:
        return self.hf.named_parameters()

    def modules(self) -> Iterable[torch.nn.Module]:
        return self.hf.modules()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.hf.named_parameters())
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in weights:
                if self.tied and name == "lm_head.weight":
                    continue
                params[name].copy_(tensor)
                loaded.add(name)
        return loaded


class ModelRunner:
    def __init__(self, model: VLLMModelAPI) -> None:
        self.model = model

    def get_model(self) -> VLLMModelAPI:
        return self.model


class PlainWorker:
    """vLLM's worker without an extension: what `WeightSyncExtension` uses of vLLM 0.32's `Worker`."""

    def __init__(self, hf_model: torch.nn.Module, model_dir: str | Path) -> None:
        self.model_runner = ModelRunner(VLLMModelAPI(hf_model))
        self.device = torch.device("cpu")
        self.rank = 0  # vLLM's WorkerBase: the worker's rank within the engine (tensor parallel size 1 here)
        self.model_config = SimpleNamespace(
            model=str(model_dir), revision=None, hf_text_config=hf_model.config
        )
        self.vllm_config = SimpleNamespace(load_config=SimpleNamespace(download_dir=None))
        self.break_reload = (
            False  # the next reload fails half-way (an update that fails after weights changed)
        )

    def reload_weights(
        self, weights_iterator: Iterable[tuple[str, torch.Tensor]], is_checkpoint_format: bool = True
    ) -> None:
        """vLLM's in-place reload, on plain parameters: every tensor through the model's `load_weights`."""
        assert is_checkpoint_format
        weights: Iterable[tuple[str, torch.Tensor]] = weights_iterator
        if self.break_reload:
            self.break_reload = False
            weights = list(weights_iterator)
            self.model_runner.model.load_weights(weights[: len(weights) // 2])
            raise RuntimeError("the stand-in's reload broke off half-way")
        self.model_runner.model.load_weights(weights)


class FakeWorker(PlainWorker, WeightSyncExtension):
    """vLLM's worker with `--worker-extension-cls harnessrl.engine.vllm_worker.WeightSyncExtension`."""


class FakeVLLM:
    """`await FakeVLLM(model_dir).start()` → its URL. `dev_mode=False`: no control endpoints (404);
    `extension=False`: the worker lacks the extension (collective_rpc answers 500); `token_delay_s`: a pause
    after each sampled token."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dev_mode: bool = True,
        extension: bool = True,
        served_model_name: str = "tiny",
        token_delay_s: float = 0.0,
    ) -> None:
        self.hf = load_model(model_dir).eval()
        self.tokenizer = load_tokenizer(model_dir)
        self.worker = (FakeWorker if extension else PlainWorker)(self.hf, model_dir)
        self.dev_mode = dev_mode
        self.name = served_model_name
        self.token_delay_s = token_delay_s  # a slower engine: time for a sync in the middle of a request
        self.calls: list[str] = []  # control calls in order ("/pause?mode=keep", "/collective_rpc:<method>")
        self.sampled = 0  # tokens sampled so far (tests wait on it)
        self._lock: asyncio.Lock  # a forward pass and a weight update never overlap
        self._running: asyncio.Event  # cleared while paused
        self._epoch = 0  # bumped when running requests must recompute their keys/values
        eos = self.tokenizer.eos_token_id
        self.stop_ids = {int(eos)} if eos is not None else set()

    # ---- server ---------------------------------------------------------------------------------------

    async def start(self) -> str:
        self._lock, self._running = asyncio.Lock(), asyncio.Event()
        self._running.set()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.completions)
        if self.dev_mode:
            app.router.add_post("/collective_rpc", self.collective_rpc)
            app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            app.router.add_post("/pause", self.pause)
            app.router.add_post("/resume", self.resume)
            app.router.add_get("/is_paused", self.is_paused)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "vllm"}
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # ---- dev endpoints, as vLLM's serve/dev routers answer them ----------------------------------------

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        method = body.get("method")
        if method is None:
            return _error("Missing 'method' in request body", 400)
        self.calls.append(f"/collective_rpc:{method}")
        args, kwargs = tuple(body.get("args", [])), body.get("kwargs", {})
        results = []
        async with self._lock:
            try:
                function = getattr(self.worker, method)  # vLLM's worker: AttributeError for a missing one
                results.append(await asyncio.to_thread(function, *args, **kwargs))
            except (
                Exception
            ) as e:  # vLLM 0.32 answers HTTP 500 with the worker's error (and resets the connection)
                message = (
                    f"Call to collective_rpc method failed: Worker failed with error '{e}', please check the stack "
                    "trace above for the root cause"
                )
                return _error(message, 500)
        answers = [r if r is None or isinstance(r, dict | list) else str(r) for r in results]
        return web.json_response({"results": answers})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.calls.append(f"/reset_prefix_cache?{request.query_string}")
        if request.query.get("reset_running_requests") == "true":
            self._epoch += 1
        return web.json_response({"success": True})  # vLLM 0.32's answer

    async def pause(self, request: web.Request) -> web.Response:
        self.calls.append(f"/pause?{request.query_string}")
        if request.query.get("mode", "abort") != "keep":
            return _error("this stand-in implements mode=keep only", 400)
        self._running.clear()
        async with self._lock:  # returns once no forward pass is running
            pass
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.calls.append("/resume")
        self._running.set()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": not self._running.is_set()})

    # ---- generation ------------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["prompt"]
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            return _error("this stand-in takes prompts as token ids", 400)
        stops = self.stop_ids | set(body.get("stop_token_ids") or [])
        tokens = self._sample(
            prompt,
            int(body.get("max_tokens", 16)),
            float(body.get("temperature", 1.0)),
            float(body.get("top_p", 1.0)),
            body.get("seed"),
            stops,
        )
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if not body.get("stream"):
            ids, lps = [], []
            async for token, lp in tokens:
                ids.append(token)
                lps.append(lp)
            finish = "stop" if ids and ids[-1] in stops else "length"
            choice = self._choice(ids, lps, finish, prompt)
            return web.json_response(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": self.name,
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": len(ids),
                        "total_tokens": len(prompt) + len(ids),
                    },
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        first, count, max_tokens = True, 0, int(body.get("max_tokens", 16))
        async for token, lp in tokens:
            count += 1
            finish = "stop" if token in stops else "length" if count == max_tokens else None
            choice = self._choice([token], [lp], finish, prompt if first else None)
            first = False
            chunk = {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": self.name,
                "choices": [choice],
                "usage": None,
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _choice(self, ids: list[int], lps: list[float], finish: str | None, prompt: list[int] | None) -> dict:
        return {
            "index": 0,
            "text": self.tokenizer.decode(ids),
            "logprobs": {
                "text_offset": [],
                "token_logprobs": [max(lp, -9999.0) for lp in lps],
                "tokens": [self.tokenizer.decode([t]) for t in ids],
                "top_logprobs": None,
            },
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": ids,
            "prompt_token_ids": prompt,
        }

    async def _sample(
        self, prompt: list[int], max_tokens: int, temperature: float, top_p: float, seed: Any, stops: set[int]
    ) -> AsyncIterator[tuple[int, float]]:
        generator = torch.Generator().manual_seed(seed if isinstance(seed, int) else secrets.randbits(62))
        ids, cache, epoch = list(prompt), None, self._epoch
        for _ in range(max_tokens):
            await self._running.wait()  # paused with mode=keep: the request waits here, its state kept
            async with self._lock:
                if epoch != self._epoch:  # preempted by a prefix cache reset: recompute on the new weights
                    cache, epoch = None, self._epoch
                feed = ids if cache is None else ids[-1:]
                token, lp, cache = await asyncio.to_thread(
                    self._step, feed, cache, temperature, top_p, generator
                )
            ids.append(token)
            self.sampled += 1
            yield token, lp
            await asyncio.sleep(self.token_delay_s)
            if token in stops:
                return

    @torch.no_grad()
    def _step(
        self, feed: list[int], cache: Any, temperature: float, top_p: float, generator: torch.Generator
    ) -> tuple[int, float, Any]:
        out = self.hf(input_ids=torch.tensor([feed]), cache=cache, use_cache=True)
        logits = out.logits[0, -1].float()
        if temperature == 0:
            logprobs = torch.log_softmax(logits, -1)
            token = int(torch.argmax(logprobs))
            return token, float(logprobs[token]), out.cache
        logprobs = torch.log_softmax(logits / temperature, -1)
        if top_p < 1.0:
            sorted_lp, order = torch.sort(logprobs, descending=True)
            keep = torch.cumsum(sorted_lp.exp(), -1) - sorted_lp.exp() < top_p
            masked = torch.full_like(logprobs, float("-inf"))
            masked[order[keep]] = logprobs[order[keep]]
            logprobs = torch.log_softmax(masked, -1)
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
        return token, float(logprobs[token]), out.cache


def miniature_model(directory: Path, seed: int = 0) -> Path:
    """A 2-layer Llama with the tiny model's tokenizer (13 MB): for tests whose point is not the model, where
    the tiny model's 540 MB (a store round trip, an optimizer step on a busy 2-core machine) costs a minute."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _error(message: str, status: int) -> web.Response:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status=status
    )
