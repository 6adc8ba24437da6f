"""Checkpoints belong to one run: `--resume` refuses other inputs, rotation and cleanup touch only this run's
checkpoints, and a rerun removes what a kill -9 of the same run left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harnessrl.train.checkpoint import list_checkpoints, read_meta, save_checkpoint
from harnessrl.train.round import TrainConfig, run_train
from tests.train.support import tiny_llama, write_round

CONFIG = {"groups_per_step": 1, "save_every": 1, "keep_checkpoints": 2, "train": {"seed": 1}}


def train(sp: Path, rp: Path, policy: Path, out: Path, *, resume: bool = False, **overrides) -> dict:
    return run_train(sp, rp, policy, out, TrainConfig.from_dict({**CONFIG, **overrides}), resume=resume)


def checkpoints(out: Path) -> list[str]:
    return [p.name for p in list_checkpoints(out / "checkpoints")]


def save_policy(path: Path, tokenizer, seed: int) -> Path:
    tiny_llama(seed=seed).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def round_files(tmp_path, tokenizer) -> tuple[Path, Path]:
    """3 groups of 3 rollouts, all with mixed rewards: 3 optimizer steps of one group each."""
    sp, rp, _ = write_round(tmp_path, tokenizer, groups=3, per_group=3, failed=0)
    return sp, rp


def test_resume_with_another_policy_is_refused_in_one_line(
    tmp_path, round_files, tokenizer, tiny_policy_dir, capsys
):
    from harnessrl.cli import main

    sp, rp = round_files
    out = tmp_path / "out"
    train(sp, rp, tiny_policy_dir, out, max_steps=2)  # stops after step 2 of 3: step-000001 is on disk
    assert checkpoints(out) == ["step-000001"]
    other = save_policy(tmp_path / "other-policy", tokenizer, seed=1)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CONFIG))
    argv = [
        "stage",
        "train",
        "--samples",
        str(sp),
        "--rewards",
        str(rp),
        "--out",
        str(out),
        "--config",
        str(cfg),
    ]

    capsys.readouterr()
    assert main([*argv, "--resume", "--policy", str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("harnessrl: error: ") and "\n" not in err
    assert f"the policy differs (checkpoint: {tiny_policy_dir}, now: {other})" in err
    assert "rerun with its inputs and settings, or start this run in a new --out" in err
    assert checkpoints(out) == ["step-000001"]  # refused before anything was touched

    # the same path holding other weights is another policy too
    policy = save_policy(tmp_path / "policy", tokenizer, seed=0)
    train(sp, rp, policy, tmp_path / "out2", max_steps=2)
    save_policy(policy, tokenizer, seed=2)
    with pytest.raises(ValueError, match="the policy differs"):
        train(sp, rp, policy, tmp_path / "out2", resume=True)

    # the unchanged inputs still resume
    assert main([*argv, "--resume", "--policy", str(tiny_policy_dir)]) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 3


def test_resume_with_other_token_ids_is_refused(tmp_path, round_files, tiny_policy_dir):
    sp, rp = round_files
    out = tmp_path / "out"
    train(sp, rp, tiny_policy_dir, out, max_steps=2)
    rows = pq.read_table(sp).to_pylist()
    ids = rows[0]["input_ids"]
    ids[-2] = ids[-2] + 1  # same rollouts, lengths, masks and rewards: only one sampled token differs
    pq.write_table(pa.Table.from_pylist(rows), sp)
    with pytest.raises(ValueError, match=r"another run \(step-000001: the samples differ\)"):
        train(sp, rp, tiny_policy_dir, out, resume=True)


def test_fresh_run_refuses_a_dir_holding_another_runs_checkpoints(tmp_path, round_files, tiny_policy_dir):
    sp, rp = round_files
    out = tmp_path / "out"
    train(sp, rp, tiny_policy_dir, out)
    before = checkpoints(out)
    assert before == ["step-000001", "step-000002"]  # 3 steps, the last one is the final model
    with pytest.raises(
        ValueError, match="holds checkpoints of another run .*the settings differ.*use a new --out"
    ):
        train(sp, rp, tiny_policy_dir, out, train={"seed": 1, "optim": {"lr": 1e-3}})
    assert checkpoints(out) == before


def test_fresh_rerun_of_the_same_run_keeps_its_own_first_checkpoint(tmp_path, round_files, tiny_policy_dir):
    sp, rp = round_files
    out = tmp_path / "out"
    train(sp, rp, tiny_policy_dir, out)
    assert checkpoints(out) == ["step-000001", "step-000002"]
    # the same inputs and settings, started over (max_steps does not change what a step computes)
    train(sp, rp, tiny_policy_dir, out, max_steps=2)
    assert checkpoints(out) == ["step-000001"]
    meta = read_meta(out / "checkpoints" / "step-000001")
    assert meta is not None and len(meta["history"]) == 1


def test_rotation_counts_only_this_runs_checkpoints(tmp_path, tiny_policy_dir):
    from harnessrl.tinymodel import load_model

    model = load_model(tiny_policy_dir)
    root = tmp_path / "checkpoints"
    for step in (4, 5):
        save_checkpoint(root, step, model, None, {}, {"fingerprint": "a" * 16}, keep=0)
    save_checkpoint(root, 1, model, None, {}, {"fingerprint": "b" * 16}, keep=1)
    save_checkpoint(root, 2, model, None, {}, {"fingerprint": "b" * 16}, keep=1)
    # run b keeps its newest checkpoint; run a's higher-numbered ones neither count nor go
    assert [p.name for p in list_checkpoints(root)] == ["step-000002", "step-000004", "step-000005"]
    assert [p.name for p in list_checkpoints(root, "b" * 16)] == ["step-000002"]


KILL_DURING_SECOND_CHECKPOINT = """
import os, signal, sys
import torch
from harnessrl.train.round import TrainConfig, run_train

real_save, saves = torch.save, []

def save(obj, f, *args, **kwargs):
    saves.append(f)
    if len(saves) == 2:  # the second checkpoint's trainer state: its weights are already written
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

torch.save = save
samples, rewards, policy, out, config = sys.argv[1:]
run_train(samples, rewards, policy, out, TrainConfig.from_dict(__import__("json").loads(config)))
"""


def test_rerun_after_kill_9_removes_only_its_own_partial_checkpoints(tmp_path, round_files, tiny_policy_dir):
    sp, rp = round_files
    out = tmp_path / "out"
    config = {**CONFIG, "epochs": 2}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            KILL_DURING_SECOND_CHECKPOINT,
            str(sp),
            str(rp),
            str(tiny_policy_dir),
            str(out),
        ]
        + [json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    root = out / "checkpoints"
    partial = [p.name for p in root.iterdir() if p.name.startswith(".step-000002.")]
    assert len(partial) == 1, sorted(p.name for p in root.iterdir())
    assert checkpoints(out) == ["step-000001"]
    foreign = root / ".step-000007.0123456789abcdef.x1y2z3"  # another run's leftover
    (foreign / "new").mkdir(parents=True)

    summary = train(sp, rp, tiny_policy_dir, out, resume=True, epochs=2)
    assert summary["steps"] == 6
    leftovers = sorted(p.name for p in root.iterdir() if p.name.startswith("."))
    assert leftovers == [foreign.name]
    assert checkpoints(out) == ["step-000004", "step-000005"]
