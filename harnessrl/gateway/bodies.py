"""Request bodies: a JSON object, and the CPU seconds its decoding took."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from .journal import loads
from .messages import RequestError


async def read_json(request: web.Request) -> tuple[dict[str, Any], float]:
    raw = await request.read()
    cpu0 = time.thread_time()
    try:
        body = loads(raw)
    except ValueError:
        raise RequestError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body, time.thread_time() - cpu0


async def read_optional_json(request: web.Request) -> dict[str, Any]:
    """Admin requests whose body may be left out."""
    return (await read_json(request))[0] if request.can_read_body else {}
