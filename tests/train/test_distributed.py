"""Real multi-process data parallelism: `torchrun --nproc-per-node 2` (gloo, CPU, FSDP2) runs the train stage
and must give the same per-step losses and the same updated weights as one process on the same data — and so
must two torchrun node agents of one rank each (`--nnodes 2`, static rendezvous), as on two machines."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harnessrl.processes import free_port
from harnessrl.train.batching import SeqItem
from harnessrl.train.distributed import Rendezvous, shard_items
from harnessrl.train.launch import run_multiprocess, run_ranks, torchrun_command
from harnessrl.train.round import TrainConfig, run_train
from tests.train.support import write_round

CONFIG = {
    "groups_per_step": 1,
    "epochs": 1,
    "save_every": 1,
    "device": "cpu",
    "train": {
        "loss_mode": "rollout-token-mean",
        "max_tokens_per_micro_batch": 48,
        "seed": 0,
        "optim": {"lr": 1e-3, "max_grad_norm": 1.0},
    },
}


@pytest.fixture(scope="module")
def dp_policy_dir(tmp_path_factory, tokenizer) -> Path:
    """Tiny random Llama (3 layers, hidden 64, tied embeddings) with the real SmolLM2 tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    d = tmp_path_factory.mktemp("dp-policy")
    LlamaForCausalLM(cfg).float().save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def test_shard_items_partitions_and_balances_tokens():
    items = [
        SeqItem([0] * n, [1] * n, [0.0] * n, 0.0, 1.0, f"r{i}") for i, n in enumerate([9, 3, 7, 1, 5, 5, 2])
    ]
    shares = [shard_items(items, r, 3) for r in range(3)]
    ids = sorted(it.rollout_id for s in shares for it in s)
    assert ids == sorted(it.rollout_id for it in items)  # a partition: nothing lost or duplicated
    loads = [sum(len(it) for it in s) for s in shares]
    assert max(loads) - min(loads) <= 2
    assert shard_items(items, 0, 1) == items


def test_torchrun_command_is_the_documented_cli():
    cmd = torchrun_command(
        4, "s.parquet", "r.jsonl", "pol", "out", "out/cfg.json", resume=True, model_out="m"
    )
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    assert cmd[6:10] == ["-m", "harnessrl.cli", "stage", "train"]
    assert cmd[cmd.index("--model-out") + 1] == "m" and cmd[-1] == "--resume"


def test_torchrun_two_ranks_match_one_process(tmp_path, tokenizer, dp_policy_dir):
    samples, rewards, _ = write_round(tmp_path, tokenizer, groups=3, per_group=4, failed=1)

    t0 = time.perf_counter()
    cfg = TrainConfig.from_dict(CONFIG)
    config = tmp_path / "stage_config.json"
    config.write_text(json.dumps(cfg.to_dict(), default=list))
    port = free_port()
    nodes = [  # two machines' node agents, each its own output folder; rank 0 on node 0 writes the results
        torchrun_command(1, samples, rewards, dp_policy_dir, tmp_path / f"node{k}", config, nnodes=2,
                         rendezvous=Rendezvous(k, "127.0.0.1", port))
        for k in (0, 1)
    ]  # fmt: skip
    # the exact launch the KFP component does on a multi-GPU pod: torchrun -m harnessrl.cli stage train;
    # started first so its 2 ranks import torch/transformers while this process computes the reference
    with ThreadPoolExecutor(3) as pool:
        across = [pool.submit(run_ranks, cmd, 1, timeout=240) for cmd in nodes]
        dp = pool.submit(
            run_multiprocess,
            2,
            samples,
            rewards,
            dp_policy_dir,
            tmp_path / "dp",
            TrainConfig.from_dict(CONFIG),
            timeout=240,
        )
        single = run_train(
            samples,
            rewards,
            dp_policy_dir,
            tmp_path / "single",
            TrainConfig.from_dict(CONFIG),
        )
        summary = dp.result()
        for node in across:
            node.result()
    assert single["steps"] >= 2
    assert json.loads((tmp_path / "node0" / "metrics.json").read_text())["world_size"] == 2
    assert not (tmp_path / "node1" / "metrics.json").exists()  # node 1 ran a rank, not the stage's outputs
    print(f"single + torchrun: {time.perf_counter() - t0:.1f}s")
    assert summary["world_size"] == 2 and summary["steps"] == single["steps"]

    one = [json.loads(line) for line in (tmp_path / "single" / "steps.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "dp" / "steps.jsonl").read_text().splitlines()]
    assert len(one) == len(two) == single["steps"]
    for a, b in zip(one, two, strict=True):
        assert b["world_size"] == 2
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
        assert b["trained_tokens"] == a["trained_tokens"] and b["sequences"] == a["sequences"]

    before = load_file(str(dp_policy_dir / "model.safetensors"))
    w1 = load_file(str(tmp_path / "single" / "model" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "dp" / "model" / "model.safetensors"))
    w_nodes = load_file(str(tmp_path / "node0" / "model" / "model.safetensors"))
    assert w1.keys() == w2.keys() == w_nodes.keys() == before.keys()
    moved = 0.0
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
        torch.testing.assert_close(w_nodes[k], w2[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
        moved = max(moved, float((w1[k] - before[k]).abs().max()))
    assert moved > 1e-4  # the step really changed the weights, so equality above is not vacuous
    # the intermediate checkpoint (gathered from the shards by rank 0) holds the same weights after step 1,
    # and its optimizer state is the full, unsharded AdamW state
    c1 = load_file(str(tmp_path / "single" / "checkpoints" / "step-000001" / "model.safetensors"))
    c2 = load_file(str(tmp_path / "dp" / "checkpoints" / "step-000001" / "model.safetensors"))
    assert c1.keys() == c2.keys()
    for k in c1:
        torch.testing.assert_close(c2[k], c1[k], rtol=1e-4, atol=1e-5)
    state = torch.load(
        tmp_path / "dp" / "checkpoints" / "step-000001" / "trainer_state.pt", weights_only=False
    )
    assert state["optimizer_format"] == "full_fqn"
    exp_avg = state["optimizer"]["state"]["model.embed_tokens.weight"]["exp_avg"]
    assert tuple(exp_avg.shape) == tuple(c1["model.embed_tokens.weight"].shape)
    # ...and it resumes in a single process: the FQN-keyed full state maps back onto the same AdamW moments
    from harnessrl.tinymodel import load_model
    from harnessrl.train.trainer import Trainer

    ref = torch.load(
        tmp_path / "single" / "checkpoints" / "step-000001" / "trainer_state.pt", weights_only=False
    )
    trainer = Trainer(
        load_model(tmp_path / "dp" / "checkpoints" / "step-000001"), TrainConfig.from_dict(CONFIG).train
    )
    trainer.load_state_dict(state)
    got = trainer.optimizer.state_dict()["state"]
    assert got.keys() == ref["optimizer"]["state"].keys()
    for i, st in ref["optimizer"]["state"].items():
        torch.testing.assert_close(got[i]["exp_avg"], st["exp_avg"], rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(got[i]["exp_avg_sq"], st["exp_avg_sq"], rtol=1e-4, atol=1e-10)
    assert trainer.global_step == 1
    assert json.loads((tmp_path / "dp" / "metrics.json").read_text())["world_size"] == 2
