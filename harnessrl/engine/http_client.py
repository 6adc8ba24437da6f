"""`HTTPEngine`: the `Engine` interface over a vLLM-compatible `/v1/completions` token API.

The same client talks to `harnessrl engine serve` and to a real vLLM OpenAI server (>= 0.10.2, the first
release with `return_token_ids`; checked against the v0.11 protocol). vLLM is never imported here.

Weight sync (`load_weights`) speaks each server's protocol (`WeightSyncProtocol`, told apart by `/v1/models`'
`owned_by`): ours is `POST /load_weights`; a vLLM server is paused (`/pause?mode=keep`: requests in flight
freeze), loads through the harnessrl worker extension (`/collective_rpc`), flushes its prefix cache
(`/reset_prefix_cache`) and resumes. vLLM reports no policy version, so against vLLM `generate` streams and
tags each token with the version this client had when the token arrived; the version moves on just before
`/resume`, so tokens sampled before the sync and after it are tagged apart (as LocalEngine tags them).
By broadcast (`init_weight_broadcast` once, `receive_weights_broadcast` per sync, while the trainer sends):
ours is `POST /init_broadcast` and `POST /receive_weights`; vLLM the extension's methods, paused as above.
Where vLLM answers differently from ours (checked against vLLM 0.32 CPU, tests/engine/test_vllm_*.py): abort is
`POST /abort_requests` with vLLM's request ids (`cmpl-<X-Request-Id>-0`); top alternatives are asked for as token
ids (`return_tokens_as_token_ids`: its `top_logprobs` are keyed "token_id:N"); a stream's cached prompt tokens
come in a last usage chunk (`stream_options.include_usage`); its figures are Prometheus `/metrics`
(`vllm_metrics.py`).
The weight-sync client stays in this module (which makes it ~510 lines) because the protocol it finds decides
how `generate` tags versions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp

from harnessrl.engine.base import (
    BroadcastEngine,
    EngineError,
    EngineRequestError,
    EngineStats,
    EngineUnreachable,
    Generation,
    GenerationDelta,
    SamplingParams,
    StreamingEngine,
    WeightSyncMode,
    WeightSyncUnsupported,
)
from harnessrl.engine.completions_api import (
    build_request,
    cached_prompt_tokens,
    parse_response,
    parse_stream_chunk,
)
from harnessrl.engine.vllm_metrics import VLLMFigures
from harnessrl.engine.vllm_worker import (
    EXTENSION,
    FAILED_UPDATE,
    INFO,
    INIT_BROADCAST,
    LOAD,
    LOAD_ADAPTER,
    PROTOCOL,
    RECEIVE,
    BroadcastInit,
    LoadRequest,
    ReceiveRequest,
)
from harnessrl.engine.weight_sync import VLLM_FIX, VLLM_VERSION, WeightSyncProtocol

if TYPE_CHECKING:
    from harnessrl.train.lora import LoraSettings

KEEPALIVE_S = 3.0  # below uvicorn's 5 s (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE default)


class HTTPEngine(StreamingEngine, BroadcastEngine):
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        timeout_s: float = 900.0,
        api_key: str | None = None,
        policy_version: int = 0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.policy_version = policy_version  # used when the server does not report one (vLLM)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._protocol: WeightSyncProtocol | None = None
        self._sync_checked = False
        self._workers = 1  # ranks this engine brings to a weight broadcast (vLLM: one per worker)
        self._context_length: int | None = None
        self._figures = VLLMFigures()  # vLLM's /metrics, scrape to scrape

    def __repr__(self) -> str:
        return f"HTTPEngine({self.base_url!r})"

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            # many concurrent rollouts: no pool cap. An idle connection is dropped after 3 s, before the server
            # drops it (vLLM's uvicorn after 5 s): a request on a connection the server just closed fails
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            session = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers, connector=connector)
            self._sessions[loop] = session
        return session

    @property
    def workers(self) -> int:
        return self._workers

    def endpoints(self) -> list[str]:
        return [self.base_url]

    async def release(self) -> None:
        """Closes this client's connections on the running event loop (the server keeps serving)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    async def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        url = self.base_url + path
        if path == "/collective_rpc":
            # a worker's exception reaches vLLM's uvicorn unhandled: it answers 500 and then resets the
            # connection, so a pooled one would fail the next request
            headers = {**(headers or {}), "Connection": "close"}
        try:
            async with self._session().request(
                method, url, json=body, headers=headers, params=params
            ) as response:
                return response.status, await response.text()
        except TimeoutError as e:
            raise EngineError(f"{url}: no reply within {self.timeout.total:.0f} s") from e
        except aiohttp.ClientError as e:
            raise EngineUnreachable(f"{url}: engine unreachable ({type(e).__name__}: {e})") from e

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        url = self.base_url + path
        status, text = await self._request(method, path, body, headers, params)
        if not text and status < 400:
            return None  # vLLM's control endpoints answer 200 with an empty body
        if status >= 400:
            message = _error_message(text)
            kind = EngineRequestError if 400 <= status < 500 and status not in (408, 429) else EngineError
            raise kind(f"{url}: engine answered HTTP {status}: {message}")
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise EngineError(f"{url}: reply is not JSON ({e}): {text[:200]!r}") from e

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
        if self._protocol is WeightSyncProtocol.VLLM and not top_logprobs:
            return await self._generate_streamed(prompt_ids, sampling, max_tokens, stop_token_ids, request_id)
        model = self.model or await self._first_model()
        body = build_request(prompt_ids, sampling, max_tokens, stop_token_ids, model, top_logprobs)
        headers = {"X-Request-Id": request_id} if request_id else None
        start = time.perf_counter()
        version = self.policy_version  # a server that reports no versions: the (older) version at the start
        reply = await self._call("POST", "/v1/completions", body, headers)
        generation = parse_response(reply, self.base_url + "/v1/completions", version, top_logprobs)
        generation.timings["http_s"] = time.perf_counter() - start
        return generation

    async def _generate_streamed(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None,
        request_id: str | None,
    ) -> Generation:
        """`generate` from the stream: each token tagged with the version at its arrival (see the top)."""
        start = time.perf_counter()
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = None
        usage: dict[str, Any] = {}
        stream = self._stream(prompt_ids, sampling, max_tokens, stop_token_ids, request_id, usage)
        async for delta in stream:
            ids += delta.token_ids
            logprobs += delta.logprobs
            versions += delta.token_policy_versions
            finish = delta.finish_reason or finish
        assert finish is not None  # generate_stream raises when the stream ends without one
        return Generation(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            policy_version=versions[-1] if versions else self.policy_version,
            token_policy_versions=versions,
            timings={"http_s": time.perf_counter() - start},
            cached_prompt_tokens=cached_prompt_tokens(usage),
        )

    async def generate_stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
        *,
        request_id: str | None = None,
    ) -> AsyncIterator[GenerationDelta]:
        """`stream: true` on `/v1/completions`: one delta per SSE chunk as the server sends it; the last
        delta carries finish_reason. Closing the iterator early closes the connection (vLLM then aborts)."""
        async for delta in self._stream(prompt_ids, sampling, max_tokens, stop_token_ids, request_id, {}):
            yield delta

    async def _stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None,
        request_id: str | None,
        usage: dict[str, Any],
    ) -> AsyncIterator[GenerationDelta]:
        """`generate_stream`, filling `usage` from a usage chunk (vLLM sends one last, with no choices)."""
        model = self.model or await self._first_model()
        body = build_request(prompt_ids, sampling, max_tokens, stop_token_ids, model)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # ours ignores it (its replies carry no usage)
        headers = {"X-Request-Id": request_id} if request_id else None
        url = self.base_url + "/v1/completions"
        finished = False
        try:
            async with self._session().post(url, json=body, headers=headers) as response:
                if response.status >= 400:
                    text = await response.text()
                    status = response.status
                    kind = (
                        EngineRequestError
                        if 400 <= status < 500 and status not in (408, 429)
                        else EngineError
                    )
                    raise kind(f"{url}: engine answered HTTP {status}: {_error_message(text)}")
                async for raw in response.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, `event:` lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue  # read on to the body's end: a connection left mid-body is not reusable
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError as e:
                        raise EngineError(f"{url}: stream chunk is not JSON ({e}): {data[:200]!r}") from e
                    if isinstance(chunk, dict) and chunk.get("choices") == [] and chunk.get("usage"):
                        usage.update(chunk["usage"])  # the usage chunk: after the last token
                        continue
                    delta = parse_stream_chunk(chunk, url, self.policy_version)
                    finished = delta.finish_reason is not None
                    yield delta
        except TimeoutError as e:
            raise EngineError(f"{url}: stream did not finish within {self.timeout.total:.0f} s") from e
        except aiohttp.ClientError as e:
            raise EngineUnreachable(f"{url}: engine unreachable ({type(e).__name__}: {e})") from e
        if not finished:
            raise EngineError(f"{url}: stream ended without a finish_reason")

    async def _first_model(self) -> str:
        reply = await self._call("GET", "/v1/models")
        try:
            self.model = str(reply["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as e:
            raise EngineError(f"{self.base_url}/v1/models: no model listed; pass model= explicitly") from e
        return self.model

    async def health(self) -> bool:
        try:
            async with self._session().get(self.base_url + "/health") as response:
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def stats(self) -> EngineStats | None:
        """The engine's counters: `GET /stats` of `harnessrl engine serve` (prefix cache hit rate, prefill and
        decode seconds), vLLM's Prometheus `GET /metrics` (`vllm_metrics.py`: which figures are approximate);
        None when the server reports neither."""
        try:
            if await self.weight_sync_protocol() is WeightSyncProtocol.VLLM:
                status, text = await self._request("GET", "/metrics")
                return self._figures.update(text) if status == 200 else None
            reply = await self._call("GET", "/stats")
        except EngineError:
            return None
        return EngineStats.from_figures(reply) if isinstance(reply, dict) else None

    async def context_length(self) -> int | None:
        """`max_model_len` of the first model `/v1/models` lists (vLLM and `harnessrl engine serve` say it)."""
        if self._context_length is None:
            reply = await self._call("GET", "/v1/models")
            models = reply.get("data") if isinstance(reply, dict) else None
            first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
            length = first.get("max_model_len")
            self._context_length = int(length) if isinstance(length, int) and length > 0 else None
        return self._context_length

    async def weight_sync_protocol(self) -> WeightSyncProtocol:
        """Which weight-sync protocol the server speaks: vLLM lists its models as `owned_by: "vllm"`."""
        if self._protocol is None:
            reply = await self._call("GET", "/v1/models")
            models = reply.get("data") if isinstance(reply, dict) else None
            first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
            owner = first.get("owned_by")
            self._protocol = WeightSyncProtocol.VLLM if owner == "vllm" else WeightSyncProtocol.HARNESSRL
        return self._protocol

    async def check_weight_sync(self, mode: WeightSyncMode = WeightSyncMode.CHECKPOINT) -> None:
        """Asks the server whether it can take new weights (by `mode`); WeightSyncUnsupported (one line) when it
        cannot. Against vLLM this also adopts the policy version the extension reports (a restarted client)."""
        if await self.weight_sync_protocol() is WeightSyncProtocol.HARNESSRL:
            status, text = await self._request("GET", "/load_weights")
            if status != 200:
                raise WeightSyncUnsupported(
                    f"{self.base_url} cannot take new weights: GET /load_weights answered HTTP {status} "
                    f"(serve the model with `harnessrl engine serve`, or with vLLM: {VLLM_FIX})"
                )
            if mode is WeightSyncMode.BROADCAST:
                receives = _receives([_json_or_none(text)])
                if WeightSyncMode.BROADCAST not in receives:
                    raise WeightSyncUnsupported(
                        f"{self.base_url} cannot take weights by broadcast (GET /load_weights lists "
                        f"{sorted(receives) or 'no receive modes'}: a harnessrl engine server older than this "
                        "client): serve it with this harnessrl version, or use --weight-sync checkpoint"
                    )
            self._workers = 1
            self._sync_checked = True
            return
        status, text = await self._request("POST", "/collective_rpc", {"method": INFO})
        if status == 404:
            raise WeightSyncUnsupported(
                f"{self.base_url} (vLLM) cannot take new weights: no /collective_rpc endpoint "
                f"(dev endpoints off): {VLLM_FIX}"
            )
        if status >= 400:
            raise WeightSyncUnsupported(
                f"{self.base_url} (vLLM) cannot take new weights: {INFO} failed with HTTP {status} "
                f"({' '.join(_error_message(text).split())[:160]}), so the worker extension is not loaded: "
                f"{VLLM_FIX}"
            )
        try:
            answers = _rpc_results(json.loads(text), self.base_url)
        except json.JSONDecodeError as e:
            raise EngineError(
                f"{self.base_url}/collective_rpc: reply is not JSON ({e}): {text[:200]!r}"
            ) from e
        if not all(isinstance(a, dict) and a.get("extension") == EXTENSION for a in answers):
            raise WeightSyncUnsupported(
                f"{self.base_url} (vLLM) cannot take new weights: {INFO} answered {text[:160]!r}, not the "
                f"harnessrl worker extension: {VLLM_FIX}"
            )
        protocols = {a.get("protocol") for a in answers}
        if protocols != {PROTOCOL}:
            raise WeightSyncUnsupported(
                f"{self.base_url} (vLLM) runs worker extension protocol {sorted(map(str, protocols))}, this "
                f"client speaks {PROTOCOL}: install the same harnessrl version on the vLLM server"
            )
        versions = {a.get("policy_version") for a in answers}
        if len(versions) != 1:
            raise EngineError(
                f"{self.base_url}: its workers hold different policy versions {sorted(map(str, versions))}; "
                "load_weights again to bring them together"
            )
        status, _ = await self._request("GET", "/is_paused")
        if status != 200:
            raise WeightSyncUnsupported(
                f"{self.base_url} (vLLM) cannot pause generation around a weight update (GET /is_paused "
                f"answered HTTP {status}): use vLLM {VLLM_VERSION} as docs/engine.md says"
            )
        if mode is WeightSyncMode.BROADCAST and WeightSyncMode.BROADCAST not in _receives(answers):
            raise WeightSyncUnsupported(
                f"{self.base_url} (vLLM) cannot take weights by broadcast: its worker extension lists "
                f"{sorted(_receives(answers))}: install this harnessrl version on the vLLM server"
            )
        self.policy_version = max(self.policy_version, int(versions.pop() or 0))
        self._workers = len(answers)
        self._sync_checked = True

    async def load_weights(self, checkpoint_dir: str, version: int) -> None:
        """Swaps in the weights of a checkpoint directory (local path or s3:// URI the server can read), tagging
        later tokens `version`. Raises on any failure: an engine never silently keeps the old policy."""
        if await self.weight_sync_protocol() is WeightSyncProtocol.HARNESSRL:
            await self._call("POST", "/load_weights", {"path": str(checkpoint_dir), "version": int(version)})
            self.policy_version = int(version)
            return
        request = LoadRequest(str(checkpoint_dir), int(version)).to_json()
        await self._vllm_update(LOAD, request, int(version))

    async def load_adapter(self, adapter_dir: str, version: int) -> None:
        """A LoRA adapter directory (local path or s3:// URI the server can read) merged onto the served base
        (base.WeightLoadingEngine.load_adapter); vLLM merges it in the worker extension and reloads in place."""
        if await self.weight_sync_protocol() is WeightSyncProtocol.HARNESSRL:
            await self._call("POST", "/load_adapter", {"path": str(adapter_dir), "version": int(version)})
            self.policy_version = int(version)
            return
        await self._vllm_update(
            LOAD_ADAPTER, LoadRequest(str(adapter_dir), int(version)).to_json(), int(version)
        )

    async def init_weight_broadcast(self, init: BroadcastInit) -> list[Any]:
        """The server's workers join the trainer's broadcast group (ranks `init.rank_offset` on; `self.workers`
        of them). Blocks until every rank has joined: run it alongside the trainer's `WeightGroup`. Returns the
        workers' answers ({"rank", "world_size"})."""
        if not self._sync_checked:
            await self.check_weight_sync(WeightSyncMode.BROADCAST)
        if self._protocol is WeightSyncProtocol.HARNESSRL:
            return [await self._call("POST", "/init_broadcast", json.loads(init.to_json()))]
        reply = await self._call(
            "POST", "/collective_rpc", {"method": INIT_BROADCAST, "args": [init.to_json()]}
        )
        return _rpc_results(reply, self.base_url)

    async def receive_weights_broadcast(self, version: int, adapter: LoraSettings | None = None) -> None:
        """Receives one update by broadcast (the trainer sends it meanwhile, `broadcast.send_weights`) and
        tags later tokens `version`; with `adapter`, the update is a LoRA adapter of those settings, merged onto
        the base. Ours applies it between two decode steps and flushes its prefix cache; vLLM is paused around
        it as for `load_weights`."""
        request = ReceiveRequest(int(version), *((adapter.rank, adapter.alpha) if adapter else (0, 0)))
        if self._protocol is WeightSyncProtocol.HARNESSRL:
            reply = await self._call("POST", "/receive_weights", json.loads(request.to_json()))
            if not (isinstance(reply, dict) and reply.get("policy_version") == int(version)):
                raise EngineError(
                    f"{self.base_url}/receive_weights answered {reply!r:.200}, not version {version}"
                )
            self.policy_version = int(version)
            return
        await self._vllm_update(RECEIVE, request.to_json(), int(version))

    async def _vllm_update(self, method: str, request: str, version: int) -> None:
        """Pause (requests in flight freeze) → the extension's `method` on every worker → prefix cache flush
        → resume. A failure after the pause leaves the engine paused: it must not sample a half-loaded policy."""
        if not self._sync_checked:
            await self.check_weight_sync()
        await self._call("POST", "/pause", params={"mode": "keep"})
        try:
            reply = await self._call("POST", "/collective_rpc", {"method": method, "args": [request]})
            answers = _rpc_results(reply, self.base_url)
            wrong = [a for a in answers if not (isinstance(a, dict) and a.get("policy_version") == version)]
            if wrong:
                raise EngineError(f"{self.base_url}: {method} answered {wrong[:2]!r}, not version {version}")
            # in-flight requests are preempted and recomputed, so no key/value of the old weights survives
            reset = await self._call("POST", "/reset_prefix_cache", params={"reset_running_requests": "true"})
            if isinstance(reset, dict) and reset.get("success") is False:
                raise EngineError(f"{self.base_url}: /reset_prefix_cache answered {reset!r}")
        except EngineError as e:
            if await self._still_consistent():
                await self._call("POST", "/resume")
                raise EngineError(
                    f"{self.base_url}: weight update to version {version} refused ({e}); no weight changed: "
                    f"the engine still serves version {self.policy_version} and generates again"
                ) from e
            raise EngineError(
                f"{self.base_url}: weight update to version {version} failed ({e}); the engine stays paused "
                "so that it samples no half-loaded policy: retry load_weights, or restart it"
            ) from e
        self.policy_version = version  # before /resume: tokens arriving from now on were sampled after it
        await self._call("POST", "/resume")

    async def _still_consistent(self) -> bool:
        """After a failed update: does every worker still serve the version it had (the extension refused the
        update before changing a weight)? False when one reports a half-applied update, or cannot answer."""
        try:
            answers = _rpc_results(
                await self._call("POST", "/collective_rpc", {"method": INFO}), self.base_url
            )
        except EngineError:
            return False
        return all(
            isinstance(a, dict) and FAILED_UPDATE not in a and a.get("policy_version") == self.policy_version
            for a in answers
        )

    async def abort(self, request_ids: list[str] | None = None) -> bool:
        """Ours: `POST /abort`. vLLM: `POST /abort_requests` (a dev endpoint: False without it), its request ids
        being `cmpl-<X-Request-Id>-0`; both answer the aborted requests with finish_reason "abort" and the
        tokens sampled so far."""
        if await self.weight_sync_protocol() is WeightSyncProtocol.HARNESSRL:
            body = {} if request_ids is None else {"request_ids": list(request_ids)}
            await self._call("POST", "/abort", body)
            return True
        if request_ids is not None and not request_ids:
            return True  # vLLM reads an empty list as "all"
        ids = None if request_ids is None else [f"cmpl-{r}-0" for r in request_ids]
        status, text = await self._request(
            "POST", "/abort_requests", {} if ids is None else {"request_ids": ids}
        )
        if status == 404:
            return False  # dev endpoints off: the caller cancels instead
        if status >= 400:
            raise EngineError(
                f"{self.base_url}/abort_requests: engine answered HTTP {status}: {_error_message(text)}"
            )
        return True


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _receives(answers: list[Any]) -> set[str]:
    """The receive modes every answer lists (`"receives"`; none listed: checkpoint only, an older server)."""
    modes = [set(a.get("receives") or ["checkpoint"]) if isinstance(a, dict) else set() for a in answers]
    return set.intersection(*modes) if modes else set()


def _rpc_results(body: Any, source: str) -> list[Any]:
    """The per-worker answers of vLLM's `/collective_rpc` (`{"results": [...]}`)."""
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or not results:
        raise EngineError(
            f"{source}/collective_rpc: expected {{'results': [one per worker]}}, got {body!r:.200}"
        )
    return results


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text[:300] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:  # vLLM >= 0.11, OpenAI
            return str(error["message"])
        if "message" in body:  # vLLM <= 0.10 ErrorResponse
            return str(body["message"])
    return text[:300]
