"""Fixtures shared by the rollout tests: the real tokenizer and the gateway's fast engine server."""

import pytest

from harnessrl.components.gateway.fast_engine import FastEngineServer


@pytest.fixture(scope="module")
def tokenizer():
    from harnessrl.tinymodel import load_tokenizer

    return load_tokenizer()


@pytest.fixture
def fast_engine(tokenizer):
    """Starts FastEngineServer(tokenizer, replies, **kw) instances (real loopback HTTP) and stops them after."""
    servers = []

    def make(replies, **kw):
        server = FastEngineServer(tokenizer, replies, **kw)
        server.start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()
