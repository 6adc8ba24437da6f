"""End to end with the real tiny model: `harnessrl engine serve` (SmolLM2-135M on transformers) as a real
process, the gateway in front of it, a harness on the OpenAI SDK. Then the engine process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest
from openai.types.chat import ChatCompletion

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.gateway.samples import build_samples
from tests.gateway.support import Messages, call_records, read_records


@pytest.fixture
def engine_process():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harnessrl.cli",
            "engine",
            "serve",
            "--port",
            "0",
            "--max-batch",
            "8",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"engine did not start: {line!r} {proc.stderr.read()[-2000:]}")
    yield proc, line.split()[-1]
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.mark.slow
def test_real_model_multi_turn_then_abort_resume_then_engine_killed(gateway, engine_process):
    proc, url = engine_process
    g, admin = gateway(HTTPEngine(url))
    s = admin.create_session("r-real", "task-real")
    client = openai.OpenAI(base_url=s.openai_base_url, api_key=s.api_key, max_retries=0, timeout=120)
    msgs: Messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colors."},
    ]
    for follow_up in ("And three animals?", None):
        r = client.chat.completions.create(model="p", messages=msgs, max_tokens=6, temperature=0.8, seed=1)
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        if follow_up:
            msgs.append({"role": "user", "content": follow_up})

    # an aborting pause mid-generation: the engine returns the partial tokens, the call resumes after resume
    out: dict[str, ChatCompletion] = {}
    msgs.append({"role": "user", "content": "Write a long story about a cat."})
    t = threading.Thread(
        target=lambda: out.setdefault(
            "r",
            client.chat.completions.create(model="p", messages=msgs, max_tokens=32, temperature=0.8, seed=2),
        )
    )
    t.start()
    deadline = time.monotonic() + 60
    while admin.metrics()["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    admin.pause("abort", timeout_s=60)
    admin.resume()
    t.join(120)
    assert out["r"].choices[0].finish_reason in ("stop", "length")

    calls = call_records(g.journal_dir)
    assert [c.op for c in calls] == ["new", "extend", "extend"]
    assert {c.drift for c in calls[1:]} <= {"clean", "realigned"}
    [sample] = build_samples(read_records(g.journal_dir))
    trained = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert trained == [t for c in calls for t in c.completion_ids]  # the sampled ids, verbatim
    lps = [lp for lp, m in zip(sample.behavior_logprobs, sample.loss_mask, strict=True) if m]
    assert lps == [lp for c in calls for lp in c.completion_logprobs] and all(lp <= 0 for lp in lps)
    # the engine answered the aborted request with its partial tokens; they were kept and continued from
    assert admin.metrics()["aborted_generations"] == 1
    # the engine's own stats (its `GET /stats`) come with the gateway's: later turns reused earlier turns' KV
    engine_stats = admin.metrics()["engine"]
    assert engine_stats["requests"] >= 4 and engine_stats["prefix_cache"]["hit_tokens"] > 0

    # the engine process dies: the harness gets a clear error, the rollout is marked failed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(
            model="p", messages=[*msgs, {"role": "user", "content": "more"}], max_tokens=8
        )
    assert e.value.status_code == 502 and "inference engine failed" in str(e.value)
    assert admin.session(s.session_id)["status"] == "failed"
    with pytest.raises(openai.ConflictError, match="engine error"):
        client.chat.completions.create(model="p", messages=msgs, max_tokens=8)
    [failed] = build_samples(read_records(g.journal_dir))
    assert failed.rollout_status == "failed"
