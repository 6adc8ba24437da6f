"""HTTP errors of the gateway: every error reply is JSON `{"error": {"type", "message"}}`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from jinja2 import TemplateError

from .messages import RequestError
from .render import DiffError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HTTPError(Exception):
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except HTTPError as e:
        return error_response(e.status, e.kind, e.message, e.headers)
    except RequestError as e:
        return error_response(400, "invalid_request_error", str(e))
    except (DiffError, TemplateError) as e:
        msg = f"the model's chat template cannot render these messages: {e}"
        return error_response(400, "invalid_request_error", msg)
