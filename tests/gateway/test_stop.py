"""Stopping a gateway with a call still generating: the RL loop stops its gateway while abandoned rollouts may
still be generating; `stop()` must return, not wait for them (it raised TimeoutError after 30 s: aiohttp's
graceful shutdown waits up to 60 s for handlers in flight, failing `harnessrl stage rl` after its last step)."""

from __future__ import annotations

import gc
import http.client
import threading
import time
import weakref

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayAdmin, GatewayServer
from harnessrl.gateway.client import ADMIN_CALL_TIMEOUT_S
from harnessrl.gateway.server import STOP_GRACE_S
from tests.gateway.support import ADMIN, send


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


def test_sessions_ended_while_the_gateway_stops_return_within_the_admin_timeout(gateway, fast_engine):
    """The RL loop stops its gateway while abandoned rollouts end their sessions. A request whose connection is
    accepted as the listening socket closes can be left unread on an open connection (seen in CI: the rollout
    threads, which the process joins at exit, then waited out the client's 600 s timeout and `stage rl` hung
    after its last step). Session calls are quick, so the client gives them ADMIN_CALL_TIMEOUT_S."""
    g, admin = gateway(HTTPEngine(fast_engine().base_url))
    sessions = [admin.create_session(f"r{i}", "t") for i in range(8)]
    stopping = threading.Event()
    finished: list[float] = []

    def end_sessions_until_stopped(session) -> None:
        while not stopping.is_set() or g._loop is not None:
            try:
                admin.end_session(session.session_id, "failed", "abandoned")
            except Exception:
                pass
        finished.append(time.monotonic())

    threads = [threading.Thread(target=end_sessions_until_stopped, args=(s,), daemon=True) for s in sessions]
    for t in threads:
        t.start()
    time.sleep(0.2)
    stopping.set()
    t0 = time.monotonic()
    g.stop()
    for t in threads:
        t.join(timeout=STOP_GRACE_S + ADMIN_CALL_TIMEOUT_S + 20)
    assert len(finished) == len(sessions), (
        f"{len(sessions) - len(finished)} clients still waiting on the gateway"
    )
    assert max(finished) - t0 < STOP_GRACE_S + ADMIN_CALL_TIMEOUT_S + 10


def test_a_stopped_gateway_keeps_nothing_of_its_engine_alive(tokenizer, tmp_path, fast_engine):
    """A process that runs gateway after gateway (evaluation: one per policy; the test suite) must get each
    engine's memory back when its gateway stops: aiohttp's process-wide cache of middleware-wrapped handlers
    held the gateway's bound methods, and through them the engine (a whole model for an in-process one)."""
    engine = HTTPEngine(fast_engine().base_url)
    g = GatewayServer(engine, tokenizer, tmp_path / "journal", ADMIN)
    s = GatewayAdmin(g.start(), ADMIN).create_session("r", "t")
    body = b'{"model": "p", "messages": [{"role": "user", "content": "List the files."}], "max_tokens": 4}'
    send(s.openai_base_url + "/chat/completions", body, s.api_key)
    gone = weakref.ref(engine)
    g.stop()
    del engine, g
    gc.collect()
    assert gone() is None
