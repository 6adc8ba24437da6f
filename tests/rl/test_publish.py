"""`harnessrl stage rl --weight-sync broadcast`: the loop trains against a real `harnessrl engine serve` process
and every sync reaches it by gloo broadcast, with no weight files written, and the engine's own figures reach
every step record; an in-process engine is refused in one line before anything is trained."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from harnessrl.engine.http_client import HTTPEngine
from harnessrl.io import read_jsonl
from harnessrl.tinymodel import load_model, load_tokenizer
from tests.engine.support import GREEDY
from tests.rl.test_stage import REPO, _config, rl_command
from tests.support.weight_sync import close, serve_process, teacher_forced


@pytest.mark.slow
def test_stage_rl_syncs_a_served_engine_by_broadcast(rl_policy: Path, prompt_tasks: Path, tmp_path: Path):
    proc, url = serve_process(rl_policy)
    try:
        out = tmp_path / "out"
        cmd = rl_command(
            prompt_tasks, rl_policy, out, "--mode", "sync", "--steps", "2", "--engine-url", url,
            "--weight-sync", "broadcast", "--config", _config(tmp_path),
        )  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

        async def ask() -> tuple[dict, list[int], list[int], list[float]]:
            client = HTTPEngine(url)
            try:
                prompt = load_tokenizer(rl_policy).encode("Reply with only the word 'the'.")
                gen = await client.generate(prompt, GREEDY, 6)
                return await client._call("GET", "/health"), prompt, gen.token_ids, gen.logprobs
            finally:
                await client.release()

        health, prompt, tokens, logprobs = asyncio.run(ask())
    finally:
        proc.kill()
        proc.wait()
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    rows = list(read_jsonl(out / "steps.jsonl"))
    trained = [r for r in rows if r["outcome"] == "trained"]
    assert trained, "no step trained: the small policy's groups had no reward variance"
    assert summary["version"] == len(trained) == health["policy_version"]
    assert all(r["weight_sync_s"] > 0 for r in trained)
    # the served engine's figures reach every step and the summary (GET /stats, awaited on the gateway's loop)
    assert all(r["engine_idle_frac"] is not None and 0 <= r["engine_idle_frac"] <= 1 for r in rows), rows
    assert summary["decode_tokens_per_s"] > 0 and summary["prefill_tokens_per_s"] > 0, summary
    assert not (out / "work" / "sync").exists()  # nothing written for the engine to read
    final = load_model(out / "model").eval()
    assert close(logprobs, teacher_forced(final, prompt, tokens))  # the engine serves the trained policy
    assert not close(logprobs, teacher_forced(load_model(rl_policy).eval(), prompt, tokens), tol=1e-4)


def test_stage_refuses_broadcast_to_an_in_process_engine(rl_policy: Path, prompt_tasks: Path, tmp_path: Path):
    cmd = rl_command(prompt_tasks, rl_policy, tmp_path / "out", "--steps", "1", "--weight-sync", "broadcast")
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("harnessrl: error:")]
    assert errors == [
        "harnessrl: error: local engine: the in-process LocalEngine cannot join a weight broadcast (it shares "
        "the trainer's process); use --weight-sync checkpoint, or serve it (harnessrl engine serve, or vLLM "
        "with the worker extension) and pass --engine-url"
    ], done.stderr[-2000:]
    assert not (tmp_path / "out" / "steps.jsonl").exists()


def test_weight_sync_is_a_config_choice():
    from harnessrl.rl.config import RLConfig

    assert RLConfig.from_dict({"weight_sync": "broadcast"}).weight_sync == "broadcast"
    with pytest.raises(ValueError, match="weight_sync must be one of checkpoint, broadcast, got 'nfs'"):
        RLConfig.from_dict({"weight_sync": "nfs"})
