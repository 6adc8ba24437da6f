"""The train stage end to end: kill mid-run + --resume reproduces an uninterrupted run; outputs load with
AutoModelForCausalLM; checkpoints round-trip through S3; metrics are strict JSON."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl.train.round import TrainConfig, run_train
from tests.train.support import write_round

CONFIG = {
    "groups_per_step": 1,
    "epochs": 2,
    "save_every": 1,
    "keep_checkpoints": 2,
    "train": {"seed": 3, "optim": {"lr": 1e-3}},
}


def read_losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "steps.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_kill_mid_run_then_resume_matches_uninterrupted(tmp_path, tokenizer, tiny_policy_dir):
    sp, rp, _ = write_round(tmp_path, tokenizer, groups=3, per_group=3)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(CONFIG))
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harnessrl.cli",
            "stage",
            "train",
            "--samples",
            str(sp),
            "--rewards",
            str(rp),
            "--policy",
            str(tiny_policy_dir),
            "--out",
            str(killed),
            "--config",
            str(cfg_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 240
    assert proc.stderr is not None
    try:
        while not (killed / "checkpoints" / "step-000002" / "trainer_state.json").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "trainer wrote no second checkpoint in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "model").exists(), "the run finished before it could be killed"

    # whatever ran earlier in this process (an engine pins 1 thread) must not change the run's arithmetic
    import torch

    torch.set_num_threads(1)
    cfg = TrainConfig.from_dict(CONFIG)
    full = run_train(sp, rp, tiny_policy_dir, tmp_path / "full", cfg)
    resumed = run_train(sp, rp, tiny_policy_dir, killed, cfg, resume=True)
    assert full["steps"] == resumed["steps"] >= 4
    assert read_losses(killed) == read_losses(tmp_path / "full")  # bit-identical on CPU
    assert resumed["loss"] == full["loss"]
    from safetensors.torch import load_file

    w_full = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    w_resumed = load_file(str(killed / "model" / "model.safetensors"))
    assert w_full.keys() == w_resumed.keys()
    assert all(w_full[k].equal(w_resumed[k]) for k in w_full)  # bit-identical weights

    # outputs: loadable HF model, metrics, report with curves
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(killed / "model")
    assert model.config.vocab_size == 49152
    metrics = json.loads((killed / "metrics.json").read_text())
    for key in (
        "loss",
        "reward_mean",
        "reward_std",
        "advantage_std",
        "entropy",
        "clip_frac",
        "grad_norm",
        "tokens_per_s",
        "padding_fraction",
        "excluded_status:timeout",
    ):
        assert key in metrics, key
    assert (killed / "curves.png").stat().st_size > 1000
    assert "data:image/png;base64," in (killed / "report.md").read_text()

    # a checkpoint written for other settings is refused, not silently mixed in
    other = TrainConfig.from_dict({**CONFIG, "estimator": "rloo"})
    with pytest.raises(
        ValueError, match=r"holds checkpoints of another run \(step-\d+: .*the settings differ"
    ):
        run_train(sp, rp, tiny_policy_dir, killed, other, resume=True)


def test_checkpoint_round_trips_through_s3(tmp_path, tiny_policy_dir, s3_env):
    """Upload a model directory to real S3 (moto server on loopback) and fetch it back as a policy."""
    from transformers import AutoModelForCausalLM

    from harnessrl.store import ObjectStore
    from harnessrl.train.checkpoint import fetch_policy, upload_dir

    ObjectStore.from_env().ensure_bucket("ckpts")
    upload_dir(tiny_policy_dir, "s3://ckpts/run-1/model")
    got = fetch_policy("s3://ckpts/run-1/model", tmp_path / "policy")
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in Path(tiny_policy_dir).iterdir())
    assert AutoModelForCausalLM.from_pretrained(got).config.num_hidden_layers == 2
    with pytest.raises(ValueError, match="only s3://"):
        upload_dir(tiny_policy_dir, "/tmp/elsewhere")


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity, which Python writes by default but JSON does not allow."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_no_usable_rewards_writes_strict_json_with_null_and_a_reason(tmp_path, tokenizer, tiny_policy_dir):
    from harnessrl.cli import main
    from harnessrl.io import write_jsonl

    sp, rp, samples = write_round(tmp_path, tokenizer, groups=2, per_group=2, failed=0)
    write_jsonl(
        rp, [{"rollout_id": rid, "reward": None, "status": "ok"} for rid in {s.rollout_id for s in samples}]
    )
    out = tmp_path / "out"
    argv = ["stage", "train", "--samples", str(sp), "--rewards", str(rp), "--policy", str(tiny_policy_dir)]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = strict_json((out / "metrics.json").read_text())
    assert metrics["steps"] == 0 and metrics["excluded_missing_reward"] == 4
    assert metrics["reward_mean"] is None and metrics["reward_std"] is None
    assert metrics["advantage_mean"] is None and metrics["advantage_zero_fraction"] is None
    assert "no rollout has a usable reward (excluded missing_reward: 4)" in metrics["note"]
    assert "input policy unchanged" in metrics["note"]
    assert (out / "model" / "config.json").is_file()


@pytest.mark.slow
def test_lora_stage_checkpoints_adapters_and_a_resume_finishes_bit_identical(
    tmp_path, tokenizer, tiny_policy_dir, caplog
):
    """A LoRA round: checkpoints hold the adapter alone (PEFT's layout) and its trainer state; a rerun resumed
    from the newest one (the final model and its step rows removed, as if killed in the last step) ends with the
    same weights, bit for bit; the final model is the merged weights with the adapter beside them."""
    import shutil

    import torch
    from safetensors.torch import load_file

    sp, rp, _ = write_round(tmp_path, tokenizer, groups=3, per_group=3)
    cfg = TrainConfig.from_dict({**CONFIG, "train": {**CONFIG["train"], "lora": {"rank": 4, "alpha": 8}}})
    torch.set_num_threads(1)
    full = run_train(sp, rp, tiny_policy_dir, tmp_path / "full", cfg)
    steps = full["steps"]
    assert steps >= 4
    ckpts = sorted((tmp_path / "full" / "checkpoints").iterdir())
    assert [c.name for c in ckpts] == [f"step-{steps - 2:06d}", f"step-{steps - 1:06d}"]
    names = {p.name for p in ckpts[-1].iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= names
    assert "model.safetensors" not in names

    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "full", killed)
    shutil.rmtree(killed / "model")
    (killed / "steps.jsonl").unlink()
    with caplog.at_level("INFO", logger="harnessrl.train.round"):
        resumed = run_train(sp, rp, tiny_policy_dir, killed, cfg, resume=True)
    assert f"resuming from {killed / 'checkpoints' / ckpts[-1].name}: step {steps - 1}" in caplog.text
    assert resumed["loss"] == full["loss"]
    for part in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(str(tmp_path / "full" / "model" / part)), load_file(str(killed / "model" / part))
        assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a), part
    base = load_file(str(tiny_policy_dir / "model.safetensors"))
    merged = load_file(str(killed / "model" / "model.safetensors"))
    assert merged.keys() == base.keys() and not all(merged[k].equal(base[k]) for k in base)
