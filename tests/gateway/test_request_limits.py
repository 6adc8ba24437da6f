"""Request size: bodies over the limit (8 MiB by default, `--max-request-mb`) are refused with a JSON 413 before
they are read (the limit was 1 GiB: a 50 MB body froze the event loop for seconds and took GBs of RSS), and a
large body under the limit is decoded and rendered off the event loop, so /health keeps answering."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.parse

from harnessrl.gateway import GatewayAdmin
from tests.gateway.support import ADMIN, send

OK = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _chat(text: str) -> bytes:
    return json.dumps(
        {"model": "p", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    ).encode()


def test_a_body_over_the_default_limit_is_a_json_413_and_the_session_stays_usable(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    t0 = time.monotonic()
    reply = send(s.openai_base_url + "/chat/completions", _chat("x" * (9 << 20)), s.api_key)
    assert reply.status == 413 and "at most 8388608 bytes" in reply.error()
    assert time.monotonic() - t0 < 10  # refused from its Content-Length, not decoded and rendered
    assert send(s.openai_base_url + "/chat/completions", json.dumps(OK).encode(), s.api_key).status == 200
    assert admin.session(s.session_id)["calls"] == 1


def test_a_chunked_body_is_cut_off_at_the_limit(gateway):
    g, admin = gateway(max_request_bytes=64 << 10)
    s = admin.create_session("r", "t")
    url = urllib.parse.urlsplit(s.openai_base_url + "/chat/completions")
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    body = _chat("y" * (200 << 10))
    chunks = (body[i : i + 8192] for i in range(0, len(body), 8192))  # no Content-Length: chunked
    conn.request(
        "POST", url.path, body=chunks, headers={"Authorization": f"Bearer {s.api_key}"}, encode_chunked=True
    )
    resp = conn.getresponse()
    payload = json.loads(resp.read())
    assert resp.status == 413 and "at most 65536 bytes" in payload["error"]["message"]
    conn.close()
    assert send(s.openai_base_url + "/chat/completions", _chat("z" * (60 << 10)), s.api_key).status == 200


def test_serve_takes_the_limit_from_the_command_line(fast_engine, tmp_path):
    engine = fast_engine()
    cmd = [sys.executable, "-m", "harnessrl.cli", "gateway", "serve", "--engine-url", engine.base_url]
    cmd += ["--journal", str(tmp_path / "j"), "--admin-token", ADMIN, "--max-request-mb", "0.25"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY "), line
        s = GatewayAdmin(line.split()[1], ADMIN).create_session("r", "t")
        reply = send(s.openai_base_url + "/chat/completions", _chat("x" * (300 << 10)), s.api_key)
        assert reply.status == 413 and "at most 262144 bytes" in reply.error()
        assert (
            send(s.openai_base_url + "/chat/completions", _chat("x" * (200 << 10)), s.api_key).status == 200
        )
    finally:
        proc.terminate()
        proc.wait(30)


def test_health_answers_while_a_large_body_is_rendered(gateway):
    """~6 MiB of text: about a million tokens to render, seconds of CPU. The event loop must not wait for it."""
    g, admin = gateway(drift_check_every=0)
    s = admin.create_session("r", "t")
    waits: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            assert send(admin.base_url + "/health", method="GET").status == 200
            waits.append(time.perf_counter() - t0)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    t0 = time.perf_counter()
    reply = send(
        s.openai_base_url + "/chat/completions", _chat("fix the bug in parse_date " * 240_000), s.api_key
    )
    took = time.perf_counter() - t0
    done.set()
    poller.join(30)
    assert (
        reply.status == 200 and reply.json()["choices"][0]["finish_reason"] == "length"
    )  # over max_model_len
    assert took > 1.0  # the work was real
    assert len(waits) > 10 and max(waits) < 0.5 * took and max(waits) < 1.0, (max(waits), took)
