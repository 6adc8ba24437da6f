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
    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


def error_response(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status, headers=headers)


def journal_unavailable(e: JournalWriteError, retry_after_s: int) -> HTTPError:
    return HTTPError(503, "journal_unavailable", str(e), {"Retry-After": str(retry_after_s)})


def error_middleware(retry_after_s: int) -> Middleware:
    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except HTTPError as e:
            return error_response(e.status, e.kind, e.message, e.headers)
        except RequestError as e:
            return error_response(400, "invalid_request_error", str(e))
        except (DiffError, TemplateError) as e:
            msg = f"the model's chat template cannot render these messages: {e}"
            return error_response(400, "invalid_request_error", msg)
        except JournalWriteError as e:
            e503 = journal_unavailable(e, retry_after_s)
            return error_response(e503.status, e503.kind, e503.message, e503.headers)
        except web.HTTPException as e:  # aiohttp's own: unknown route, wrong method, body over the limit
            if e.status < 400:
                raise
            kind = (
                "not_found"
                if e.status == 404
                else "invalid_request_error"
                if e.status < 500
                else "server_error"
            )
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            return error_response(e.status, kind, f"{request.method} {request.path}: {e.reason}", allow)
        except Exception as e:
            logger.exception("%s %s failed", request.method, request.path)
            return error_response(500, "server_error", f"internal gateway error: {type(e).__name__}: {e}")

    return errors
