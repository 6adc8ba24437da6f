"""The SFT objective (loss only on sampled tokens, through the real Trainer) and scripted demonstrations of a
task's gold fix through the real generate path (harness, gateway, sandbox) and verify."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch

from harnessrl.train.batching import SeqItem
from harnessrl.train.losses import sequence_weights
from harnessrl.train.modes import LossMode, Objective
from harnessrl.train.trainer import OptimConfig, Trainer, TrainerConfig
from tests.support.fixtures import requires_bwrap
from tests.train.support import tiny_llama, write_round

VOCAB = 11


class TableModel(torch.nn.Module):
    """A 'model' whose logits at position t are free parameters (row t of a table), so a test can set the
    logits of every position directly; it takes the Trainer's forward arguments."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, input_ids, position_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.table[position_ids])


def _sft_loss(table: torch.Tensor, item: SeqItem) -> float:
    cfg = TrainerConfig(objective=Objective.SFT, loss_mode=LossMode.TOKEN_MEAN, optim=OptimConfig(lr=0.0))
    return Trainer(TableModel(table), cfg).step([item])["loss"]


def test_sft_loss_is_on_sampled_tokens_only():
    # prompt (3 tokens), sampled (2), tool output (2, context), sampled (2): the gateway's mask layout
    ids = [1, 4, 2, 7, 3, 9, 5, 8, 6]
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1]
    n = sum(mask)
    weight = sequence_weights([n], ["r"], LossMode.TOKEN_MEAN)[0]
    item = SeqItem(ids, mask, [0.0] * len(ids), advantage=3.0, weight=weight, rollout_id="r")
    table = torch.randn(len(ids), VOCAB, generator=torch.Generator().manual_seed(0))
    loss = _sft_loss(table, item)

    # logits at position t predict token t+1: the loss is the mean NLL of the sampled tokens
    logp = torch.log_softmax(table, dim=-1)
    expected = -sum(float(logp[t - 1, ids[t]]) for t in range(1, len(ids)) if mask[t]) / n
    assert loss == pytest.approx(expected, rel=1e-6)

    predicts_context = [t - 1 for t in range(1, len(ids)) if not mask[t]] + [len(ids) - 1]
    predicts_sampled = [t - 1 for t in range(1, len(ids)) if mask[t]]
    noisy = table.clone()
    noisy[predicts_context] += 5 * torch.randn(len(predicts_context), VOCAB)
    assert _sft_loss(noisy, item) == pytest.approx(loss, rel=1e-6, abs=1e-7)
    for t in predicts_sampled:
        bumped = table.clone()
        bumped[t, ids[t + 1]] += 1.0  # the sampled token more likely: lower loss
        assert _sft_loss(bumped, item) < loss - 1e-3
    # advantages and behavior logprobs are RL quantities: SFT ignores them
    other = SeqItem(ids, mask, [-3.0] * len(ids), advantage=-7.0, weight=weight, rollout_id="r")
    assert _sft_loss(table, other) == pytest.approx(loss, rel=1e-6)


def test_sft_loss_decreases_on_a_fixed_batch(tmp_path, tokenizer):
    _, _, samples = write_round(tmp_path, tokenizer, groups=2, per_group=2, failed=0)
    counts = [sum(s.loss_mask[1:]) for s in samples]
    weights = sequence_weights(counts, [s.rollout_id for s in samples], LossMode.TOKEN_MEAN)
    items = [
        SeqItem(s.input_ids, s.loss_mask, s.behavior_logprobs, 0.0, w, s.rollout_id)
        for s, w in zip(samples, weights, strict=True)
    ]
    cfg = TrainerConfig(objective=Objective.SFT, loss_mode=LossMode.TOKEN_MEAN, optim=OptimConfig(lr=3e-3))
    trainer = Trainer(tiny_llama(), cfg)
    losses = [trainer.step(items)["loss"] for _ in range(5)]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < losses[0] - 0.5, losses


@requires_bwrap
def test_scripted_demonstration_resolves_through_harness_and_gateway(tmp_path, task, tokenizer):
    from components.sft.demos import run_demonstrations
    from harnessrl.tinymodel import tiny_model_dir

    run = run_demonstrations(task.taskset.root, tmp_path / "demo", tiny_model_dir(), instance_ids=[task.iid])
    assert run.built == [task.iid] and run.resolved == [task.iid], run
    rollout = json.loads((run.rollouts / "rollouts.jsonl").read_text().splitlines()[0])
    assert rollout["rollout_status"] == "ok" and rollout["finish_reason"] == "submitted"
    assert rollout["harness_errors"] == {} and rollout["tool_calls"] == 3  # view, str_replace, submit
    reward = json.loads((run.verified / "rewards.jsonl").read_text().splitlines()[0])
    assert reward["reward"] == 1.0
    (sample,) = pq.read_table(run.rollouts / "samples.parquet").to_pylist()
    sampled = [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if m]
    context = [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=True) if not m]
    text = tokenizer.decode(sampled)
    assert text.count("<tool_call>") == 3 and '"command": "str_replace"' in text
    assert '"name": "submit"' in text and "<|im_end|>" in text
    # the tool results and the problem statement are context, never trained
    assert "<tool_response>" not in text and "<tool_response>" in tokenizer.decode(context)
    assert all(lp == 0.0 for lp, m in zip(sample["behavior_logprobs"], sample["loss_mask"], strict=True) if m)


def test_fix_becomes_unique_str_replace_edits():
    from components.sft.demos import _file_edits

    before = "def f(x):\n    y = 1\n    return x\n\n\ndef g(x):\n    y = 1\n    return x\n"
    after = "def f(x):\n    y = 1\n    return x\n\n\ndef g(x):\n    y = 2\n    z = 3\n    return x\n"
    edits = _file_edits("m.py", before, after)
    text = before
    for e in edits:
        assert text.count(e.old) == 1  # "    y = 1\n" alone occurs twice: widened to a unique region
        text = text.replace(e.old, e.new, 1)
    assert text == after and len(edits) == 1 and "def g" in edits[0].old

    removed_line = "a = 1\nb = 2\nc = 3\n"
    edits = _file_edits("n.py", removed_line, "a = 1\nc = 3\n")
    assert [(e.old, e.new) for e in edits] == [("b = 2\n", "")]
