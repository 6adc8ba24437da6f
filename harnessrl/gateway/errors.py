"""HTTP errors of the gateway: every error reply is JSON `{"error": {"type", "message"}}` — 4xx for what the
client sent, 503 when the journal cannot record (retry later), 502 for engine failures, 500 for our bugs."""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from jinja2 import TemplateError

from .journal import JournalWriteError
from .messages import RequestError
from .render import DiffError

logger = logging.getLogger(__name__)


class HTTPError(Exception):
    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}
        self.code = code  # OpenAI's machine-readable `error.code` (e.g. context_length_exceeded)


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors); an Anthropic client (Claude
# Code) branches on them, e.g. `not_found_error` for an unknown model or route.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def is_anthropic(request: web.Request) -> bool:
    """A request of the Anthropic API (its route, or the `anthropic-version` header its SDKs send)."""
    return "anthropic-version" in request.headers or "/v1/messages" in request.path


def error_response(
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str] | None = None,
    anthropic: bool = False,
    code: str | None = None,
) -> web.Response:
    """`{"type": "error", "error": {"type", "message"}}`: OpenAI's shape plus the `type` Anthropic's has;
    Anthropic requests get Anthropic's error types (`api_error` for the 5xx without one of their own)."""
    if anthropic:
        kind = ANTHROPIC_ERROR_TYPES.get(status) or (
            "api_error" if status >= 500 else "invalid_request_error"
        )
    error: dict[str, str] = {"type": kind, "message": message}
    if code is not None:
        error["code"] = code
    return web.json_response({"type": "error", "error": error}, status=status, headers=headers)


def journal_unavailable(e: JournalWriteError, retry_after_s: int) -> HTTPError:
    return HTTPError(503, "journal_unavailable", str(e), {"Retry-After": str(retry_after_s)})


def error_middleware(retry_after_s: int) -> Middleware:
    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except Exception as e:
            return _error_reply(request, e, retry_after_s)

    return errors


def _error_reply(request: web.Request, e: Exception, retry_after_s: int) -> web.Response:
    anthropic = is_anthropic(request)
    if isinstance(e, HTTPError):
        return error_response(e.status, e.kind, e.message, e.headers, anthropic, e.code)
    if isinstance(e, RequestError):
        return error_response(400, "invalid_request_error", str(e), anthropic=anthropic)
    if isinstance(e, DiffError | TemplateError):
        msg = f"the model's chat template cannot render these messages: {e}"
        return error_response(400, "invalid_request_error", msg, anthropic=anthropic)
    if isinstance(e, JournalWriteError):
        e503 = journal_unavailable(e, retry_after_s)
        return error_response(e503.status, e503.kind, e503.message, e503.headers, anthropic)
    if isinstance(e, web.HTTPException):  # aiohttp's own: unknown route, wrong method, body over the limit
        if e.status < 400:
            raise e
        kind = (
            "not_found" if e.status == 404 else "invalid_request_error" if e.status < 500 else "server_error"
        )
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        return error_response(
            e.status, kind, f"{request.method} {request.path}: {e.reason}", allow, anthropic
        )
    logger.exception("%s %s failed", request.method, request.path)
    return error_response(
        500, "server_error", f"internal gateway error: {type(e).__name__}: {e}", anthropic=anthropic
    )
