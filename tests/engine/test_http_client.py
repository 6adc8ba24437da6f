"""HTTPEngine against a recorded-format vLLM server: a real loopback aiohttp server replaying vLLM replies."""

import asyncio
import socket
from pathlib import Path

import pytest

from harnessrl.engine.base import EngineError, EngineRequestError, SamplingParams
from harnessrl.engine.http_client import HTTPEngine
from tests.engine.support import RecordedServer, call, recorded

DATA = Path(__file__).parent / "data"


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


@pytest.mark.parametrize(
    ("name", "status", "kind", "message"),
    [
        ("vllm_0_11_error.json", 400, EngineRequestError, "maximum context length"),
        ("vllm_0_10_error.json", 500, EngineError, "EngineDeadError"),
    ],
)
def test_error_replies_become_engine_errors(name, status, kind, message):
    server = RecordedServer(recorded(name), status=status)
    with pytest.raises(kind, match=f"HTTP {status}.*{message}"):
        asyncio.run(call(server))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("<html>502 Bad Gateway</html>", "not JSON"),
        ('{"choices": []}', "no choices"),
        (
            '{"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]}',
            "2 token_ids but 1 token_logprobs",
        ),
        (
            '{"choices": [{"token_ids": [1], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "weird"}]}',
            "unknown finish_reason",
        ),
        (
            '{"choices": [{"token_ids": ["a"], "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]}',
            "not a list of integers",
        ),
    ],
)
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
            await client.release()

    with pytest.raises(EngineError, match="unreachable"):
        asyncio.run(go())
