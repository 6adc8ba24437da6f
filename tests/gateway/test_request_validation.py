"""Bad input gets a JSON 4xx naming what is wrong, and leaves the session usable: sampling parameters
(NaN / inf / out of range / wrong type), max_tokens (0 was silently the default), stream options, malformed
bodies (lone surrogates, 100k-deep nesting, invalid UTF-8), unknown routes, admin fields; the engine's own
SamplingParams and server reject the same values; an engine that rejects a request leaves the session open."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator

import pytest

from harnessrl.engine.base import SamplingParams
from harnessrl.engine.http_client import HTTPEngine
from tests.gateway.support import ADMIN, Reply, call_records, send

OK_OPENAI = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
OK_ANTHROPIC = {"model": "p", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}

# (api, body fields as raw JSON text, the field the error must name)
BAD_PARAMS = [
    ("openai", '"temperature": NaN', "temperature"),
    ("openai", '"temperature": Infinity', "temperature"),
    ("openai", '"temperature": -0.5', "temperature"),
    ("openai", '"temperature": "hot"', "temperature"),
    ("openai", '"top_p": 0', "top_p"),
    ("openai", '"top_p": 1.5', "top_p"),
    ("openai", '"top_p": NaN', "top_p"),
    ("openai", '"seed": 1180591620717411303424', "seed"),  # 2**70
    ("openai", '"seed": 18446744073709551616', "seed"),  # 2**64
    ("openai", '"seed": "abc"', "seed"),
    ("openai", '"seed": 1.5', "seed"),
    ("openai", '"seed": true', "seed"),
    ("openai", '"max_tokens": 0', "max_tokens"),
    ("openai", '"max_tokens": -3', "max_tokens"),
    ("openai", '"max_tokens": "abc"', "max_tokens"),
    ("openai", '"max_tokens": []', "max_tokens"),
    ("openai", '"max_tokens": NaN', "max_tokens"),
    ("openai", '"max_tokens": 1.5', "max_tokens"),
    ("openai", '"max_tokens": true', "max_tokens"),
    ("openai", '"max_completion_tokens": 0', "max_completion_tokens"),
    ("openai", '"stream": true, "stream_options": []', "stream_options"),
    ("openai", '"stream": true, "stream_options": "usage"', "stream_options"),
    ("openai", '"stream": true, "stream_options": {"include_usage": "yes"}', "stream_options.include_usage"),
    ("openai", '"stream": "yes"', "stream"),
    ("openai", '"n": 2', "n"),
    ("openai", '"stop": [3]', "stop"),
    ("anthropic", '"max_tokens": 0', "max_tokens"),
    ("anthropic", '"max_tokens": true', "max_tokens"),
    ("anthropic", '"max_tokens": "abc"', "max_tokens"),
    ("anthropic", '"max_tokens": NaN', "max_tokens"),
    ("anthropic", '"max_tokens": null', "max_tokens"),
    ("anthropic", '"temperature": NaN', "temperature"),
    ("anthropic", '"top_p": -1', "top_p"),
    ("anthropic", '"stop_sequences": 3', "stop_sequences"),
]

MALFORMED_BODIES = [  # every endpoint that takes a body
    (b'{"model": "p", "messages": [{"role": "user", "content": "a\\ud800b"}]}', "lone UTF-16 surrogate"),
    (
        b'{"model": "p", "messages": [{"role": "user", "content": "x"}], "\\udfff": 1}',
        "lone UTF-16 surrogate",
    ),
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper than"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "not UTF-8"),
    (b"", "not valid JSON"),
    (b"{", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
]
MALFORMED_OPENAI = [
    (b'{"messages": [{"role": "user", "content": "x", "tool_calls": 5}]}', "messages[0].tool_calls"),
    (b'{"messages": "hi"}', "messages"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}', "tools"),
]


def _body(api: str, extra: str) -> bytes:
    """A valid request with `extra` (raw JSON members: NaN and Infinity are written as such) on top."""
    return json.dumps(
        {**(OK_OPENAI if api == "openai" else OK_ANTHROPIC), **json.loads("{" + extra + "}")}
    ).encode()


def _path(s, api: str) -> str:
    return (
        s.openai_base_url + "/chat/completions" if api == "openai" else s.anthropic_base_url + "/v1/messages"
    )


def test_invalid_sampling_params_are_400s_naming_the_field_and_the_session_stays_usable(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    wrong = []
    for api, extra, field in BAD_PARAMS:
        reply = send(_path(s, api), _body(api, extra), s.api_key)
        if reply.status != 400 or field not in reply.error():
            wrong.append((api, extra, reply.status, reply.body[:200]))
    assert wrong == []
    assert admin.session(s.session_id)["status"] == "active"
    for api, ok in (("openai", OK_OPENAI), ("anthropic", OK_ANTHROPIC)):
        assert send(_path(s, api), json.dumps(ok).encode(), s.api_key).status == 200
    assert admin.session(s.session_id)["calls"] == 2
    assert all(r.finish_reason for r in call_records(g.journal_dir))


def test_absent_or_null_max_tokens_is_the_default(gateway):
    g, admin = gateway(default_max_tokens=3)
    s = admin.create_session("r", "t")
    for extra in ({}, {"max_tokens": None, "temperature": None, "top_p": None, "seed": None}):
        body = json.dumps({"model": "p", "messages": [{"role": "user", "content": str(extra)}], **extra})
        reply = send(s.openai_base_url + "/chat/completions", body.encode(), s.api_key)
        assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] == 3


def test_malformed_bodies_and_routes_get_json_4xx(gateway):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    openai_url = s.openai_base_url + "/chat/completions"
    targets = [(openai_url, s.api_key), (s.anthropic_base_url + "/v1/messages", s.api_key)]
    admin_url = admin.base_url + "/admin/sessions"
    targets.append((admin_url, ADMIN))
    cases = [
        (url, key, raw, expect)
        for raw, expect in MALFORMED_BODIES
        for url, key in targets
        if raw or url != admin_url
    ]
    cases.append((admin_url, ADMIN, b"", "rollout_id"))  # an admin request without a body means {}
    cases += [(openai_url, s.api_key, raw, expect) for raw, expect in MALFORMED_OPENAI]
    wrong = []
    for url, key, raw, expect in cases:
        reply = send(url, raw, key)
        if reply.status != 400 or expect not in reply.error():
            wrong.append((url.rsplit("/", 2)[-1], raw[:60], reply.status, reply.body[:200]))
    assert wrong == []
    not_found = send(admin.base_url + "/nope", b"{}", ADMIN)
    assert not_found.status == 404 and "/nope" in not_found.error()
    wrong_method = send(openai_url, None, s.api_key, method="GET")
    assert wrong_method.status == 405 and wrong_method.error() and "POST" in wrong_method.headers["Allow"]
    assert admin.session(s.session_id)["status"] == "active"
    assert send(openai_url, json.dumps(OK_OPENAI).encode(), s.api_key).status == 200


@pytest.mark.parametrize("timeout", ['"abc"', "NaN", "-1", "[]", "true"])
def test_pause_with_a_bad_timeout_is_400_and_never_pauses(gateway, timeout):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    reply = send(
        admin.base_url + "/admin/pause", b'{"mode": "finish", "timeout_s": ' + timeout.encode() + b"}", ADMIN
    )
    assert reply.status == 400 and "timeout_s" in reply.error()
    assert send(admin.base_url + "/health", method="GET").json()["paused"] is False
    assert (
        send(s.openai_base_url + "/chat/completions", json.dumps(OK_OPENAI).encode(), s.api_key).status == 200
    )


def test_admin_fields_are_checked(gateway, tmp_path):
    g, admin = gateway()
    s = admin.create_session("r", "t")
    cases = [
        ("/admin/pause", {"mode": "later"}, "mode"),
        ("/admin/pause", {"mode": "abort", "hold_new": "yes"}, "hold_new"),
        (f"/admin/sessions/{s.session_id}/end", {"status": "maybe"}, "status"),
        (f"/admin/sessions/{s.session_id}/end", {"reason": 5}, "reason"),
        ("/admin/export", {"out_dir": str(tmp_path / "x"), "selection": "best"}, "selection"),
        ("/admin/export", {"out_dir": 5}, "out_dir"),
        ("/admin/export", {"out_dir": str(tmp_path / "x"), "rollout_id": 3}, "rollout_id"),
        ("/admin/sessions", {"rollout_id": "r"}, "group_id"),
    ]
    for path, body, field in cases:
        reply = send(admin.base_url + path, json.dumps(body).encode(), ADMIN)
        assert reply.status == 400 and field in reply.error(), (path, body, reply.body)
    (tmp_path / "file").write_text("")
    reply = send(
        admin.base_url + "/admin/export",
        json.dumps({"out_dir": str(tmp_path / "file" / "x")}).encode(),
        ADMIN,
    )
    assert reply.status == 400 and "out_dir" in reply.error()
    assert admin.session(s.session_id)["status"] == "active" and not admin.metrics()["paused"]


def test_an_engine_that_rejects_a_request_leaves_the_session_open(gateway, fast_engine):
    engine = fast_engine(max_model_len=60)  # vLLM-style 400 for longer prompts
    g, admin = gateway(HTTPEngine(engine.base_url))
    s = admin.create_session("r", "t")
    long = {"model": "p", "messages": [{"role": "user", "content": "word " * 200}], "max_tokens": 8}
    reply = send(s.openai_base_url + "/chat/completions", json.dumps(long).encode(), s.api_key)
    assert reply.status == 400 and "maximum context length" in reply.error()
    assert admin.session(s.session_id)["status"] == "active"
    assert (
        send(s.openai_base_url + "/chat/completions", json.dumps(OK_OPENAI).encode(), s.api_key).status == 200
    )


def test_sampling_params_reject_what_no_engine_can_sample_with():
    for kw, field in [
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.0001}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
    assert SamplingParams(temperature=0.0, top_p=1.0, seed=2**64 - 1).seed == 2**64 - 1


@contextlib.contextmanager
def _engine_server() -> Iterator[str]:
    """`harnessrl engine serve`'s app with the real tiny model, on a loopback port of a background loop."""
    from harnessrl.engine.local import LocalEngine
    from harnessrl.engine.server import serve

    engine = LocalEngine(max_batch=2, threads=1)
    loop = asyncio.new_event_loop()
    ready: asyncio.Future[str] = loop.create_future()
    task = loop.create_task(serve(engine, "127.0.0.1", 0, ready=ready))
    thread = threading.Thread(target=lambda: loop.run_until_complete(asyncio.wait([task])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not ready.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield ready.result()
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
        engine.close()


def test_engine_server_answers_400_for_the_same_values():
    with _engine_server() as url:
        for extra, field in [
            ('"temperature": NaN', "temperature"),
            ('"top_p": 2', "top_p"),
            ('"seed": 1180591620717411303424', "seed"),
            ('"max_tokens": NaN', "max_tokens"),
            ('"max_tokens": 1e400', "max_tokens"),  # the stdlib reads this as inf
            ('"max_tokens": 2.5', "max_tokens"),
        ]:
            body = b'{"prompt": [1, 2, 3], "max_tokens": 2, ' + extra.encode() + b"}"
            reply: Reply = send(url + "/v1/completions", body)
            assert reply.status == 400 and field in reply.error(), (extra, reply.status, reply.body[:300])
        assert send(url + "/v1/completions", b'{"prompt": [1, 2, 3], "max_tokens": 2}').status == 200
