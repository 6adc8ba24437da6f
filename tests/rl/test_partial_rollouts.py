"""Pause / abort / weight sync / resume through the real gateway and the local engine (a 4-layer cut of the
tiny model, greedy), and weight sync from the trainer's side of the loop."""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from harnessrl.engine.base import SamplingParams
from harnessrl.engine.local import LocalEngine
from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
from harnessrl.gateway.enums import PauseMode
from harnessrl.rl.collect import JournalTail
from tests.rl.support import PROMPT, sync_setup


def _call(base_url: str, api_key: str, max_tokens: int) -> None:
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


@pytest.mark.parametrize("sync", ["weights", "adapter"])
def test_abort_sync_resume_keeps_every_token_once_with_its_version(
    sync: str, rl_policy: Path, tmp_path: Path
):
    """A rollout in flight across a weight sync, full or a LoRA adapter (a fresh one: B = 0, the same policy,
    so greedy continues identically)."""
    from harnessrl.tinymodel import load_model
    from harnessrl.train.lora import LoraSettings, adapter_of, add_adapters

    settings = LoraSettings(rank=4)
    adapted = load_model(rl_policy)
    add_adapters(adapted, settings)
    adapter = adapter_of(adapted.state_dict().items(), settings)
    del adapted
    max_tokens = 64
    engine = LocalEngine(rl_policy, max_batch=4, threads=1)
    token = "adm-" + secrets.token_urlsafe(8)
    gateway = GatewayServer(engine, engine.tokenizer, tmp_path / "journal", token, config=GatewayConfig())
    try:
        admin = GatewayAdmin(gateway.start(), token)
        ref = admin.create_session(rollout_id="ref", group_id="g")
        _call(ref.openai_base_url, ref.api_key, max_tokens)
        admin.end_session(ref.session_id, "ok")

        session = admin.create_session(rollout_id="partial", group_id="g")
        steps0 = engine.steps
        worker = threading.Thread(target=_call, args=(session.openai_base_url, session.api_key, max_tokens))
        worker.start()
        deadline = time.monotonic() + 120
        while engine.steps < steps0 + 8 and time.monotonic() < deadline:  # a few tokens are sampled
            time.sleep(0.005)
        admin.pause(PauseMode.ABORT, timeout_s=60)
        if sync == "weights":  # same weights, new version: greedy continues identically
            engine.load_weights_sync(rl_policy, 1)
        else:
            engine.load_adapter_sync(adapter, 1)
        admin.resume()
        worker.join(300)
        assert not worker.is_alive()
        admin.end_session(session.session_id, "ok")
    finally:
        gateway.stop()
        engine.close()

    taken = JournalTail(tmp_path / "journal").take(["ref", "partial"])
    samples = {s.rollout_id: s for s in taken.samples}
    ref_s, part = samples["ref"], samples["partial"]
    sampled = [i for i, m in enumerate(ref_s.loss_mask) if m]
    assert len(sampled) > 20, "the reference reply is too short to be interrupted"
    # the interrupted call stays one model call with the reference's reply: the reply figures count it once
    assert (taken.replies.calls, taken.replies.tokens) == (2, 2 * len(sampled))
    # the partial rollout equals the uninterrupted one, token for token: nothing lost, nothing twice
    assert part.input_ids == ref_s.input_ids
    assert part.loss_mask == ref_s.loss_mask
    assert part.behavior_logprobs == pytest.approx(ref_s.behavior_logprobs, abs=1e-4)
    # ... except for the versions: a run of version 0, then version 1 after the sync
    versions = [part.policy_version[i] for i in sampled]
    assert set(versions) == {0, 1}, versions
    assert versions == sorted(versions)
    assert {ref_s.policy_version[i] for i in sampled} == {0}


def test_weight_sync_moves_the_engine_to_the_trainers_weights(rl_policy: Path, tmp_path: Path):
    import asyncio

    setup = sync_setup(rl_policy, tmp_path)
    greedy = SamplingParams(temperature=0.0)
    try:
        before = asyncio.run(setup.engine.generate(setup.prompt, greedy, 12))
        with torch.no_grad():  # what a (large) optimizer step would do to the policy
            for p in setup.model.model.layers[-1].parameters():
                p.add_(torch.randn_like(p) * 0.05)
        seconds = setup.learner.sync_weights(1).seconds
        after = asyncio.run(setup.engine.generate(setup.prompt, greedy, 12))
    finally:
        setup.engine.close()
    assert seconds > 0
    assert after.policy_version == 1 and set(after.token_policy_versions) == {1}
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    # the engine now samples the trainer's policy: its logprobs are the trainer model's
    assert after.logprobs == pytest.approx(setup.trainer_logprobs(after.token_ids), abs=2e-3)
    assert not (tmp_path / "work" / "sync" / "v000000").exists()
