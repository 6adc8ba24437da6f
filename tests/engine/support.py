"""Fixtures and helpers for tests/engine: the real tiny model's engine, a loopback server for it, and a server
replaying recorded vLLM replies."""

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from harnessrl.engine.base import Engine, Generation, SamplingParams
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.engine.server import serve

DATA = Path(__file__).parent / "data"

GREEDY = SamplingParams(temperature=0.0)


class GenerateOnly(Engine):
    """An engine that declares no ability beyond `generate` (it answers through `inner`): the protocol's
    defaults answer "cannot" for everything else."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        max_tokens: int,
        stop_token_ids: list[int] | None = None,
    ) -> Generation:
        return await self.inner.generate(prompt_ids, sampling, max_tokens, stop_token_ids)


@pytest.fixture(scope="module")  # a model each: not for the whole session (~1 GB)
def engine():
    from harnessrl.engine.local import LocalEngine

    eng = LocalEngine(max_batch=16)
    yield eng
    eng.close()


@pytest.fixture
def hf_model():
    """transformers' model of the same checkpoint: the reference the engine's own forward pass must match (per
    test: beside a module's engines it kept a third model alive)."""
    from harnessrl.tinymodel import load_model

    return load_model().eval()


@pytest.fixture  # one test at a time: a module holding three engines peaked at 4.2 GB
def engine_nocache():
    """The same model without a prefix cache: the reference the cached engine must match."""
    from harnessrl.engine.local import LocalEngine

    eng = LocalEngine(max_batch=16, prefix_cache_mb=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def chat(engine):
    def render(question: str) -> list[int]:
        return engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )

    return render


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    """A short chat prompt of the tiny model's tokenizer (the weight-sync tests' fixed prompt)."""
    from harnessrl.tinymodel import load_tokenizer

    return load_tokenizer().apply_chat_template(
        [{"role": "user", "content": "Name a fruit."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def run(coro):
    return asyncio.run(coro)


def nucleus_logprobs(model, prompt: list[int], token_ids: list[int], temperature: float, top_p: float):
    """Each sampled token's logprob recomputed by one full forward pass: log_softmax(logits / T) restricted to
    the top-p nucleus and renormalized (what an engine must report for a token it sampled)."""
    import torch

    from harnessrl.engine.sampling import _restrict_to_nucleus

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + token_ids])).logits[0, len(prompt) - 1 : -1]
    logp = _restrict_to_nucleus(
        torch.log_softmax(logits / temperature, dim=-1), torch.full((len(logits),), top_p)
    )
    return logp.gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)


@pytest.fixture(scope="module")
def url(engine):
    """Serves the session's engine on a free loopback port from a background event loop."""
    loop = asyncio.new_event_loop()
    ready = loop.create_future()
    task = loop.create_task(serve(engine, "127.0.0.1", 0, ready=ready))

    def run_server() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.close()

    thread = threading.Thread(target=run_server, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not ready.done() and time.time() < deadline:
        time.sleep(0.05)
    yield ready.result()
    loop.call_soon_threadsafe(task.cancel)
    thread.join(timeout=10)


async def post(address: str, body, headers=None):
    async with aiohttp.ClientSession() as session, session.post(address, json=body, headers=headers) as r:
        return r.status, await r.json()


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


class RecordedServer:
    """Replies to /v1/completions with a fixed body and status; keeps the request bodies it received."""

    def __init__(
        self, body, status: int = 200, raw: str | None = None, model: str = "Qwen/Qwen2.5-1.5B-Instruct"
    ):
        self.body, self.status, self.raw, self.model = body, status, raw, model
        self.requests: list[dict] = []
        self.headers: list[Mapping[str, str]] = []  # case-insensitive lookups

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
        app.router.add_post("/load_adapter", self.ok)
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
        return await client.generate(
            [151644, 872, 198],
            SamplingParams(temperature=0.7, top_p=0.9, seed=11),
            32,
            stop_token_ids=[151643],
            **kwargs,
        )
    finally:
        await client.release()
        await server.stop()
