"""Sessions: one per rollout, each with its own API key, chains and status; created and ended through the
journal (a session exists once its record is durable, and a journaled change is always applied live)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from .auth import key_matches, new_api_key, sha256_hex
from .chains import ChainSet
from .config import GatewayConfig
from .enums import SessionStatus, TrainChains
from .errors import HTTPError
from .journal import Journal, shielded
from .messages import MessageHasher, PlainMessageCache
from .records import SessionEndRecord, SessionRecord, status_after
from .render import ChatRenderer

T = TypeVar("T")


@dataclass
class Session:
    session_id: str
    rollout_id: str
    group_id: str
    key_sha256: str
    chains: ChainSet
    message_cache: PlainMessageCache = field(default_factory=PlainMessageCache)
    status: SessionStatus = SessionStatus.ACTIVE
    reason: str | None = None
    calls: int = 0
    created_at: float = field(default_factory=time.time)
    train_chains: TrainChains = TrainChains.ALL
    reply_tokens: int | None = None  # each call's output tokens at most, whatever it asks (None: no cap)
    context_tokens: int | None = None  # prompt + reply of a call at most (None: the gateway's max_model_len)
    # Held while its chains change (plan, commit, release): a large request plans in a worker thread.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def view(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "rollout_id": self.rollout_id,
            "group_id": self.group_id,
            "status": self.status.value,
            "reason": self.reason,
            "calls": self.calls,
            "chains": len(self.chains.chains),
            "train_chains": self.train_chains.value,
            "reply_tokens": self.reply_tokens,
            "context_tokens": self.context_tokens,
        }


class SessionStore:
    def __init__(self, journal: Journal, renderer: ChatRenderer, config: GatewayConfig) -> None:
        self.journal = journal
        self.renderer = renderer
        self.config = config
        self.sessions: dict[str, Session] = {}

    def _chainset(self) -> ChainSet:
        return ChainSet(self.renderer, MessageHasher(), self.config.rollback_any_depth)

    # -- applying records (live and on recovery) --------------------------------------------------------
    def add(self, rec: SessionRecord) -> Session:
        s = Session(rec.session_id, rec.rollout_id, rec.group_id, rec.key_sha256, self._chainset())
        s.created_at, s.train_chains = rec.created_at, rec.train_chains
        s.reply_tokens, s.context_tokens = rec.reply_tokens, rec.context_tokens
        self.sessions[rec.session_id] = s
        return s

    def apply_end(self, rec: SessionEndRecord) -> None:
        s = self.sessions.get(rec.session_id)
        if s is not None and s.status is not SessionStatus.FAILED:
            s.status, s.reason = status_after(s.status, rec), rec.reason

    # -- live ---------------------------------------------------------------------------------------------
    async def create(
        self,
        rollout_id: str,
        group_id: str,
        train_chains: TrainChains = TrainChains.ALL,
        reply_tokens: int | None = None,
        context_tokens: int | None = None,
    ) -> tuple[Session, str]:
        """A new session and its API key (only the key's hash is kept)."""
        key = new_api_key()
        sid = "s-" + uuid.uuid4().hex[:16]
        rec = SessionRecord(
            sid,
            rollout_id,
            group_id,
            sha256_hex(key),
            time.time(),
            train_chains,
            reply_tokens,
            context_tokens,
        )
        return await shielded(self._journaled(rec, lambda: self.add(rec))), key

    async def end(self, s: Session, status: SessionStatus, reason: str | None) -> None:
        if s.status is SessionStatus.FAILED:
            return
        rec = SessionEndRecord(s.session_id, status, reason, time.time())
        await shielded(self._journaled(rec, lambda: self.apply_end(rec)))

    async def _journaled(self, rec: SessionRecord | SessionEndRecord, apply: Callable[[], T]) -> T:
        await self.journal.append(rec)
        return apply()

    def get(self, sid: str) -> Session:
        s = self.sessions.get(sid)
        if s is None:
            raise HTTPError(404, "not_found", f"unknown session {sid!r}")
        return s

    def authenticated(self, request: web.Request) -> Session:
        sid = request.match_info["sid"]
        s = self.sessions.get(sid)
        if s is None or not key_matches(request, s.key_sha256):
            raise HTTPError(401, "authentication_error", f"unknown session {sid!r} or wrong api key")
        return s
