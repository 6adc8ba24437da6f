"""Stopping a gateway with a call still generating: the RL loop stops its gateway while abandoned rollouts may
still be generating; `stop()` must return, not wait for them (it raised TimeoutError after 30 s: aiohttp's
graceful shutdown waits up to 60 s for handlers in flight, failing `harnessrl stage rl` after its last step)."""

from __future__ import annotations

import http.client
import threading
import time

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.server import STOP_GRACE_S
from tests.gateway.support import send


def test_stop_returns_while_a_call_is_still_generating(gateway, fast_engine):
    engine = fast_engine(per_token_s=2.0)  # a reply of a dozen tokens takes ~30 s
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    body = b'{"model": "p", "messages": [{"role": "user", "content": "List the files."}], "max_tokens": 16}'

    def call() -> None:
        try:
            send(s.openai_base_url + "/chat/completions", body, s.api_key)
        except (OSError, http.client.HTTPException):  # the stopping gateway drops the connection
            pass

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 30
    while engine.requests < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.requests == 1  # the call is at the engine, generating

    t0 = time.monotonic()
    g.stop()
    assert time.monotonic() - t0 < STOP_GRACE_S + 10
