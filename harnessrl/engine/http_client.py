"""`HTTPEngine`: the `Engine` interface over a vLLM-compatible `/v1/completions` token API.

The same client talks to `harnessrl engine serve` and to a real vLLM OpenAI server (>= 0.10.2, the first
release with `return_token_ids`; checked against the v0.11 protocol). vLLM is never imported here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from harnessrl.engine.base import (
    EngineError,
    EngineRequestError,
    Generation,
    GenerationDelta,
    SamplingParams,
)
from harnessrl.engine.completions_api import build_request, parse_response, parse_stream_chunk


class HTTPEngine:
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

    def __repr__(self) -> str:
        return f"HTTPEngine({self.base_url!r})"

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=0)  # many concurrent rollouts: no pool cap
            session = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers, connector=connector)
            self._sessions[loop] = session
        return session

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        url = self.base_url + path
        try:
            async with self._session().request(method, url, json=body, headers=headers) as response:
                text = await response.text()
                status = response.status
        except TimeoutError as e:
            raise EngineError(f"{url}: no reply within {self.timeout.total:.0f} s") from e
        except aiohttp.ClientError as e:
            raise EngineError(f"{url}: engine unreachable ({type(e).__name__}: {e})") from e
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
        model = self.model or await self._first_model()
        body = build_request(prompt_ids, sampling, max_tokens, stop_token_ids, model, top_logprobs)
        headers = {"X-Request-Id": request_id} if request_id else None
        start = time.perf_counter()
        reply = await self._call("POST", "/v1/completions", body, headers)
        generation = parse_response(reply, self.base_url + "/v1/completions", self.policy_version)
        generation.timings["http_s"] = time.perf_counter() - start
        return generation

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
        model = self.model or await self._first_model()
        body = build_request(prompt_ids, sampling, max_tokens, stop_token_ids, model)
        body["stream"] = True
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
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError as e:
                        raise EngineError(f"{url}: stream chunk is not JSON ({e}): {data[:200]!r}") from e
                    delta = parse_stream_chunk(chunk, url, self.policy_version)
                    finished = delta.finish_reason is not None
                    yield delta
        except TimeoutError as e:
            raise EngineError(f"{url}: stream did not finish within {self.timeout.total:.0f} s") from e
        except aiohttp.ClientError as e:
            raise EngineError(f"{url}: engine unreachable ({type(e).__name__}: {e})") from e
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

    async def stats(self) -> dict[str, Any] | None:
        """The engine's counters (`GET /stats` of `harnessrl engine serve`: prefix cache hit rate, prefill and
        decode seconds); None when the server has no such endpoint (vLLM: scrape its Prometheus `/metrics`)."""
        try:
            reply = await self._call("GET", "/stats")
        except EngineError:
            return None
        return reply if isinstance(reply, dict) else None

    async def load_weights(self, checkpoint_dir: str, version: int) -> None:
        """harnessrl servers only: swap weights between steps. (vLLM: use its weight-update workers via
        `/collective_rpc`; see docs/engine.md.)"""
        await self._call("POST", "/load_weights", {"path": str(checkpoint_dir), "version": int(version)})
        self.policy_version = int(version)

    async def abort(self, request_ids: list[str] | None = None) -> None:
        await self._call("POST", "/abort", {} if request_ids is None else {"request_ids": list(request_ids)})


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
