"""Fixtures: the real SmolLM2 tokenizer, the fast engine server (real loopback HTTP, trivial scripted model)
and in-process gateways on loopback."""

from __future__ import annotations

import json

import pytest

from harnessrl.components.engine.http_client import HTTPEngine
from harnessrl.components.gateway import GatewayAdmin, GatewayConfig, GatewayServer
from harnessrl.components.gateway.fast_engine import FastEngineServer

ADMIN = "admin-secret"

TOOL_REPLY = ('I will list the files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
FINAL_REPLY = "The repository has two files: a.py and b.py."

BASH_TOOL = {"type": "function", "function": {"name": "bash", "description": "run a shell command",
                                              "parameters": {"type": "object",
                                                             "properties": {"command": {"type": "string"}},
                                                             "required": ["command"]}}}


@pytest.fixture(scope="session")
def tokenizer():
    from harnessrl.tinymodel import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def fast_engine(tokenizer):
    servers = []

    def make(replies=None, **kw):
        s = FastEngineServer(tokenizer, replies or [{"text": TOOL_REPLY}, {"text": FINAL_REPLY}], **kw)
        s.start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def gateway(tokenizer, tmp_path, fast_engine):
    """make(engine=None, journal=None, **config) -> (server, admin); default engine: a fresh fast engine."""
    servers = []

    def make(engine=None, journal=None, **config):
        if engine is None:
            engine = HTTPEngine(fast_engine().base_url)
        cfg = GatewayConfig(**{"drift_check_every": 1, **config})
        g = GatewayServer(engine, tokenizer, journal or tmp_path / f"journal{len(servers)}", ADMIN, config=cfg)
        url = g.start()
        servers.append(g)
        return g, GatewayAdmin(url, ADMIN)

    yield make
    for g in servers:
        g.stop()


def read_records(journal_dir):
    with open(journal_dir / "journal.jsonl") as f:
        return [json.loads(line) for line in f]
