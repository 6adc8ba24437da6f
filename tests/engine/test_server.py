"""The vLLM-compatible HTTP server: in-process on loopback (shared engine), and `harnessrl engine serve` as a
real subprocess with `vllm` blocked from importing."""

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from harnessrl.engine.base import EngineError, EngineRequestError
from harnessrl.engine.http_client import HTTPEngine
from tests.engine.support import GREEDY, post, run


def test_completions_reply_has_vllm_token_fields(url, engine, chat):
    prompt = chat("What is the capital of France?")
    status, body = run(
        post(
            url + "/v1/completions",
            {
                "model": "x",
                "prompt": prompt,
                "max_tokens": 6,
                "temperature": 0,
                "logprobs": 1,
                "return_token_ids": True,
            },
        )
    )
    assert status == 200
    choice = body["choices"][0]
    assert body["object"] == "text_completion" and body["usage"]["prompt_tokens"] == len(prompt)
    assert choice["prompt_token_ids"] == prompt
    assert (
        len(choice["token_ids"])
        == len(choice["logprobs"]["token_logprobs"])
        == len(choice["logprobs"]["tokens"])
    )
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])
    assert choice["finish_reason"] in ("stop", "length")
    assert choice["text"] == engine.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["token_ids"] == run(engine.generate(prompt, GREEDY, 6)).token_ids


def test_bad_requests_get_400_with_a_clear_message(url):
    for body, message in [
        ({"prompt": [], "max_tokens": 3}, "non-empty list of token ids"),
        ({"prompt": [1, 2], "n": 2}, "`n` must be 1"),
        ({"prompt": [1, 2], "temperature": "hot"}, "`temperature` must be a number"),
        ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens must be a positive integer"),
    ]:
        status, reply = run(post(url + "/v1/completions", body))
        assert status == 400 and message in reply["error"]["message"], reply


def test_http_engine_against_our_server(url, chat):
    async def go():
        client = HTTPEngine(url)
        try:
            gen = await client.generate(chat("Name a color."), GREEDY, 5)
            with pytest.raises(EngineRequestError, match="HTTP 400.*non-empty list of token ids"):
                await client.generate([], GREEDY, 5)
            with pytest.raises(EngineRequestError, match="HTTP 400.*no \\*.safetensors"):
                await client.load_weights("/nonexistent/ckpt", 2)
            return gen, client.model
        finally:
            await client.release()

    gen, model = run(go())
    assert model == "smollm2-135m-instruct"
    assert 0 < len(gen.token_ids) <= 5 and gen.timings["total_s"] > 0 and gen.timings["http_s"] > 0


def test_stats_over_http_count_the_requests_and_the_prefix_cache(url, chat):
    prompt = chat("Name a colour of the rainbow and describe it.")

    async def go():
        client = HTTPEngine(url)
        try:
            before = await client.stats()
            first = await client.generate(prompt, GREEDY, 3)
            again = await client.generate(prompt, GREEDY, 3)
            return before, first, again, await client.stats()
        finally:
            await client.release()

    before, first, again, after = run(go())
    assert before is not None and after is not None
    before, after = before.figures, after.figures
    assert after["requests"] - before["requests"] == 2
    assert (
        again.cached_prompt_tokens == len(prompt) - 1 - (len(prompt) - 1) % 16 == again.cached_prompt_tokens
    )
    hits = after["prefix_cache"]["hit_tokens"] - before["prefix_cache"]["hit_tokens"]
    assert hits >= again.cached_prompt_tokens > 0 and first.token_ids == again.token_ids


