"""Token streaming: LocalEngine.generate_stream (one delta per decode step), `stream: true` on the HTTP
server (vLLM SSE chunks), HTTPEngine.generate_stream, and the adapter for engines without streaming."""

import json

import aiohttp
import pytest

from harnessrl.engine.base import (
    EngineRequestError,
    GenerationDelta,
    SamplingParams,
    generate_stream,
)
from harnessrl.engine.http_client import HTTPEngine
from tests.engine.support import GREEDY, GenerateOnly, run


async def _collect(stream, client: HTTPEngine | None = None) -> list[GenerationDelta]:
    try:
        return [d async for d in stream]
    finally:
        if client is not None:
            await client.release()


def _joined(deltas: list[GenerationDelta]) -> tuple[list[int], list[float], list[int]]:
    ids, lps, versions = [], [], []
    for d in deltas:
        ids += d.token_ids
        lps += d.logprobs
        versions += d.token_policy_versions
    return ids, lps, versions


def test_local_stream_yields_a_delta_per_step_and_equals_generate(engine, chat):
    prompt = chat("Count from one to ten in words.")
    sampling = SamplingParams(temperature=1.0, seed=7)
    run(engine.generate(prompt, sampling, 1))  # both runs below then start from the same cached prefix
    whole = run(engine.generate(prompt, sampling, 12))
    deltas = run(_collect(engine.generate_stream(prompt, sampling, 12)))
    ids, lps, versions = _joined(deltas)
    assert ids == whole.token_ids
    # float noise only: the adaptive thread count may differ between the two runs
    assert lps == pytest.approx(whole.logprobs, abs=1e-4)
    assert versions == whole.token_policy_versions
    assert deltas[-1].finish_reason == whole.finish_reason
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert len([d for d in deltas if d.token_ids]) >= 2  # tokens arrive over several deltas, not at the end


def test_adapter_turns_generate_into_one_final_delta(engine, chat):
    prompt = chat("Say hi.")
    deltas = run(_collect(generate_stream(GenerateOnly(engine), prompt, GREEDY, 6)))
    whole = run(engine.generate(prompt, GREEDY, 6))
    assert len(deltas) == 1 and deltas[0].token_ids == whole.token_ids
    assert deltas[0].finish_reason == whole.finish_reason


def test_http_stream_sends_vllm_chunks_and_client_reassembles(url, engine, chat):
    prompt = chat("Name three colors.")
    body = {
        "prompt": prompt,
        "max_tokens": 10,
        "temperature": 0.0,
        "logprobs": 0,
        "return_token_ids": True,
        "stream": True,
        "skip_special_tokens": False,
    }

    async def raw() -> list[bytes]:
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            return [line.strip() async for line in r.content if line.strip()]

    lines = run(raw())
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(line[len(b"data: ") :]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == prompt
    assert all(c["choices"][0]["prompt_token_ids"] is None for c in chunks[1:])
    whole = run(engine.generate(prompt, GREEDY, 10))
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == whole.token_ids
    assert "".join(c["choices"][0]["text"] for c in chunks) == engine.tokenizer.decode(whole.token_ids)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == whole.finish_reason

    client = HTTPEngine(url)
    deltas = run(_collect(client.generate_stream(prompt, GREEDY, 10), client))
    ids, lps, _ = _joined(deltas)
    assert ids == whole.token_ids
    assert [round(x, 4) for x in lps] == [round(x, 4) for x in whole.logprobs]
    assert deltas[-1].finish_reason == whole.finish_reason


def test_http_stream_bad_request_is_a_request_error(url):
    client = HTTPEngine(url)
    with pytest.raises(EngineRequestError, match="max_tokens"):
        run(_collect(client.generate_stream([1, 2, 3], GREEDY, 0), client))
