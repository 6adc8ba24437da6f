"""A client that disconnects while its call's record is being fsynced: the record is journaled, so the live
chains must hold the call too (they did not: the handler was cancelled between the journal and the commit;
31 of 32 sessions then diverged from what a restart rebuilds, and the harness's retry became a new chain — an
extra trainable sample the harness never saw)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import threading
import time
import urllib.parse

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway import GatewayServer
from harnessrl.gateway.samples import build_samples
from tests.gateway.support import call_records, read_records, send

N = 16
MSGS = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files."},
]


def _snapshot(g: GatewayServer, sid: str) -> tuple:
    s = g.sessions[sid]
    chains = {
        cid: (c.tokens, c.mask, c.logprobs, c.versions, c.nodes, c.last_prompt_node, c.busy)
        for cid, c in s.chains.chains.items()
    }
    return s.calls, chains


def _send_and_hold(url: str, key: str) -> socket.socket:
    """Sends a chat request on a raw socket and returns it unread (closed later: the client leaves)."""
    u = urllib.parse.urlsplit(url)
    body = json.dumps({"model": "p", "messages": MSGS, "max_tokens": 16}).encode()
    head = (
        f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection((u.hostname, u.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
    sock.sendall(head.encode() + body)
    return sock


def test_clients_leaving_mid_fsync_leave_live_state_equal_to_what_recovery_rebuilds(
    gateway, fast_engine, tmp_path, monkeypatch
):
    engine = fast_engine()
    g, admin = gateway(HTTPEngine(engine.base_url), drift_check_every=0)
    sessions = [admin.create_session(f"r{i}", "g") for i in range(N)]

    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:  # the real fsync, after the clients have gone
        in_fsync.set()
        release.wait(60)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    socks = [_send_and_hold(s.openai_base_url + "/chat/completions", s.api_key) for s in sessions]
    deadline = time.monotonic() + 30
    while (engine.requests < N or not in_fsync.is_set()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.requests == N and in_fsync.is_set()
    time.sleep(0.3)  # every call has its record queued behind the fsync
    for sock in socks:
        sock.close()
    time.sleep(0.5)  # the gateway sees the disconnects and cancels the handlers
    release.set()
    deadline = time.monotonic() + 10
    while len(call_records(g.journal_dir)) < N and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(call_records(g.journal_dir)) == N  # journaled, though no client got an answer
    deadline = time.monotonic() + 5
    while sum(g.sessions[s.session_id].calls for s in sessions) < N and time.monotonic() < deadline:
        time.sleep(0.05)

    copy = tmp_path / "recovered"
    copy.mkdir()
    shutil.copy(g.journal_dir / "journal.jsonl", copy / "journal.jsonl")
    recovered, _ = gateway(HTTPEngine(engine.base_url), journal=copy, drift_check_every=0)
    diverged = [
        s.session_id for s in sessions if _snapshot(g, s.session_id) != _snapshot(recovered, s.session_id)
    ]
    assert diverged == []
    assert all(_snapshot(g, s.session_id)[0] == 1 for s in sessions)

    # each harness retries the call it never got an answer to: a rollback of the orphaned turn, not a new chain
    for s in sessions:
        body = json.dumps({"model": "p", "messages": MSGS, "max_tokens": 16}).encode()
        assert send(s.openai_base_url + "/chat/completions", body, s.api_key).status == 200
    retries = call_records(g.journal_dir)[N:]
    assert [r.op for r in retries] == ["rollback"] * N
    assert len(build_samples(read_records(g.journal_dir))) == N  # one chain per harness conversation
