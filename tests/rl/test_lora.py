"""LoRA through the RL loop (real engine, gateway, trainer; a 4-layer cut of the tiny model): the adapter alone
synced into the local engine, which then samples the trainer's policy; `stage rl` with adapters checkpoints
them in PEFT's layout, exports the merged model with its adapter, and resumes from an adapter checkpoint."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
import torch

from harnessrl.engine.base import SamplingParams
from harnessrl.engine.local import LocalEngine
from harnessrl.io import read_jsonl
from tests.rl.support import sync_setup
from tests.rl.test_stage import REPO, _config, rl_command

LORA = {"rank": 8, "alpha": 16}


def test_adapter_sync_moves_the_engine_to_the_trainers_policy(rl_policy: Path, tmp_path: Path):
    from harnessrl.train.lora import is_adapter_tensor

    setup = sync_setup(rl_policy, tmp_path, {"train": {"lora": LORA}})
    full_bytes = sum(t.nbytes for n, t in setup.model.state_dict().items() if not is_adapter_tensor(n))
    greedy = SamplingParams(temperature=0.0)
    try:
        before = asyncio.run(setup.engine.generate(setup.prompt, greedy, 12))
        versions = []
        for version in (1, 2):  # the second adapter replaces the first: merged onto the base, not the first
            torch.manual_seed(version)
            with torch.no_grad():  # what optimizer steps do to the adapter
                for name, p in setup.model.named_parameters():
                    if is_adapter_tensor(name):
                        p.copy_(torch.randn_like(p) * 0.02)
            synced = setup.learner.sync_weights(version)
            after = asyncio.run(setup.engine.generate(setup.prompt, greedy, 12))
            versions.append((synced, after, setup.trainer_logprobs(after.token_ids)))
    finally:
        setup.engine.close()
    adapter_bytes = sum(t.nbytes for n, t in setup.model.state_dict().items() if is_adapter_tensor(n))
    for version, (synced, after, trainer_lp) in enumerate(versions, 1):
        assert synced.nbytes == adapter_bytes and synced.nbytes < 0.05 * full_bytes
        assert after.policy_version == version and set(after.token_policy_versions) == {version}
        # the engine samples the trainer's policy: its logprobs are the adapted trainer model's
        assert after.logprobs == pytest.approx(trainer_lp, abs=2e-3)
    assert versions[0][1].logprobs != pytest.approx(before.logprobs, abs=1e-3)


@pytest.mark.slow
def test_stage_rl_with_lora_checkpoints_adapters_exports_merged_and_resumes(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    from peft import PeftModel

    from harnessrl.tinymodel import load_model

    out = tmp_path / "out"
    config = _config(tmp_path, keep_checkpoints=3)
    cmd = rl_command(
        prompt_tasks,
        rl_policy,
        out,
        "--mode",
        "sync",
        "--save-every",
        "1",
        "--config",
        config,
        "--lora-rank",
        "8",
    )
    first = subprocess.run([*cmd, "--steps", "2"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["lora_rank"] == 8 and 0 < summary["weight_sync_bytes"]
    assert "LoRA adapters of rank 8 trained" in (out / "report.md").read_text()
    ckpt = out / "checkpoints" / "step-000001"  # the last step is the final model, not a checkpoint
    names = {p.name for p in ckpt.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names
    rows = list(read_jsonl(out / "steps.jsonl"))
    full_bytes = (rl_policy / "model.safetensors").stat().st_size
    synced = [r["weight_sync_bytes"] for r in rows if r["outcome"] == "trained"]
    assert synced and all(0 < b < 0.05 * full_bytes for b in synced)

    # the final model: the merged weights (any engine, any stage), and its adapter, which PEFT puts on the base
    model = out / "model"
    merged = load_model(model).eval()
    with_peft = PeftModel.from_pretrained(load_model(rl_policy), str(model / "adapter")).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, with_peft(ids).logits, atol=1e-4)
        assert not torch.allclose(merged(ids).logits, load_model(rl_policy)(ids).logits, atol=1e-4)

    # the adapter directory is a policy too: served as its base with the adapter merged in, the same model
    from harnessrl.rollout.model_server import ModelServer, ModelSource

    prompt = [1, 2, 3, 4, 5, 6]
    greedy = SamplingParams(temperature=0.0)
    with ModelServer(ModelSource(checkpoint=str(model / "adapter"), max_batch=1), tmp_path / "j") as served:
        assert served.engine is not None
        via_adapter = asyncio.run(served.engine.generate(prompt, greedy, 8))
    engine = LocalEngine(model, max_batch=1, threads=1)
    try:
        via_merged = asyncio.run(engine.generate(prompt, greedy, 8))
    finally:
        engine.close()
    assert via_adapter.token_ids == via_merged.token_ids
    assert via_adapter.logprobs == pytest.approx(via_merged.logprobs, abs=1e-5)

    resumed = subprocess.run(
        [*cmd, "--steps", "3", "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "step-000001" in resumed.stderr
    rows = list(read_jsonl(out / "steps.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == 3
