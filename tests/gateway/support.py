"""Fixtures: the real SmolLM2 tokenizer, the fast engine server (real loopback HTTP, trivial scripted model)
and in-process gateways on loopback; typed helpers for journals and SDK messages."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
)

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
from harnessrl.gateway.journal import read_journal
from harnessrl.gateway.records import CallRecord, Record
from tests.support.fast_engine import BASH_TOOL, FINAL_REPLY, TOOL_REPLY  # noqa: F401 - re-exported for the tests

ADMIN = "admin-secret"

Messages = list[ChatCompletionMessageParam]
MakeGateway = Callable[..., tuple[GatewayServer, GatewayAdmin]]


@pytest.fixture
def gateway(tokenizer, tmp_path: Path, fast_engine) -> Iterator[MakeGateway]:
    """make(engine=None, journal=None, **config) -> (server, admin); default engine: a fresh fast engine."""
    servers: list[GatewayServer] = []

    def make(
        engine: Any = None, journal: Path | None = None, **config: Any
    ) -> tuple[GatewayServer, GatewayAdmin]:
        if engine is None:
            engine = HTTPEngine(fast_engine().base_url)
        cfg = GatewayConfig(**{"drift_check_every": 1, **config})
        g = GatewayServer(
            engine, tokenizer, journal or tmp_path / f"journal{len(servers)}", ADMIN, config=cfg
        )
        url = g.start()
        servers.append(g)
        return g, GatewayAdmin(url, ADMIN)

    yield make
    for g in servers:
        g.stop()


def read_records(journal_dir: str | os.PathLike) -> list[Record]:
    return list(read_journal(journal_dir))


def call_records(journal_dir: str | os.PathLike) -> list[CallRecord]:
    return [r for r in read_journal(journal_dir) if isinstance(r, CallRecord)]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        """The message of a JSON error reply (asserts the shape every gateway error has)."""
        assert self.headers.get("Content-Type", "").startswith("application/json"), (self.status, self.body)
        err = self.json()["error"]
        assert isinstance(err["type"], str) and isinstance(err["message"], str)
        return err["message"]


def send(url: str, data: bytes | None = None, key: str | None = None, method: str = "POST") -> Reply:
    """One raw HTTP request (bodies no SDK would send); any status comes back as a Reply."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return Reply(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as e:
        return Reply(e.code, dict(e.headers), e.read())


def assistant_param(m: ChatCompletionMessage) -> ChatCompletionAssistantMessageParam:
    """A reply as a harness sends it back in the next request."""
    out: ChatCompletionAssistantMessageParam = {"role": "assistant", "content": m.content}
    calls: list[ChatCompletionMessageFunctionToolCallParam] = [
        {
            "id": tc.id,
            "type": "function",
            "function": {"name": tc.function.name, "arguments": tc.function.arguments},
        }
        for tc in m.tool_calls or []
        if tc.type == "function"
    ]
    if calls:
        out["tool_calls"] = calls
    return out
