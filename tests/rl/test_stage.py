"""`harnessrl stage rl` end to end (real engine, gateway, trainer; a 4-layer cut of the tiny model on prompt
tasks): the async modes, the refusal of an engine that cannot take weights, and sync mode killed with -9 and
resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harnessrl.gateway.journal import read_journal
from harnessrl.gateway.replies import ReplyFigures, reply_counts
from harnessrl.gateway.samples import call_rows
from harnessrl.io import read_jsonl
from harnessrl.rl.groups import DataOrder
from harnessrl.rl.modes import RLMode
from harnessrl.tinymodel import load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def rl_command(tasks: Path, policy: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harnessrl.cli",
        "--no-progress",
        "stage",
        "rl",
        "--workload",
        "prompt",
        "--tasks",
        str(tasks),
        "--policy",
        str(policy),
        "--out",
        str(out),
        "--batch-groups",
        "2",
        "--group-size",
        "4",
        "--lr",
        "1e-4",
        *extra,
    ]


def _config(tmp_path: Path, **extra: object) -> str:
    path = tmp_path / "rl.json"
    path.write_text(json.dumps({"prompt_max_tokens": 8, "engine_threads": 1, **extra}))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [RLMode.COLOCATED, RLMode.SEPARATE])  # sync: the kill + resume test below
def test_stage_rl_runs_each_mode(mode: RLMode, rl_policy: Path, prompt_tasks: Path, tmp_path: Path):
    out = tmp_path / "out"
    cmd = rl_command(
        prompt_tasks, rl_policy, out, "--mode", mode, "--steps", "2", "--config", _config(tmp_path)
    )
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert [line.split()[1] for line in lines if line.startswith("rl ")] == ["step=1", "step=2"]
    summary = json.loads(lines[-1])
    assert summary["mode"] == mode and summary["steps"] == 2
    rows = list(read_jsonl(out / "steps.jsonl"))
    assert [r["step"] for r in rows] == [1, 2]
    trained = [r for r in rows if r["outcome"] == "trained"]
    assert trained, "no step trained: the small policy's groups had no reward variance"
    assert summary["version"] == len(trained)
    for r in trained:
        assert r["groups_trained"] == 2 and r["loss"] is not None and r["weight_sync_s"] > 0
    for r in rows:  # samples per rollout (a chat rollout is one chain: one sample)
        assert r["sampled_rollouts"] > 0 and r["single_sample_share"] == r["samples_per_rollout_mean"] == 1.0
    assert summary["samples_per_rollout_mean"] == 1.0
    # no group starts that no step could train: every started group trained, was discarded, or was in flight
    # for the last step's batch
    discarded = summary["groups_zero_variance"] + summary["groups_stale_dropped"]
    assert summary["groups_started"] <= 2 * 2 + discarded
    assert (out / "model" / "model.safetensors").is_file()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    report = (out / "report.md").read_text()
    assert "# RL stage" in report
    # every step's rollouts kept: the 2 trained groups x 4 and the groups it discarded, each with its fate
    for r in rows:
        logged = list(read_jsonl(out / "rollouts" / f"step-{r['step']:06d}.jsonl"))
        trained = [x for x in logged if x["fate"] == "trained"]
        assert len(trained) == (8 if r["outcome"] == "trained" else 0)
        assert {x["group_id"] for x in trained} == (set(r["groups"]) if trained else set())
        discarded = {x["group_id"] for x in logged if x["fate"] == "zero_variance"}
        assert (
            len(logged) == len(trained) + 4 * r["groups_zero_variance"]
            and len(discarded) == r["groups_zero_variance"]
        )
    # what the replies looked like: each step's figures are those of its rollouts' model calls in the journal
    calls = call_rows(read_journal(out / "work" / "journal"))
    for r in rows:
        ids = {x["rollout_id"] for x in read_jsonl(out / "rollouts" / f"step-{r['step']:06d}.jsonl")}
        mine = reply_counts(
            (c["completion_ids"], c["finish_reason"]) for c in calls if c["rollout_id"] in ids
        )
        assert ReplyFigures.from_row(r) == mine.figures() and 0 < r["mean_reply_tokens"] <= 8  # max tokens
    assert summary["mean_reply_tokens_first"] == rows[0]["mean_reply_tokens"]
    assert "mean_reply_tokens=" in lines[0]
    last = list(read_jsonl(out / "rollouts" / "step-000002.jsonl"))
    assert "## Trajectories" in report and f"### `{last[0]['rollout_id']}` (the first rollout)" in report
    first = [
        c
        for c in call_rows(read_journal(out / "work" / "journal"))
        if c["rollout_id"] == last[0]["rollout_id"]
    ]
    tokenizer = load_tokenizer(rl_policy)
    assert len(first) == 1 and first[0]["finish_reason"] in (
        "stop",
        "length",
    )  # never a finished call's "abort"
    sampled = tokenizer.decode(first[0]["completion_ids"], skip_special_tokens=False)
    assert (
        f"▶ sampled (trained), {len(first[0]['completion_ids'])} tokens:\n```text\n{sampled}\n```" in report
    )
    assert f"reward: **{last[0]['reward']}**" in report


class _NoWeightsHandler(BaseHTTPRequestHandler):
    """An engine server that lists its model but has no weight endpoint (GET /load_weights: 404)."""

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "policy", "owned_by": "harnessrl"}]}).encode()
        found = self.path == "/v1/models"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) if found else 0))
        self.end_headers()
        if found:
            self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def test_stage_refuses_an_engine_that_cannot_take_weights(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoWeightsHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cmd = rl_command(prompt_tasks, rl_policy, tmp_path / "out", "--steps", "1", "--engine-url", url)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("harnessrl: error:")]
    assert len(errors) == 1 and url in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "steps.jsonl").exists()


@pytest.mark.slow
def test_kill_9_then_resume_continues_the_same_data_order(
    rl_policy: Path, prompt_tasks: Path, tmp_path: Path
):
    out = tmp_path / "out"
    cmd = rl_command(
        prompt_tasks, rl_policy, out, "--mode", "sync", "--steps", "4", "--save-every", "1",
        "--config", _config(tmp_path, keep_checkpoints=3),
    )  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 600
    while not (out / "checkpoints" / "step-000002").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "no second checkpoint"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = list(read_jsonl(out / "steps.jsonl"))
    assert len(before) in (2, 3)  # killed in step 3 (or just after its row was written)

    done = subprocess.run([*cmd, "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(read_jsonl(out / "steps.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[:2] == before[:2]  # restored from the checkpoint, not redone
    assert [line.split()[1] for line in done.stdout.splitlines() if line.startswith("rl ")] == [
        "step=3",
        "step=4",
    ]
    trained = [r for r in rows if r["outcome"] == "trained"]
    assert trained and all(r["staleness_max"] == 0 for r in trained)  # sync: always the current policy
    # every position the run consumed (trained, replaced, skipped by dynamic sampling), in step order, is the
    # next position of one seeded stream: none repeated or left out across the kill, each the stream's task
    used = [
        g
        for r in rows
        for g in sorted(r["groups_skipped"] + r["groups_discarded"] + r["groups"], key=_position)
    ]
    positions = [_position(g) for g in used]
    assert positions == list(range(len(positions)))
    order = DataOrder([f"say-{a}" for a in ("and", "the", "of", "I")], seed=0)
    assert [g.split("@")[0] for g in used] == [order.task_at(p) for p in positions]
    assert json.loads(done.stdout.strip().splitlines()[-1])["steps"] == 4


def _position(group_id: str) -> int:
    return int(group_id.rsplit("@g", 1)[1])


@pytest.mark.slow
def test_resume_refuses_a_run_whose_specs_changed(rl_policy: Path, tmp_path: Path):
    """The issue's reproduction: two steps under a spec file (rollouts on Ray workers), the file edited to
    another reward, `--resume` with more steps into the same `--out` is refused in one line naming the specs'
    changed field (it used to resume from step 1 under the new reward). The spec file rewritten with other
    formatting resumes."""
    from harnessrl.cli import main

    tasks = tmp_path / "tasks"
    assert main(["tasks", "instruction", "--out", str(tasks), "--n", "4", "--split", "train"]) == 0
    spec = {"harness": "chat", "tools": [], "reward": "instruction_fraction", "limits": {"tokens": 8}}
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps([spec]))
    config = _config(tmp_path, batch_groups=1, group_size=2, max_groups_per_step=1, save_every=1)
    cmd = [*rl_command(tasks, rl_policy, tmp_path / "out", "--config", config), "--specs", str(specs)]
    cmd[cmd.index("--workload") + 1] = "swe"  # the task-set workload: the one that reads specs
    # the first run's rollouts are Ray tasks (a local cluster the stage starts): the task-set workload, its specs
    # and task files travel to the Ray workers, and what they return is graded as in threads
    first = subprocess.run(
        [*cmd, "--steps", "2", "--rollout-workers", "ray"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "out" / "checkpoints" / "step-000001").is_dir()
    rollouts = list(read_jsonl(tmp_path / "out" / "rollouts" / "step-000001.jsonl"))
    assert rollouts and all(r["rollout_status"] == "ok" and r["reward"] is not None for r in rollouts), (
        rollouts
    )

    specs.write_text(json.dumps([{**spec, "reward": "instruction_strict"}]))
    edited = subprocess.run(
        [*cmd, "--steps", "3", "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert edited.returncode == 2, edited.stderr[-3000:]
    errors = [line for line in edited.stderr.splitlines() if line.startswith("harnessrl: error:")]
    assert len(errors) == 1 and "Traceback" not in edited.stderr, edited.stderr[-3000:]
    assert "holds checkpoints of another run (step-000001: the specs differ (reward))" in errors[0]
    assert "resuming from" not in edited.stderr and not edited.stdout

    # the same spec in other words: keys reordered, indented, the defaults spelled out
    specs.write_text(json.dumps([{"limits": {"tokens": 8, "turns": 20, "wall_s": 600}, **spec}], indent=2))
    same = subprocess.run(
        [*cmd, "--steps", "3", "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert same.returncode == 0, same.stderr[-3000:]
    assert "resuming from" in same.stderr and "step-000001" in same.stderr
