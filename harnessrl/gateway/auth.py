"""Who may call what: the admin token for /admin/*, a session's API key for its /sessions/{sid}/* routes."""

from __future__ import annotations

import hashlib
import secrets

from aiohttp import web

from .errors import HTTPError


def sha256_hex(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def new_api_key() -> str:
    return "hk-" + secrets.token_urlsafe(24)


def bearer(request: web.Request) -> str:
    """`Authorization: Bearer <key>` (OpenAI SDKs), else `x-api-key` (Anthropic SDKs)."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "")


def require_admin(request: web.Request, admin_token: str) -> None:
    if not secrets.compare_digest(bearer(request), admin_token):
        raise HTTPError(
            401, "authentication_error", "admin endpoints need 'Authorization: Bearer <admin token>'"
        )


def key_matches(request: web.Request, key_sha256: str) -> bool:
    return secrets.compare_digest(sha256_hex(bearer(request)), key_sha256)