def test_load_weights_and_abort_over_http(url, chat):
    from harnessrl.tinymodel import tiny_model_dir

    async def go():
        client = HTTPEngine(url)
        try:
            await client.load_weights(str(tiny_model_dir()), 3)
            after = await client.generate(chat("hi"), GREEDY, 3)
            long = asyncio.ensure_future(
                client.generate(chat("Tell me a very long story."), GREEDY, 500, request_id="long-1")
            )
            await asyncio.sleep(1.0)
            await client.abort(["long-1"])
            aborted = await long
            async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
                health = await r.json()
            return after, aborted, health
        finally:
            await client.release()

    after, aborted, health = run(go())
    assert after.policy_version == 3 and after.token_policy_versions == [3] * len(after.token_ids)
    assert aborted.finish_reason == "abort" and len(aborted.token_ids) < 500
    assert health["status"] == "ok" and health["policy_version"] == 3


def test_load_adapter_over_http_merges_onto_the_base_and_a_bad_one_changes_nothing(url, chat, tmp_path):
    """A LoRA adapter (PEFT's layout) through `POST /load_adapter`: the engine then samples the adapted model;
    a directory that is no adapter is refused, the version and weights as they were."""
    import torch

    from harnessrl.tinymodel import load_model, tiny_model_dir
    from harnessrl.train.lora import LoraSettings, adapter_of, add_adapters, is_adapter_tensor
    from tests.support.weight_sync import teacher_forced

    settings = LoraSettings(rank=4, alpha=8)
    model = load_model(tiny_model_dir()).eval()
    add_adapters(model, settings)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter_tensor(name):
                p.copy_(torch.randn_like(p) * 0.02)
    adapter_dir = adapter_of(model.state_dict().items(), settings).save(tmp_path / "adapter", "tiny")
    prompt = chat("Name a fruit.")

    async def go():
        client = HTTPEngine(url)
        try:
            await client.load_adapter(str(adapter_dir), 5)
            after = await client.generate(prompt, GREEDY, 6)
            with pytest.raises(EngineError, match="not a PEFT adapter directory"):
                await client.load_adapter(str(tmp_path), 6)
            still = await client.generate(prompt, GREEDY, 6)
            return after, still
        finally:
            await client.load_weights(str(tiny_model_dir()), 0)  # the module's other tests: the base model
            await client.release()

    after, still = run(go())
    assert after.token_policy_versions == [5] * len(after.token_ids)
    with torch.no_grad():
        expected = teacher_forced(model, prompt, after.token_ids)
    assert max(abs(a - b) for a, b in zip(after.logprobs, expected, strict=True)) < 2e-3
    assert still.token_ids == after.token_ids and still.token_policy_versions == [5] * len(still.token_ids)


SERVE_WITHOUT_VLLM = r"""
import importlib, pkgutil, sys

class BlockVllm:
    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError(f"blocked import of {name}")
        return None

sys.meta_path.insert(0, BlockVllm())
import harnessrl.engine as pkg
names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
for name in names:
    importlib.import_module(name)
assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
print("imported", len(names), "engine modules without vllm", flush=True)
from harnessrl.cli import main
sys.exit(main(["engine", "serve", "--port", "0", "--max-batch", "4"]))
"""


def test_serve_process_imports_without_vllm_and_fails_cleanly_when_killed(engine, chat):
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITHOUT_VLLM],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        address, seen, deadline = None, [], time.time() + 240
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                address = match.group(1)
                break
        assert address, "engine server did not start:\n" + "".join(seen[-20:])
        imported = next(line for line in seen if line.startswith("imported"))
        assert (
            int(imported.split()[1]) >= 8
        )  # base, kv, sampling, local, server, http_client, router, cli, ...
        prompt = chat("What is 2+2?")

        async def ask():
            client = HTTPEngine(address)
            try:
                return await client.generate(prompt, GREEDY, 4)
            finally:
                await client.release()

        assert run(ask()).token_ids == run(engine.generate(prompt, GREEDY, 4)).token_ids
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    with pytest.raises(EngineError, match="unreachable"):
        run(ask())


def test_cli_rejects_a_missing_model_dir(tmp_path):
    harnessrl = Path(sys.executable).parent / "harnessrl"  # the installed entry point, as users type it
    out = subprocess.run(
        [str(harnessrl), "engine", "serve", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "not a Hugging Face model directory" in out.stderr and "Traceback" not in out.stderr
