"""Trainer nodes placed by Ray (`harnessrl stage rl --nnodes M --trainer-nodes ray`): node 0 is this process's
node, where rank 0 runs the loop; nodes 1 … M-1 are Ray tasks, one on each of M-1 other Ray nodes, each running
this stage's command with its node rank and this node's address (torchrun's static rendezvous, rl/ranks.py).

A Ray node offers a trainer node slot as the custom resource `harnessrl_trainer_node` (`ray start --resources
'{"harnessrl_trainer_node": 1}'`; the RayJob of components/launch_rl gives its trainer worker group one per pod),
and a task takes one — and `nproc` GPUs of that node when this node has GPUs — so trainer nodes never land on
the pods meant for other work. Ray connects with `RAY_ADDRESS` (the RayJob's driver has it set).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TRAINER_NODE = "harnessrl_trainer_node"  # a custom Ray resource: a Ray node's trainer node slots


class TrainerNodesError(RuntimeError):
    """The other trainer nodes cannot be placed (too few Ray nodes with the resources), or one failed."""


@dataclass(frozen=True)
class NodeAgent:
    """One remote trainer node: the Ray node it runs on and its task (which returns the command's exit code)."""

    node_rank: int
    ray_node: str
    task: Any  # ray.ObjectRef[int]
    log: Path  # its command's output


def _run_node(command: list[str], log: str) -> int:
    """Runs on the remote Ray node: the stage's command for this node (its torchrun waits for node 0), its
    output appended to `log` (on the run's volume: node 0 names it when the node fails)."""
    from harnessrl.processes import die_with_parent

    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:  # the command ends with the task (cancelled: its Ray worker is killed)
        return subprocess.run(die_with_parent(command), stdout=out, stderr=subprocess.STDOUT).returncode


def _this_node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def driver_address() -> str:
    """This node's address as the other Ray nodes reach it (the rendezvous' master address)."""
    import ray

    return ray.util.get_node_ip_address()


def place(nnodes: int, nproc: int, gpus: bool) -> tuple[list[str], dict[str, Any]]:
    """The Ray nodes (ids) for trainer nodes 1 … nnodes-1, none of them this one, and the task's resources."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=False, configure_logging=False
        )
    need: dict[str, Any] = {"resources": {TRAINER_NODE: 1}, **({"num_gpus": nproc} if gpus else {})}
    here = _this_node_id()
    fits = [
        n["NodeID"]
        for n in ray.nodes()
        if n.get("Alive")
        and n["NodeID"] != here
        and n.get("Resources", {}).get(TRAINER_NODE, 0) >= 1
        and (not gpus or n.get("Resources", {}).get("GPU", 0) >= nproc)
    ]
    if len(fits) < nnodes - 1:
        what = f"the resource {TRAINER_NODE}" + (f" and {nproc} GPU(s)" if gpus else "")
        raise TrainerNodesError(
            f"--nnodes {nnodes}: {nnodes - 1} other Ray node(s) with {what} needed, the cluster has {len(fits)}; "
            "add worker nodes (KubeRay: the trainer worker group's replicas) or lower --nnodes"
        )
    return sorted(fits)[: nnodes - 1], need


def start_agents(
    commands: Sequence[list[str]], ray_nodes: Sequence[str], need: dict[str, Any], logs: Path
) -> list[NodeAgent]:
    """Starts `commands[k]` (trainer node k+1) on `ray_nodes[k]`, each a Ray task pinned to its node, its
    output in `logs`/node-<k+1>.log."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(_run_node)
    agents = []
    for rank, (command, node) in enumerate(zip(commands, ray_nodes, strict=True), 1):
        task = remote.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), **need
        ).remote(command, str(logs / f"node-{rank}.log"))
        agents.append(NodeAgent(rank, node, task, logs / f"node-{rank}.log"))
        logger.info(
            "trainer node %d of %d: a Ray task on node %s (its output: %s)",
            rank,
            len(commands) + 1,
            node[:12],
            logs / f"node-{rank}.log",
        )
    return agents


def failed_agent(agents: Sequence[NodeAgent]) -> str | None:
    """Why the first remote node that has ended did end badly (None: every one runs or ended well)."""
    if not agents:
        return None
    import ray

    done, _ = ray.wait([a.task for a in agents], num_returns=len(agents), timeout=0)
    for agent in agents:
        if agent.task in done:
            try:
                code = ray.get(agent.task)
            except Exception as e:  # the Ray node died, the task could not run
                return f"trainer node {agent.node_rank} (Ray node {agent.ray_node[:12]}) failed: {e}"
            if code != 0:
                return (
                    f"trainer node {agent.node_rank} (Ray node {agent.ray_node[:12]}) exited with {code} "
                    f"(its output: {agent.log})"
                )
    return None


def finish(agents: Sequence[NodeAgent], stop: bool) -> None:
    """Waits for the remote nodes (after node 0 ended well), or stops them (`stop`)."""
    if not agents:
        return
    import ray

    if stop:
        for agent in agents:
            ray.cancel(agent.task, force=True)
        return
    for agent in agents:
        ray.get(agent.task)
    if (why := failed_agent(agents)) is not None:
        raise TrainerNodesError(why)


def disconnect() -> None:
    """Leaves the Ray cluster `place` joined. Ray prints the errors it hears of (a lost node's task) on this
    process's stdout while it is connected: disconnected before the summary is printed, nothing follows it."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def node_command(command: list[str], node_rank: int, master_addr: str, master_port: int) -> list[str]:
    """This stage's command for another node: its node rank and node 0's rendezvous address appended (argparse
    takes the last value), in this Python."""
    return [sys.executable, *command[1:], "--node-rank", str(node_rank), "--master-addr", master_addr,
            "--master-port", str(master_port)]  # fmt: skip
