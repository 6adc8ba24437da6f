"""Request bodies: size-limited, decoded to a JSON object (in a worker thread when large), with a clear 4xx
for everything that is not one."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web

from .config import GatewayConfig
from .errors import HTTPError
from .messages import RequestError

T = TypeVar("T")
MAX_DEPTH = 1024  # orjson's nesting limit


def too_large(size: int | str, limit: int) -> HTTPError:
    return HTTPError(
        413,
        "request_too_large",
        f"request body is {size} bytes; this gateway accepts at most {limit} bytes "
        "(GatewayConfig.max_request_bytes, `harnessrl gateway serve --max-request-mb`)",
    )


async def read_body(request: web.Request, config: GatewayConfig) -> bytes:
    limit = config.max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise too_large(request.content_length, limit)  # refused before a byte of it is read
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:  # no or a false Content-Length: aiohttp stops reading at the limit
        raise too_large(f"more than {limit}", limit) from None


def decode_json(raw: bytes) -> tuple[dict[str, Any], float]:
    """The JSON object in `raw` and the CPU seconds its decoding took (of the thread that ran it)."""
    cpu0 = time.thread_time()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        body = _decode_what_orjson_refuses(raw, e)
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    return body, time.thread_time() - cpu0


def _decode_what_orjson_refuses(raw: bytes, err: orjson.JSONDecodeError) -> Any:
    """NaN / Infinity literals (Python clients write them; the fields that matter reject them by name) go
    through the stdlib; too-deep nesting, invalid UTF-8 and lone surrogates are refused here."""
    if "depth" in str(err) or "recursion" in str(err):
        raise RequestError(f"request body nests deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise RequestError(f"request body nests deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError as e:
        raise RequestError(f"request body is not UTF-8 (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise RequestError(
            f"request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        ) from None
    where = _lone_surrogate(body, "")
    if where is not None:
        raise RequestError(
            f"request body{where}: a string holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
            "its pair), which is not a Unicode character"
        )
    return body


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The JSON path of the first string (or key) that cannot be encoded as UTF-8, or None."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return path
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:  # keys are shown escaped: the message itself must be valid UTF-8
        sub = (
            f"{path}.{k.encode('ascii', 'backslashreplace').decode()}"
            if isinstance(k, str)
            else f"{path}[{k}]"
        )
        found = _lone_surrogate(k, sub) if isinstance(k, str) else None
        found = found or _lone_surrogate(v, sub)
        if found is not None:
            return found
    return None


class Offload:
    """Runs the CPU-heavy steps of large requests in worker threads, a few at a time."""

    def __init__(self, config: GatewayConfig) -> None:
        self.threshold = config.offload_bytes
        self._slots = asyncio.Semaphore(config.offload_concurrency)

    async def run(self, large: bool, fn: Callable[..., T], *args: Any) -> T:
        if not large:
            return fn(*args)
        async with self._slots:
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def read_json(
    request: web.Request, config: GatewayConfig, offload: Offload
) -> tuple[dict[str, Any], float, bool]:
    """(body, decoding CPU seconds, whether it is large enough to be handled off the event loop)."""
    raw = await read_body(request, config)
    large = len(raw) > offload.threshold
    body, cpu = await offload.run(large, decode_json, raw)
    return body, cpu, large


async def read_small_json(request: web.Request, config: GatewayConfig) -> dict[str, Any]:
    """Admin bodies (small); an absent body is `{}`."""
    if not request.can_read_body:
        return {}
    return decode_json(await read_body(request, config))[0]
