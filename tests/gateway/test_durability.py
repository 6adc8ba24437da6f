"""Journal durability: kill -9 of a gateway process under load loses no acknowledged record; group commit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import openai

from harnessrl.gateway import GatewayAdmin
from harnessrl.gateway.client import SessionInfo
from harnessrl.gateway.enums import NoticeKind
from harnessrl.gateway.journal import Journal, read_journal
from harnessrl.gateway.records import CallRecord, NoticeRecord
from tests.gateway.support import ADMIN, Messages, call_records


def _spawn_gateway(engine_url: str, journal) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harnessrl.cli",
            "gateway",
            "serve",
            "--engine-url",
            engine_url,
            "--journal",
            str(journal),
            "--admin-token",
            ADMIN,
            "--drift-check-every",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise AssertionError(f"gateway did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, line.split()[1]


def test_kill_9_under_load_loses_no_acknowledged_record(fast_engine, tmp_path):
    engine = fast_engine([{"text": "step"}, {"text": "again"}], per_token_s=0.002)
    journal = tmp_path / "journal"
    proc, url = _spawn_gateway(engine.base_url, journal)
    admin = GatewayAdmin(url, ADMIN)
    sessions = [admin.create_session(f"r{i}", "g") for i in range(12)]
    acked: list[str] = []
    convs: dict[str, Messages] = {}
    stop = threading.Event()

    def harness(s: SessionInfo) -> None:
        client = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0, timeout=30)
        msgs: Messages = [{"role": "user", "content": f"task {s.session_id}"}]
        while not stop.is_set():
            try:
                r = client.chat.completions.create(model="p", messages=msgs, max_tokens=8)
            except openai.APIError:
                return  # the gateway died mid-call: this call was never acknowledged
            acked.append(r.id.removeprefix("chatcmpl-"))
            msgs = [
                *msgs,
                {"role": "assistant", "content": r.choices[0].message.content},
                {"role": "user", "content": "more"},
            ]
            convs[s.session_id] = msgs

    threads = [threading.Thread(target=harness, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 120 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # mid-load: calls are in flight right now
    proc.wait()
    stop.set()
    for t in threads:
        t.join(30)
    assert len(acked) >= 120

    journaled = {r.call_id for r in read_journal(journal) if isinstance(r, CallRecord)}
    assert set(acked) <= journaled, f"lost {len(set(acked) - journaled)} acknowledged records"

    proc2, url2 = _spawn_gateway(engine.base_url, journal)
    try:
        admin2 = GatewayAdmin(url2, ADMIN)
        assert admin2.metrics()["recovered_calls"] == len(journaled)
        # a recovered session continues its chain with its old key
        s = sessions[0]
        base = f"{url2}/sessions/{s.session_id}/v1"
        client = openai.OpenAI(base_url=base, api_key=s.api_key, max_retries=0)
        client.chat.completions.create(model="p", messages=convs[s.session_id], max_tokens=8)
        calls = call_records(journal)
        last = calls[-1]
        before = [r for r in calls[:-1] if r.session_id == s.session_id][-1]
        assert last.session_id == s.session_id
        if before.call_id in acked:
            assert last.op == "extend"
        else:  # journaled when killed but never answered: the harness's retry rolls that turn back
            assert last.op == "rollback" and last.discarded_trainable == len(before.completion_ids)
        out = admin2.export(str(tmp_path / "export"))
        assert out["records"] == len(journaled) + 1 and out["samples"] >= len(sessions)
    finally:
        proc2.send_signal(signal.SIGTERM)
        proc2.wait(30)


def test_torn_tail_is_cut_and_group_commit_batches_fsyncs(tmp_path):
    async def run() -> Journal:
        j = Journal(tmp_path)
        await asyncio.gather(*(j.append(_notice(i)) for i in range(200)))
        return j

    j = asyncio.run(run())
    assert j.records_written == 200 and j.fsyncs < 200  # concurrent appends share fsyncs
    j.close()
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'{"type": "notice", "session_id": "s", "ki')  # a write cut by a crash
    assert len(list(read_journal(tmp_path))) == 200
    j2 = Journal(tmp_path)  # reopening cuts the torn tail so new records start on a clean line
    asyncio.run(j2.append(_notice(200)))
    j2.close()
    assert [r.prompt_tokens for r in read_journal(tmp_path) if isinstance(r, NoticeRecord)][-2:] == [199, 200]


def _notice(i: int) -> NoticeRecord:
    return NoticeRecord("s", NoticeKind.CONTEXT_EXHAUSTED, i)


def test_second_gateway_on_one_journal_is_refused(tmp_path):
    j = Journal(tmp_path)
    try:
        try:
            Journal(tmp_path)
        except RuntimeError as e:
            assert "another gateway process" in str(e)
        else:
            raise AssertionError("a second journal writer was allowed")
    finally:
        j.close()
