"""Fixtures: the real SmolLM2 tokenizer, the fast engine server (real loopback HTTP, trivial scripted model)
and in-process gateways on loopback."""

from __future__ import annotations

import json

import pytest

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
from tests.support.fast_engine import BASH_TOOL, FINAL_REPLY, TOOL_REPLY  # noqa: F401 - re-exported for the tests

ADMIN = "admin-secret"


@pytest.fixture
def gateway(tokenizer, tmp_path, fast_engine):
    """make(engine=None, journal=None, **config) -> (server, admin); default engine: a fresh fast engine."""
    servers = []

    def make(engine=None, journal=None, **config):
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


def read_records(journal_dir):
    with open(journal_dir / "journal.jsonl") as f:
        return [json.loads(line) for line in f]
