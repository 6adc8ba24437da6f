"""Beyond one machine, on one machine: the RL stage across trainer nodes and a Ray cluster, and the three faults a
multi-node run meets — a lost worker node, a dead engine replica, a dead trainer rank — each survived for real.

Every run is the real `harnessrl stage rl` (sync mode, the prompt workload "Reply with only the word …", the
same policy, seed and data order, a checkpoint every step), a process of its own, as a user starts it:

  single   one node, two trainer ranks (`--nproc 2`): the reference
  nodes    a local Ray cluster of three nodes — the head (node 0's, where the stage runs) and two worker nodes
           offering a trainer node slot each (`ray start --resources '{"harnessrl_trainer_node": 1}'`) — and
           `--nproc 1 --nnodes 2 --trainer-nodes ray --rollout-workers ray`: trainer node 1 is a Ray task on a
           worker node (torchrun's static rendezvous at node 0), the rollouts are Ray tasks on any node
  worker   the same, and the Ray node that runs trainer node 1 (and its share of the rollouts) killed — every
           process of it, as when its machine is lost — after the first checkpoint
  engine   two `harnessrl engine serve` replicas behind the router (`--engine-url` twice); replica 1 killed
           after the first step and started again on its port once the router marked it down (with steps enough
           for REJOIN_S more seconds at `single`'s pace: the replica must come back before the run ends)
  rank     `--nproc 2`, trainer rank 1 killed (SIGKILL) after the first checkpoint

Flags on the last line:
  weights_match_single_node      `nodes`' final weights equal `single`'s, up to the order of float sums (the
                                 rank tests' tolerance: tests/rl/test_ranks.py)
  worker_node_killed_recovered   `worker` ended well with every step once, trainer node 1 placed again on the
                                 other worker node, the lost rollouts recorded (never scored), nothing left running
  engine_killed_recovered        `engine` ended well with every step once; the router marked replica 1 down,
                                 took it back when it answered, and it serves the run's final policy version
  trainer_rank_killed_resumed    `rank` ended well with every step once, after restarting its ranks from the
                                 newest checkpoint
  faulted_runs_match_single_node `worker`, `engine` and `rank` hold `single`'s weights after the same steps:
                                 each resume replayed the same data order and sampled the same tokens (sync
                                 mode, per-position seeds)
  lost_groups                    over every run: groups whose rollout log holds fewer rollouts than the group
                                 size, plus rollouts that ended in an infrastructure error with a reward (scored
                                 as the agent's): 0

    .venv/bin/python benchmarks/multinode.py            # the whole tiny model, 3 steps each (~15 min on 2 cores)
    .venv/bin/python benchmarks/multinode.py --smoke    # a 4-layer cut of it, 2 steps, groups of 2 (CI)

Last line: JSON with `nodes` (trainer nodes), `ray_nodes`, `steps`, `engine_steps`, the five flags, `lost_groups`, each run's
`seconds`, `minutes`.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from harnessrl.io import read_jsonl

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
ANSWERS = ("and", "the", "of", "I")
LR = 1e-4
RUN_TIMEOUT_S = 1800.0
REJOIN_S = (
    45.0  # the engine run goes on this long after the kill: a replica restarts in ~5-10 s on 2 busy cores
)


def weight_mismatches(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], lr: float) -> list[str]:
    """Tensors that differ beyond the order of float sums (two ranks reduce a gradient in halves, one rank at
    once). Adam moves an element by about lr * sign(gradient) whatever the gradient's size, so an element whose
    gradient is ~0 can step either way: a few such elements of a tensor (at most 1e-4 of it, or one element of a
    small one) may differ, by at most one step either way."""
    if got.keys() != want.keys():
        return [f"names differ: {sorted(got.keys() ^ want.keys())[:5]}"]
    out = []
    for k in want:
        diff = (got[k] - want[k]).abs()
        off = diff > 1e-5 + 1e-4 * want[k].abs()
        if int(off.sum()) > max(1, int(1e-4 * off.numel())) or float(diff.max()) > 2 * lr:
            out.append(
                f"{k}: {int(off.sum())} of {off.numel()} elements differ, the most by {float(diff.max()):.2e}"
            )
    return out


def processes_with(marker: str) -> dict[int, str]:
    """pid -> RANK (or "") of the live processes whose command line holds `marker`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            if (entry / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        rank = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RANK=")]
        found[int(entry.name)] = rank[0] if rank else ""
    return found


class StageRun:
    """One `harnessrl stage rl` process, its output in files of its folder."""

    def __init__(self, name: str, root: Path, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.name, self.out = name, root / name
        self.out.mkdir(parents=True)
        self.stdout_path, self.stderr_path = root / f"{name}.stdout", root / f"{name}.stderr"
        command = [
            sys.executable,
            "-m",
            "harnessrl.cli",
            "--no-progress",
            "stage",
            "rl",
            "--out",
            str(self.out),
        ]
        logger.info("%s: %s", name, " ".join([*command, *args]))
        self.started = time.monotonic()
        with open(self.stdout_path, "wb") as stdout, open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen([*command, *args], cwd=REPO, env=env, stdout=stdout, stderr=stderr)

    def wait_for(self, done: Any, what: str, timeout_s: float = 900.0) -> None:
        """Until `done()` holds; raises naming `what` if the stage ended or the time ran out first."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {what} never came; the stage's log: {self.stderr_path}")
            time.sleep(0.2)

    def wait_for_checkpoint(self) -> None:
        first = self.out / "checkpoints" / "step-000001" / "trainer_state.json"
        self.wait_for(first.exists, "a checkpoint after step 1")

    def finish(self) -> int:
        try:
            code = self.proc.wait(RUN_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self.seconds = round(time.monotonic() - self.started, 1)
        logger.info("%s: exit %d after %.0f s", self.name, code, self.seconds)
        return code

    @property
    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def summary(self) -> dict[str, Any] | None:
        lines = self.stdout_path.read_text(errors="replace").strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            return None

    def steps(self) -> list[int]:
        path = self.out / "steps.jsonl"
        return [r["step"] for r in read_jsonl(path)] if path.exists() else []

    def every_step_once(self, steps: int) -> bool:
        summary = self.summary()
        return self.proc.returncode == 0 and self.steps() == list(range(1, steps + 1)) and summary is not None

    def lost_groups(self, group_size: int) -> int:
        """Groups of the rollout logs short of rollouts, and rollouts scored despite an infrastructure error."""
        rows = [r for path in sorted((self.out / "rollouts").glob("step-*.jsonl")) for r in read_jsonl(path)]
        sizes = Counter(r["group_id"] for r in rows)
        short = sum(n < group_size for n in sizes.values())
        scored_infra = sum(r["rollout_status"] == "infra_error" and r["reward"] is not None for r in rows)
        return short + scored_infra

    def left_running(self) -> list[int]:
        deadline = time.monotonic() + 30
        while (left := sorted(processes_with(str(self.out)))) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def write_policy(dest: Path, layers: int) -> Path:
    """The tiny model, or its first `layers` decoder layers (real weights, real tokenizer)."""
    from harnessrl.tinymodel import cut_tiny_model, tiny_model_dir

    return cut_tiny_model(dest, layers) if layers else tiny_model_dir()


def write_tasks(path: Path) -> Path:
    rows = [
        {"task_id": f"say-{a}", "prompt": f"Reply with only the word '{a}' and nothing else.", "answer": a}
        for a in ANSWERS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def stage_args(args: argparse.Namespace, policy: Path, tasks: Path, config: Path, steps: int) -> list[str]:
    return [
        "--workload", "prompt", "--tasks", str(tasks), "--policy", str(policy), "--mode", "sync",
        "--steps", str(steps), "--save-every", "1", "--batch-groups", str(args.batch_groups),
        "--group-size", str(args.group_size), "--lr", str(LR), "--seed", "0", "--config", str(config),
    ]  # fmt: skip


def longer(base: list[str], steps: int, root: Path) -> list[str]:
    """`base` run for `steps` steps, keeping every checkpoint (the reference's last step is compared there)."""
    out = list(base)
    out[out.index("--steps") + 1] = str(steps)
    config = Path(out[out.index("--config") + 1])
    longer_config = root / f"{config.stem}-{steps}-steps.json"
    longer_config.write_text(json.dumps({**json.loads(config.read_text()), "keep_checkpoints": steps}))
    out[out.index("--config") + 1] = str(longer_config)
    return out


def weights(run: StageRun, step: int) -> dict[str, torch.Tensor] | None:
    """The run's weights after `step`: its final model, or the checkpoint of that step when it went on."""
    from safetensors.torch import load_file

    steps = run.steps()
    if step not in steps:
        return None
    folder = run.out / "model" if step == steps[-1] else run.out / "checkpoints" / f"step-{step:06d}"
    return load_file(str(folder / "model.safetensors"))


def matches(run: StageRun, reference: dict[str, torch.Tensor] | None, step: int) -> bool:
    """Whether `run` holds the reference's weights after `step` (says in the log where not)."""
    got = weights(run, step)
    mismatch = ["no weights"] if got is None or reference is None else weight_mismatches(got, reference, LR)
    for line in mismatch:
        logger.info("%s vs single after step %d: %s", run.name, step, line)
    return not mismatch


def ray_runs(args: argparse.Namespace, root: Path, base: list[str]) -> tuple[StageRun, StageRun, int]:
    """`nodes` and `worker` on one local Ray cluster (head + two trainer-node workers); its node count."""
    from harnessrl.rl.nodes import TRAINER_NODE
    from harnessrl.rollout.ray_cluster import FAST_HEALTH_CHECK, LocalRayCluster

    across = ["--nproc", "1", "--nnodes", "2", "--trainer-nodes", "ray", "--rollout-workers", "ray"]
    with LocalRayCluster(num_cpus=1, env=FAST_HEALTH_CHECK) as cluster:
        workers = [cluster.add_node(num_cpus=1, resources={TRAINER_NODE: 1}) for _ in range(2)]
        env = {**os.environ, "RAY_ADDRESS": cluster.address, **cluster.auth_env()}
        nodes = StageRun("nodes", root, [*base, *across], env)
        nodes.finish()
        worker = StageRun("worker", root, [*base, *across], env)
        worker.wait_for_checkpoint()
        remote = set(processes_with("--node-rank")) & set(processes_with(str(worker.out)))
        lost = [n for n in workers if remote & set(n.processes())]
        if len(lost) != 1:
            raise RuntimeError(f"worker: trainer node 1 runs on {len(lost)} of the worker nodes, not one")
        logger.info("worker: killing the Ray node that runs trainer node 1")
        lost[0].kill()
        worker.finish()
    return nodes, worker, 1 + len(workers)


def worker_recovered(worker: StageRun, steps: int) -> bool:
    """Every step once over both trainer nodes, node 1 placed twice on two Ray nodes, nothing left running."""
    placed = re.findall(r"trainer node 1 of 2: a Ray task on node (\w+)", worker.log)
    summary = worker.summary() or {}
    checks = {
        "every step once": worker.every_step_once(steps),
        "two trainer ranks": summary.get("trainer_ranks") == 2,
        "restarted from the newest checkpoint": "restarting every trainer rank from the newest checkpoint"
        in worker.log,
        "node 1 placed again elsewhere": len(placed) == 2 and placed[0] != placed[1],
        "node 1's own output kept": "trainer rank 1 of 2 ready"
        in (worker.out / "nodes" / "node-1.log").read_text(),
        "nothing left running": not worker.left_running(),
    }
    for what, ok in checks.items():
        if not ok:
            logger.info("worker: not so: %s", what)
    return all(checks.values())


def serve(policy: Path, port: int, log: Path) -> subprocess.Popen:
    """`harnessrl engine serve` on `port`; returns once it listens."""
    command = [sys.executable, "-m", "harnessrl.cli", "engine", "serve", "--model", str(policy), "--port", str(port),
               "--threads", "1", "--max-batch", "4"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"engine serve did not start: {line!r}; its log: {log}")
    return proc


def served_version(port: int) -> int | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as reply:
            return json.loads(reply.read())["policy_version"]
    except OSError:
        return None


def engine_run(root: Path, policy: Path, base: list[str], steps: int) -> tuple[StageRun, bool]:
    """`engine`: two served replicas, replica 1 killed after the first step and started again."""
    from harnessrl.processes import free_ports

    ports = free_ports(2)
    replicas = [serve(policy, p, root / f"replica-{k}.log") for k, p in enumerate(ports)]
    urls = [a for p in ports for a in ("--engine-url", f"http://127.0.0.1:{p}")]
    try:
        run = StageRun("engine", root, [*longer(base, steps, root), *urls])
        run.wait_for(lambda: "rl step=1 " in run.stdout_path.read_text(errors="replace"), "step 1")
        logger.info("engine: killing replica 1")
        replicas[1].kill()
        replicas[1].wait()
        run.wait_for(
            lambda: "engine replica 1" in run.log and "is down" in run.log, "replica 1 marked down", 120
        )
        replicas[1] = serve(policy, ports[1], root / "replica-1.log")
        run.finish()
        summary = run.summary() or {}
        log = run.log
        back = re.search(r"engine replica 1 answers again", log) is not None
        current = served_version(ports[1]) == summary.get("version")
        logger.info("engine: replica 1 back %s, serves the final version %s", back, current)
        return run, back and current and run.every_step_once(steps)
    finally:
        for proc in replicas:
            proc.kill()
            proc.wait()


def rank_run(root: Path, base: list[str], steps: int) -> tuple[StageRun, bool]:
    run = StageRun("rank", root, [*base, "--nproc", "2", "--max-restarts", "1"])
    run.wait_for_checkpoint()
    (victim,) = [pid for pid, rank in processes_with(str(run.out)).items() if rank == "1"]
    logger.info("rank: killing trainer rank 1 (pid %d)", victim)
    os.kill(victim, signal.SIGKILL)
    run.finish()
    restarted = "restarting every trainer rank from the newest checkpoint (restart 1 of at most 1)" in run.log
    return run, restarted and run.every_step_once(steps) and not run.left_running()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, help="where the runs go (default: a temporary folder, removed)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--layers", type=int, default=0, help="cut the tiny model to its first N layers (0: all)")
    p.add_argument("--smoke", action="store_true", help="a 4-layer cut, 2 steps, 1 group of 2 a step")
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.batch_groups, args.group_size, args.layers = 2, 1, 2, 4
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="multinode-") as scratch:
        root = args.out or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        policy = write_policy(root / "policy", args.layers)
        tasks = write_tasks(root / "tasks.jsonl")
        config = (
            root / "rl.json"
        )  # one torch thread per rank and engine: float sums do not depend on the host
        config.write_text(json.dumps({"prompt_max_tokens": 8, "engine_threads": 1, "threads": 1}))
        base = stage_args(args, policy, tasks, config, args.steps)

        single = StageRun("single", root, [*base, "--nproc", "2"])
        single.finish()
        nodes, worker, ray_nodes = ray_runs(args, root, base)
        pace = max(r["step_s"] for r in read_jsonl(single.out / "steps.jsonl"))
        engine_steps = max(args.steps, 1 + math.ceil(REJOIN_S / pace))
        engine, engine_ok = engine_run(root, policy, base, engine_steps)
        rank, rank_ok = rank_run(root, base, args.steps)

        runs = [single, nodes, worker, engine, rank]
        reference = weights(single, args.steps) if single.every_step_once(args.steps) else None
        faulted = [run for run in (worker, engine, rank) if not matches(run, reference, args.steps)]
        worker_ok = worker_recovered(worker, args.steps)
        summary = {
            "nodes": 2,
            "ray_nodes": ray_nodes,
            "steps": args.steps,
            "engine_steps": engine_steps,
            "weights_match_single_node": matches(nodes, reference, args.steps),
            "faulted_runs_match_single_node": not faulted,
            "worker_node_killed_recovered": worker_ok,
            "engine_killed_recovered": engine_ok,
            "trainer_rank_killed_resumed": rank_ok,
            "lost_groups": sum(r.lost_groups(args.group_size) for r in runs),
            "seconds": {r.name: r.seconds for r in runs},
            "minutes": round((time.monotonic() - t0) / 60, 2),
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
