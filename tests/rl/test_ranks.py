"""Trainer ranks inside the RL loop, for real: `harnessrl stage rl --nproc 2` (torchrun, gloo on CPU, FSDP2 on a
4-layer cut of the tiny model) against one rank on the same data order and seed, and a rank killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.multinode import processes_with, weight_mismatches
from harnessrl.io import read_jsonl
from harnessrl.processes import free_port
from harnessrl.train.launch import RankFailure, RanksFailed, run_ranks, torchrun_prefix
from tests.rl.test_stage import REPO, rl_command


def _config(tmp_path: Path) -> str:
    path = tmp_path / "rl.json"
    # one torch thread per rank and per engine: the float reductions do not depend on the machine
    path.write_text(json.dumps({"prompt_max_tokens": 8, "engine_threads": 1, "threads": 1}))
    return str(path)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


LR = 1e-4  # rl_command's --lr


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal up to the order of float sums (benchmarks/multinode.weight_mismatches says how much that is)."""
    mismatches = weight_mismatches(got, want, LR)
    assert not mismatches, mismatches


def _run_all(commands: dict[str, list[str]], timeout: float = 900) -> dict[str, str]:
    """Runs the stage commands side by side; each one's stdout (its summary last) once every one succeeded."""
    procs = {
        name: subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, cmd in commands.items()
    }
    outputs = {name: p.communicate(timeout=timeout) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, (name, outputs[name][1][-3000:])
    return {name: out for name, (out, _) in outputs.items()}


def _summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_two_trainer_ranks_train_the_same_weights_as_one_and_across_two_nodes(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    """One rank: one step; two ranks on one node: the same step, a checkpoint, and a second step sampled after
    the sync; two nodes (two torchrun agents with their own output folders, rendezvous at node 0) of one rank
    each: the same two steps as the two ranks of one node."""
    runs = {n: tmp_path / f"nproc{n}" for n in (1, 2)}
    nodes = [tmp_path / f"node{n}" for n in (0, 1)]

    def command(out: Path, *extra: str) -> list[str]:
        return rl_command(
            prompt_tasks, rl_policy, out, "--mode", "sync", "--config", _config(tmp_path), *extra
        )

    across_nodes = ("--steps", "2", "--nproc", "1", "--nnodes", "2", "--master-port", str(free_port()))
    outputs = _run_all(
        {
            "nproc1": command(runs[1], "--steps", "1", "--nproc", "1"),
            "nproc2": command(runs[2], "--steps", "2", "--save-every", "1", "--nproc", "2"),
            **{f"node{n}": command(nodes[n], *across_nodes, "--node-rank", str(n)) for n in (0, 1)},
        }
    )
    summaries = {n: _summary(outputs[f"nproc{n}"]) for n in runs}
    assert summaries[1]["trainer_ranks"] == 1 and summaries[2]["trainer_ranks"] == 2
    assert _summary(outputs["node0"])["trainer_ranks"] == 2
    assert outputs["node1"].strip().splitlines()[-1] == "trainer node 1 of 2: its ranks are done"
    assert not (nodes[1] / "steps.jsonl").exists()  # node 1 ran trainer ranks only

    # two nodes = two ranks of one node: the same steps and, after both, the same weights
    across, within = (list(read_jsonl(d / "steps.jsonl")) for d in (nodes[0], runs[2]))
    for a, b in zip(across, within, strict=True):
        for key in ("step", "groups", "outcome", "version", "reward_mean", "sequences", "tokens"):
            assert a[key] == b[key], key
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    _assert_same_weights(_weights(nodes[0] / "model"), _weights(runs[2] / "model"))

    one, two = (list(read_jsonl(runs[n] / "steps.jsonl")) for n in (1, 2))
    assert [r["step"] for r in one] == [1] and [r["step"] for r in two] == [1, 2]
    assert one[0]["outcome"] == "trained", one
    a, b = one[0], two[0]
    for key in ("groups", "outcome", "version", "reward_mean", "rollouts_trained", "sequences", "tokens"):
        assert b[key] == a[key], key  # the same data: same groups, rollouts and tokens
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)

    before, after_one = _weights(rl_policy), _weights(runs[1] / "model")
    assert max(float((after_one[k] - before[k]).abs().max()) for k in before) > 5e-5  # it really trained
    # after step 1, the checkpoint rank 0 gathered from the 2 ranks holds the weights one rank trained...
    ckpt = runs[2] / "checkpoints" / "step-000001"
    _assert_same_weights(_weights(ckpt), after_one)
    # ...and the full (unsharded) optimizer state
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert state["optimizer_format"] == "full_fqn" and state["global_step"] == 1
    exp_avg = state["optimizer"]["state"]["model.embed_tokens.weight"]["exp_avg"]
    assert exp_avg.shape == before["model.embed_tokens.weight"].shape
    # the in-process engine took the gathered weights from memory (rl/publish.InProcessPublisher; what it
    # samples after such a sync: tests/rl/test_partial_rollouts.py): no sync checkpoint was written
    assert two[-1]["version"] == 2 and not (runs[2] / "work" / "sync").exists()


@pytest.mark.slow
def test_two_trainer_ranks_train_the_same_lora_adapter_as_one(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    """LoRA under FSDP2: the adapters sharded over 2 ranks, the base frozen; one step trains the adapter one
    rank trains, and the final model (merged) follows it."""
    runs = {n: tmp_path / f"nproc{n}" for n in (1, 2)}
    _run_all(
        {
            f"nproc{n}": rl_command(
                prompt_tasks, rl_policy, out, "--mode", "sync", "--config", _config(tmp_path)
            )
            + ["--steps", "1", "--lora-rank", "8", "--nproc", str(n)]
            for n, out in runs.items()
        }
    )
    one, two = (list(read_jsonl(runs[n] / "steps.jsonl")) for n in (1, 2))
    assert one[0]["outcome"] == two[0]["outcome"] == "trained", (one, two)
    assert two[0]["loss"] == pytest.approx(one[0]["loss"], abs=1e-6)
    adapters = [load_file(str(runs[n] / "model" / "adapter" / "adapter_model.safetensors")) for n in (1, 2)]
    assert adapters[0] and all(float(t.abs().max()) > 0 for k, t in adapters[0].items() if "lora_B" in k)
    _assert_same_weights(adapters[1], adapters[0])
    _assert_same_weights(_weights(runs[2] / "model"), _weights(runs[1] / "model"))


def _wait_for_first_checkpoint(proc: subprocess.Popen, out: Path) -> None:
    """Until the run in `out` has written its step-1 checkpoint (or ended, or 10 minutes passed)."""
    first = out / "checkpoints" / "step-000001" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "no checkpoint after step 1"


@pytest.mark.slow
def test_a_killed_trainer_rank_fails_the_stage_naming_it_when_no_restart_is_left(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    out = tmp_path / "killed"
    cmd = rl_command(
        prompt_tasks,
        rl_policy,
        out,
        "--mode",
        "sync",
        "--steps",
        "3",
        "--nproc",
        "2",
        "--max-restarts",
        "0",
        "--config",
        _config(tmp_path),
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr or ():
            lines.append(line)
            if "trainer rank 1 of 2 ready" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(300), "".join(lines[-40:])  # rank 1 now waits while rank 0 runs the rollouts
        ranks = processes_with(str(out))
        (victim,) = [pid for pid, rank in ranks.items() if rank == "1"]
        assert "0" in ranks.values()
        os.kill(victim, signal.SIGKILL)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    stderr = "".join(lines)
    assert proc.returncode == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("harnessrl: error:")]
    assert errors == [
        "harnessrl: error: trainer rank 1 of 2 failed (killed by SIGKILL); torchrun stopped every rank"
    ], stderr[-3000:]
    deadline = time.monotonic() + 30
    while processes_with(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(str(out)) == {}, "a rank outlived the stage"
    assert not (out / "metrics.json").exists()


def test_run_ranks_names_the_rank_that_failed(tmp_path: Path):
    script = tmp_path / "ranks.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"
    )
    t0 = time.monotonic()
    with pytest.raises(RanksFailed) as failed:
        run_ranks([*torchrun_prefix(2), str(script)], 2, timeout=120)
    assert time.monotonic() - t0 < 50  # rank 0 was stopped, not waited for
    assert failed.value.failures[0] == RankFailure(1, 3)
    assert str(failed.value).startswith("rank 1 of 2 failed (exit code 3); torchrun stopped every rank")
    assert sys.executable in str(failed.value)


@pytest.mark.slow
def test_a_killed_trainer_rank_restarts_the_ranks_from_the_last_checkpoint_on_the_same_data_order(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    """Rank 1 killed after the first checkpoint: the stage restarts both ranks, rank 0 resumes from the newest
    checkpoint, and the run ends with every step once; the positions it consumed across the restart are the
    next positions of one seeded stream, none repeated or left out (which groups train depends on sampling)."""
    from harnessrl.rl.groups import DataOrder
    from tests.rl.test_stage import _position

    out = tmp_path / "killed"
    cmd = rl_command(
        prompt_tasks, rl_policy, out, "--mode", "sync", "--steps", "3", "--save-every", "1", "--nproc", "2",
        "--config", _config(tmp_path),
    )  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_first_checkpoint(proc, out)
        (victim,) = [pid for pid, rank in processes_with(str(out)).items() if rank == "1"]
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.decode()[-3000:]
    assert (
        "trainer rank 1 of 2 failed (killed by SIGKILL); torchrun stopped every rank: restarting every trainer "
        "rank from the newest checkpoint (restart 1 of at most 2)"
    ) in stderr.decode()
    assert json.loads(stdout.decode().strip().splitlines()[-1])["steps_trained"] == 3
    rows = list(read_jsonl(out / "steps.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3]  # no step twice, none missing
    used = [
        g
        for r in rows
        for g in sorted(r["groups_skipped"] + r["groups_discarded"] + r["groups"], key=_position)
    ]
    positions = [_position(g) for g in used]
    assert positions == list(range(len(positions)))  # the same data order across the restart
    order = DataOrder([f"say-{a}" for a in ("and", "the", "of", "I")], seed=0)
    assert [g.split("@")[0] for g in used] == [order.task_at(p) for p in positions]


def test_a_node_that_lacks_the_starting_policy_is_told_to_mount_the_runs_volume(tmp_path: Path):
    from harnessrl.rl.config import RLConfig
    from harnessrl.rl.ranks import Setup, build_trainer
    from harnessrl.train.distributed import DistContext

    missing = tmp_path / "elsewhere" / "policy"
    with pytest.raises(FileNotFoundError) as caught:
        build_trainer(RLConfig(), DistContext(world_size=2, rank=1), Setup(str(missing), None, 0, {}))
    assert str(caught.value) == (
        f"trainer rank 1: the starting policy rank 0 loads, {missing}, is not on this node: mount the run's "
        "volume at the same path on every node"
    )
