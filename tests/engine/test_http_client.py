"""HTTPEngine against a recorded-format vLLM server: a real loopback aiohttp server replaying vLLM replies."""

import asyncio
import json
import socket
from pathlib import Path

import pytest
from aiohttp import web

from harnessrl.components.engine.base import EngineError, EngineRequestError, SamplingParams
from harnessrl.components.engine.http_client import HTTPEngine

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


class RecordedServer:
    """Replies to /v1/completions with a fixed body and status; keeps the request bodies it received."""

    def __init__(self, body, status: int = 200, raw: str | None = None, model: str = "Qwen/Qwen2.5-1.5B-Instruct"):
        self.body, self.status, self.raw, self.model = body, status, raw, model
        self.requests: list[dict] = []
        self.headers: list[dict] = []

    async def completions(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        self.headers.append(request.headers.copy())
        if self.raw is not None:
            return web.Response(text=self.raw, status=self.status, content_type="application/json")
        return web.json_response(self.body, status=self.status)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def ok(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        return web.json_response({"status": "ok"})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/load_weights", self.ok)
        app.router.add_post("/abort", self.ok)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def call(server: RecordedServer, **kwargs):
    url = await server.start()
    client = HTTPEngine(url + "/v1", model=kwargs.pop("model", "Qwen/Qwen2.5-1.5B-Instruct"))
    try:
        return await client.generate([151644, 872, 198], SamplingParams(temperature=0.7, top_p=0.9, seed=11), 32,
                                     stop_token_ids=[151643], **kwargs)
    finally:
        await client.close()
        await server.stop()


def test_request_and_reply_in_vllm_format():
    server = RecordedServer(recorded("vllm_0_11_completion_token_ids.json"))
    gen = asyncio.run(call(server, request_id="r-1"))
    sent = server.requests[0]
    assert sent["prompt"] == [151644, 872, 198] and sent["max_tokens"] == 32
    assert sent["temperature"] == 0.7 and sent["top_p"] == 0.9 and sent["seed"] == 11
    assert sent["stop_token_ids"] == [151643] and sent["return_token_ids"] is True and sent["logprobs"] == 0
    assert sent["model"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert server.headers[0]["X-Request-Id"] == "r-1"
    assert gen.token_ids == [9707, 0, 2585, 646, 358, 1492, 30, 151645]
    assert gen.logprobs[0] == pytest.approx(-0.0412) and len(gen.logprobs) == 8
    assert gen.finish_reason == "stop"
    assert gen.policy_version == 0 and gen.token_policy_versions == [0] * 8  # vLLM does not report one
    assert gen.timings["http_s"] > 0


def test_model_name_is_discovered_from_v1_models():
    server = RecordedServer(recorded("vllm_0_11_completion_token_ids.json"), model="served-name")
    asyncio.run(call(server, model=None))
    assert server.requests[0]["model"] == "served-name"


def test_pre_0_10_2_server_without_token_ids_is_rejected():
    server = RecordedServer(recorded("vllm_0_10_1_completion_no_token_ids.json"))
    with pytest.raises(EngineError, match="token_ids is missing.*0.10.2"):
        asyncio.run(call(server))


@pytest.mark.parametrize(("name", "status", "kind", "message"), [
    ("vllm_0_11_error.json", 400, EngineRequestError, "maximum context length"),
    ("vllm_0_10_error.json", 500, EngineError, "EngineDeadError"),
])
def test_error_replies_become_engine_errors(name, status, kind, message):
    server = RecordedServer(recorded(name), status=status)
    with pytest.raises(kind, match=f"HTTP {status}.*{message}"):
        asyncio.run(call(server))


@pytest.mark.parametrize(("raw", "message"), [
    ("<html>502 Bad Gateway</html>", "not JSON"),
    ('{"choices": []}', "no choices"),
    ('{"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]}',
     "2 token_ids but 1 token_logprobs"),
    ('{"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "weird"}]}',
     "unknown finish_reason"),
    ('{"choices": [{"token_ids": ["a"], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]}',
     "not a list of integers"),
])
def test_malformed_replies_become_engine_errors(raw, message):
    server = RecordedServer(None, raw=raw)
    with pytest.raises(EngineError, match=message):
        asyncio.run(call(server))


def test_unreachable_engine_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nobody listens there

    async def go():
        client = HTTPEngine(f"http://127.0.0.1:{port}", model="m")
        try:
            await client.generate([1, 2], SamplingParams(), 4)
        finally:
            await client.close()

    with pytest.raises(EngineError, match="unreachable"):
        asyncio.run(go())
