"""`harnessrl engine serve`: the local engine behind a vLLM-compatible token API (aiohttp).

Endpoints
- `POST /v1/completions`   vLLM CompletionRequest subset: `prompt` (token ids, or a string that is
                            tokenized), `max_tokens`, `temperature`, `top_p`, `seed`, `stop_token_ids`,
                            `logprobs`, `return_token_ids`, `skip_special_tokens`, `n` (=1), `stream` (SSE chunks as vLLM sends them; `logprobs` 0 only).
                            Header `X-Request-Id` names the request for `/abort`.
- `GET  /health`, `GET /v1/models`
- `GET  /stats`  (ours) the engine's counters: prefix cache hit rate, prefill/decode seconds and FLOP/s
- `POST /load_weights {"path", "version"}` (ours; vLLM: `/collective_rpc` + harnessrl's worker extension);
  `GET /load_weights` says the server takes weights (`{"policy_version", "receives"}`; asked by
  ensure_weight_sync)
- `POST /load_adapter {"path", "version"}` (ours): a LoRA adapter (PEFT's layout) merged onto the base weights
- `POST /init_broadcast {"master_address", "master_port", "rank_offset", "world_size", "backend"}` (ours): join
  the trainer's weight broadcast group (rank `rank_offset`); answers once every rank has joined
- `POST /receive_weights {"version"[, "lora_rank", "lora_alpha"]}` (ours): receive one update by broadcast (with
  the LoRA fields: an adapter's tensors, merged onto the base weights), apply it between two decode steps (prefix
  cache flushed); answers once applied (`{"policy_version", "tensors"}`)
- `POST /abort {"request_ids": [...]}` or `{}` for all (ours; vLLM aborts when the client disconnects)
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from harnessrl.engine.base import EngineError, EngineRequestError, SamplingParams
from harnessrl.engine.completions_api import build_response, build_stream_chunk, error_body
from harnessrl.engine.local import LocalEngine
from harnessrl.engine.vllm_worker import RECEIVES, BroadcastInit, ReceiveRequest, WeightSyncRequestError
from harnessrl.engine.weights import check_state

logger = logging.getLogger(__name__)

ENGINE_KEY = web.AppKey("engine", LocalEngine)
MODEL_NAME_KEY = web.AppKey("model_name", str)
GROUP_KEY = web.AppKey("weight_group", dict)  # {"group": the broadcast WeightGroup once joined}


def _error(message: str, status: int) -> web.Response:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return web.json_response(error_body(message, status, kind), status=status)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise web.HTTPBadRequest(
            text=json.dumps(error_body(f"request body is not JSON: {e}", 400)),
            content_type="application/json",
        ) from e
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps(error_body("request body must be a JSON object", 400)),
            content_type="application/json",
        )
    return body


def _prompt_ids(body: dict[str, Any], tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special_tokens=False)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of one prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    raise ValueError(
        "`prompt` must be a non-empty list of token ids (or a string); batches of several "
        "prompts are not supported: send one request per prompt"
    )


def _number(body: dict[str, Any], name: str, default, kind=float):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"`{name}` must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"`{name}` must be an integer, got {value!r}")
    return kind(value)


async def completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await _json(request)
    try:
        if body.get("n", 1) != 1:
            raise ValueError("`n` must be 1: send one request per sample")
        prompt = _prompt_ids(body, engine.tokenizer)
        max_tokens = _number(body, "max_tokens", 16, int)
        sampling = SamplingParams(
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            seed=_number(body, "seed", None, int),
        )
        stop = body.get("stop_token_ids") or []
        if not isinstance(stop, list) or not all(isinstance(t, int) for t in stop):
            raise ValueError("`stop_token_ids` must be a list of integers")
        top_k = body.get("logprobs")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 0 or top_k > 20):
            raise ValueError("`logprobs` must be an integer in [0, 20]")
        if body.get("stream") and top_k:
            raise ValueError("`logprobs` > 0 (top alternatives) is not supported with `stream: true`; use 0")
    except ValueError as e:
        return _error(str(e), 400)
    request_id = request.headers.get("X-Request-Id") or f"cmpl-{uuid.uuid4().hex}"
    if body.get("stream"):
        return await _stream(request, engine, body, prompt, sampling, max_tokens, stop, request_id)
    try:
        generation = await engine.generate(
            prompt, sampling, max_tokens, stop, request_id=request_id, top_logprobs=top_k or 0
        )
    except EngineRequestError as e:
        return _error(str(e), 400)
    except EngineError as e:
        return _error(str(e), 500)
    reply = build_response(generation, prompt, request.app[MODEL_NAME_KEY], engine.tokenizer, body, stop)
    return web.json_response(reply)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _stream(
    request: web.Request,
    engine: LocalEngine,
    body: dict[str, Any],
    prompt: list[int],
    sampling: SamplingParams,
    max_tokens: int,
    stop: list[int],
    request_id: str,
) -> web.StreamResponse:
    """vLLM-style SSE: one chunk per decode step, text decoded incrementally (an incomplete UTF-8 character
    is held back until its last token arrives), then `data: [DONE]`. Errors after the headers went out are
    sent as a `data: {"error": ...}` chunk, as vLLM does."""
    skip_special = bool(body.get("skip_special_tokens", True))
    model, created = request.app[MODEL_NAME_KEY], int(time.time())
    stream = engine.generate_stream(prompt, sampling, max_tokens, stop, request_id=request_id)
    try:
        first = await stream.__anext__()  # request errors still get a plain HTTP 400
    except EngineRequestError as e:
        return _error(str(e), 400)
    except EngineError as e:
        return _error(str(e), 500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    ids: list[int] = []
    sent = ""
    delta = first
    try:
        while True:
            ids += delta.token_ids
            text = engine.tokenizer.decode(ids, skip_special_tokens=skip_special)
            if delta.finish_reason is None and text.endswith("\ufffd"):
                text = text.rstrip("\ufffd")
            piece = text[len(sent) :] if text.startswith(sent) else ""
            sent = text if text.startswith(sent) else sent
            chunk = build_stream_chunk(
                delta,
                piece,
                request_id,
                created,
                model,
                body,
                None if first is None else prompt,
                engine.policy_version,
            )
            first = None
            await resp.write(_sse(chunk))
            if delta.finish_reason is not None:
                break
            delta = await stream.__anext__()
    except EngineError as e:
        await resp.write(_sse(error_body(str(e), 500, "InternalServerError")))
    finally:
        await stream.aclose()
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response(
        {"status": "ok", "policy_version": engine.policy_version, "inflight": engine.inflight()}
    )


async def stats(request: web.Request) -> web.Response:
    reported = await request.app[ENGINE_KEY].stats()
    return web.json_response(dict(reported.figures))


async def models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    name = request.app[MODEL_NAME_KEY]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "owned_by": "harnessrl",
                    "root": str(engine.model_dir),
                    "max_model_len": engine.max_context,
                    "policy_version": engine.policy_version,
                }
            ],
        }
    )


async def load_weights(request: web.Request) -> web.Response:
    return await _load(request, "checkpoint dir", lambda engine: engine.load_weights)


async def load_adapter(request: web.Request) -> web.Response:
    return await _load(request, "PEFT adapter dir", lambda engine: engine.load_adapter)


async def _load(
    request: web.Request, what: str, method: Callable[[LocalEngine], Callable[[str, int], Awaitable[None]]]
) -> web.Response:
    """`{"path", "version"}` into the engine by `method` (its weights, or a LoRA adapter over them)."""
    engine = request.app[ENGINE_KEY]
    body = await _json(request)
    path, version = body.get("path"), body.get("version")
    if not isinstance(path, str) or not isinstance(version, int) or isinstance(version, bool):
        return _error(f'body must be {{"path": "<{what}>", "version": <int>}}', 400)
    try:
        await method(engine)(path, version)
    except EngineError as e:
        return _error(str(e), 400)
    return web.json_response({"status": "ok", "policy_version": engine.policy_version})


async def weight_sync_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return web.json_response({"policy_version": engine.policy_version, "receives": list(RECEIVES)})


async def init_broadcast(request: web.Request) -> web.Response:
    from harnessrl.engine.broadcast import BroadcastError, WeightGroup

    try:
        init = BroadcastInit.from_json(json.dumps(await _json(request)))
    except WeightSyncRequestError as e:
        return _error(str(e), 400)
    holder = request.app[GROUP_KEY]
    old = holder.pop("group", None)
    if old is not None:
        old.close()
    engine = request.app[ENGINE_KEY]
    try:
        holder["group"] = await asyncio.to_thread(
            WeightGroup,
            init.master_address,
            init.master_port,
            init.rank_offset,
            init.world_size,
            init.backend,
            engine.device,
        )
    except (BroadcastError, RuntimeError, ValueError) as e:  # torch's store/rendezvous errors
        return _error(f"cannot join the weight broadcast group: {e}", 500)
    return web.json_response({"rank": init.rank_offset, "world_size": init.world_size})


async def receive_weights(request: web.Request) -> web.Response:
    from harnessrl.engine.broadcast import BroadcastError
    from harnessrl.engine.broadcast import receive_weights as receive

    try:
        req = ReceiveRequest.from_json(json.dumps(await _json(request)))
    except WeightSyncRequestError as e:
        return _error(str(e), 400)
    version = req.version
    group = request.app[GROUP_KEY].get("group")
    if group is None:
        return _error("no weight broadcast group: POST /init_broadcast first", 409)
    engine = request.app[ENGINE_KEY]
    try:  # the whole update is received before it is checked, so the sender never blocks on this engine
        state = await asyncio.to_thread(lambda: dict(receive(group, str(version))))
        if req.adapter:
            adapter = req.received_adapter(state.items(), f"broadcast adapter of version {version}")
            await asyncio.to_thread(engine.load_adapter_sync, adapter, version)
        else:
            check_state(engine.model, state, "broadcast")
            await asyncio.to_thread(engine.load_state_sync, state, version)
    except (EngineError, ValueError) as e:
        return _error(str(e), 400)
    except (BroadcastError, RuntimeError) as e:
        return _error(f"weight broadcast failed: {e}", 500)
    return web.json_response({"policy_version": engine.policy_version, "tensors": len(state)})


async def abort(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _json(request) if request.can_read_body else {}
    ids = body.get("request_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        return _error('body must be {"request_ids": ["..."]} or {} to abort everything', 400)
    await engine.abort(ids)
    return web.json_response({"status": "ok", "aborted": "all" if ids is None else ids})


def build_app(engine: LocalEngine, model_name: str | None = None) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[ENGINE_KEY] = engine
    app[MODEL_NAME_KEY] = model_name or Path(engine.model_dir).name
    app[GROUP_KEY] = {}
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/load_weights", load_weights)
    app.router.add_get("/load_weights", weight_sync_info)
    app.router.add_post("/load_adapter", load_adapter)
    app.router.add_post("/init_broadcast", init_broadcast)
    app.router.add_post("/receive_weights", receive_weights)
    app.router.add_post("/abort", abort)
    return app


async def serve(
    engine: LocalEngine,
    host: str,
    port: int,
    model_name: str | None = None,
    ready: asyncio.Future | None = None,
) -> None:
    """Runs until cancelled. `ready` (if given) receives the listening URL (the real port when `port` is 0)."""
    runner = web.AppRunner(build_app(engine, model_name), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    url = f"http://{host}:{bound}"
    logger.info("listening on %s", url)
    if ready is not None:
        ready.set_result(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
