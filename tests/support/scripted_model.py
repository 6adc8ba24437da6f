"""A scripted model server: a real loopback HTTP server speaking OpenAI chat completions, replying from a
fixed script. It is NOT a model — it exists to drive harness control flow deterministically in tests and to
measure harness/sandbox overhead with zero model time in benchmarks. Every request it receives is kept.

Script entries (one per request, in order; the last one repeats when the script runs out if `repeat_last`):
  {"content": "text"}                                       plain answer, no tool call
  {"content": "text", "finish_reason": "length"}            one cut at the request's max_tokens
  {"tool": "bash", "arguments": {"command": "ls"}}          one tool call (arguments dict or raw string)
  {"tool_calls": [{"tool": ..., "arguments": ...}, ...]}    several tool calls
  {"status": 503, "error": "..."}                           HTTP error
  {"sleep": 1.5, ...}                                       delay before answering
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedModelServer:
    def __init__(self, script: list[dict[str, Any]], repeat_last: bool = False):
        self.script = list(script)
        self.repeat_last = repeat_last
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def _next(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            index = len(self.requests)
            self.requests.append(body)
            if index < len(self.script):
                return self.script[index]
            if self.repeat_last and self.script:
                return self.script[-1]
            return {
                "status": 500,
                "error": f"scripted model: script exhausted after {len(self.script)} replies",
            }

    def start(self) -> str:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                body["_authorization"] = self.headers.get("Authorization", "")
                step = owner._next(body)
                if step.get("sleep"):
                    time.sleep(float(step["sleep"]))
                if "status" in step:
                    return self._send(
                        int(step["status"]), {"error": {"message": step.get("error", "scripted")}}
                    )
                self._send(200, _completion(body, step))

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _completion(request: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    calls = step.get("tool_calls") or ([step] if "tool" in step else [])
    tool_calls = []
    for i, call in enumerate(calls):
        args = call.get("arguments", {})
        tool_calls.append(
            {
                "id": f"call_{i}_{int(time.monotonic() * 1e6)}",
                "type": "function",
                "function": {
                    "name": call["tool"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    content = step.get("content", "")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    prompt_chars = sum(len(json.dumps(m)) for m in request.get("messages", []))
    completion_tokens = max(1, (len(content) + sum(len(json.dumps(c)) for c in tool_calls)) // 4)
    return {
        "id": "scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": step.get("finish_reason", "tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt_chars // 4,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_chars // 4 + completion_tokens,
        },
    }
