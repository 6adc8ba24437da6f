"""A fast engine server with a TRIVIAL model, for gateway tests and `benchmarks/gateway.py`.

It is a real loopback HTTP server speaking the vLLM-compatible token API (`POST /v1/completions` with the
prompt as token ids, `return_token_ids`, `logprobs`), but its "model" is a script: the reply is chosen by
the prompt's turn number (how many assistant turns it already holds; `select="turn"`) or by a hash of the
prompt (`select="hash"`) or by the request's place in order (`select="order"`: the n-th request gets reply n),
and its tokens are the script texts tokenized with the real tokenizer (or raw token
ids given in the script). Logprobs are a deterministic function of the token. An optional per-token delay
stands in for decode time; with `"stream": true` each token is sent as its own vLLM-style SSE chunk after
its delay (so streaming can be observed token by token). Nothing here learns or predicts — it exists so the gateway can be exercised and
benchmarked without a model in the way.

Run standalone: `python -m tests.support.fast_engine --script replies.json [--port N]`
(prints `READY <base_url>` on stdout).

Clients: the project's `harnessrl.engine.http_client.HTTPEngine` (the same client used for vLLM).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import threading
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionToolParam

TOOL_REPLY = (
    'I will list the files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
)
FINAL_REPLY = "The repository has two files: a.py and b.py."

BASH_TOOL: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def fake_logprob(token_id: int) -> float:
    return -(0.05 + (token_id % 17) / 100.0)


class FastEngineServer:
    """`replies`: list of `{"text": str}` or `{"token_ids": [int]}`; texts get the end-of-turn token appended."""

    def __init__(
        self,
        tokenizer: Any,
        replies: list[dict],
        select: str = "turn",
        per_token_s: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        policy_version: int = 0,
        max_model_len: int | None = None,
    ) -> None:
        if not replies:
            raise ValueError("fast engine: the reply script is empty")
        if select not in ("turn", "hash", "order"):
            raise ValueError("fast engine: select must be 'turn', 'hash' or 'order'")
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies: list[list[int]] = []
        for i, r in enumerate(replies):
            if "token_ids" in r:
                self.replies.append([int(t) for t in r["token_ids"]])
            elif "text" in r:
                self.replies.append(list(tokenizer.encode(r["text"], add_special_tokens=False)) + [eot])
            else:
                raise ValueError(f"fast engine: reply {i} needs 'text' or 'token_ids'")
        gen_prompt = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        self._turn_marker = tuple(gen_prompt[:2])
        self.select = select
        self.per_token_s = per_token_s
        self.policy_version = policy_version
        self.max_model_len = max_model_len  # longer prompts get vLLM's 400
        self.host, self.port = host, port
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    def _turn(self, prompt: list[int]) -> int:
        a, b = self._turn_marker
        return sum(1 for x, y in zip(prompt, prompt[1:], strict=False) if x == a and y == b) - 1

    def _choose(self, prompt: list[int]) -> list[int]:
        if self.select == "order":
            i = self.requests - 1  # counted before the reply is chosen
        elif self.select == "turn":
            i = max(self._turn(prompt), 0)
        else:
            i = int.from_bytes(hashlib.blake2b(repr(prompt[-256:]).encode(), digest_size=8).digest(), "big")
        return self.replies[i % len(self.replies)]

    async def _stream(
        self, request: web.Request, body: dict, prompt: list[int], out: list[int], finish: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {
            "id": f"cmpl-{self.requests}",
            "object": "text_completion",
            "model": body.get("model", "fast"),
        }

        def chunk(ids: list[int], finish_reason: str | None, first: bool) -> bytes:
            choice = {
                "index": 0,
                "text": "",
                "token_ids": ids,
                "finish_reason": finish_reason,
                "policy_version": self.policy_version,
                "prompt_token_ids": prompt if first and body.get("return_token_ids") else None,
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in ids],
                    "token_logprobs": [fake_logprob(t) for t in ids],
                    "top_logprobs": None,
                    "text_offset": None,
                },
            }
            return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

        for i, t in enumerate(out):
            if self.per_token_s:
                await asyncio.sleep(self.per_token_s)
            await resp.write(chunk([t], None, i == 0))
        await resp.write(chunk([], finish, not out))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            prompt = body["prompt"]
            if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
                raise TypeError
        except (json.JSONDecodeError, KeyError, TypeError):
            return web.json_response({"error": {"message": "prompt must be a list of token ids"}}, status=400)
        if self.max_model_len is not None and len(prompt) > self.max_model_len:
            message = (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(prompt)} tokens in the messages. Please reduce the length of the messages."
            )
            return web.json_response({"error": {"message": message, "code": 400}}, status=400)
        self.requests += 1
        max_tokens = int(body.get("max_tokens") or 16)
        stops = set(body.get("stop_token_ids") or [])
        out: list[int] = []
        finish = "length"
        for t in self._choose(prompt):
            if len(out) >= max_tokens:
                break
            out.append(t)
            if t in stops:
                finish = "stop"
                break
        else:
            if len(out) < max_tokens:
                finish = "stop"
        if body.get("stream"):
            return await self._stream(request, body, prompt, out, finish)
        if self.per_token_s:
            await asyncio.sleep(self.per_token_s * len(out))
        lps = [fake_logprob(t) for t in out]
        choice = {
            "index": 0,
            "text": "",
            "token_ids": out,
            "finish_reason": finish,
            "policy_version": self.policy_version,
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in out],
                "token_logprobs": lps,
                "top_logprobs": None,
                "text_offset": None,
            },
        }
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = prompt
        return web.json_response(
            {
                "id": f"cmpl-{self.requests}",
                "object": "text_completion",
                "model": body.get("model", "fast"),
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(out),
                    "total_tokens": len(prompt) + len(out),
                },
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fast-scripted", "object": "model"}]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        return app

    async def start_async(self) -> str:
        # stop() cancels replies still being "decoded" after 1 s instead of waiting for them (aiohttp: 60 s)
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://{self.host}:{port}"
        return self.base_url

    def start(self) -> str:
        """Serves from a background thread; returns the base URL."""
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start_async())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fast-engine", daemon=True)
        self._thread.start()
        ready.wait(30)
        return self.base_url

    def stop(self) -> None:
        if self._loop and self._runner:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread:
                self._thread.join(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fast engine server (trivial scripted model) for gateway tests")
    p.add_argument("--script", required=True, help="JSON file: list of {text} or {token_ids} replies")
    p.add_argument("--select", default="turn", choices=["turn", "hash", "order"])
    p.add_argument("--per-token-ms", type=float, default=0.0)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    from harnessrl.light_tokenizer import load_gateway_tokenizer

    with open(args.script) as f:
        replies = json.load(f)
    server = FastEngineServer(
        load_gateway_tokenizer(), replies, args.select, args.per_token_ms / 1000, port=args.port
    )

    async def serve() -> None:
        url = await server.start_async()
        print(f"READY {url}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
