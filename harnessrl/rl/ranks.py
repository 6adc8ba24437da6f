"""Trainer ranks inside the RL loop: `harnessrl stage rl --nproc N` runs the stage under torchrun with N ranks.

Rank 0 runs the whole loop as with one rank (engines, gateway, rollouts, verification, checkpoints, metrics,
reports) and its `Learner`. The other ranks hold only their part of the trainer (FSDP2, the train stage's
harnessrl.train.distributed) and wait in `follow` for rank 0 to say which collective comes next:

- SETUP, first: where every rank loads the starting weights (and trainer state, on a resume);
- STEP: the optimizer step's planned items; each rank trains on its share (`shard_items`) and FSDP averages the
  gradients, as in the train stage;
- WEIGHTS: gather the full weights (weight sync into the engines, the final model);
- CHECKPOINT: the full weights, then the trainer state (both collectives);
- STOP: leave. Rank 0 sends it when the loop ends, and when it fails outside a collective.

The other ranks wait for the next command on torchrun's store, not in a collective: the wait lasts as long
as rank 0's rollouts take (hours, on real tasks), while collectives time out after the process group's
timeout (30 min for gloo). A rank that dies takes the others with it: torchrun stops every rank when one exits
non-zero, and the launching process names the failed rank (harnessrl.train.launch.run_ranks).

Across nodes (`--nnodes M`, each node `--nproc N` ranks): every node runs the same `harnessrl stage rl` command
with its own `--node-rank` and node 0's `--master-addr`; torchrun's static rendezvous puts rank 0 (the loop) on
node 0, and the ranks of the other nodes follow as above. They take their settings from rank 0 (SETUP carries
them, so a node started with other settings cannot train another model), and read the starting policy (and a
resumed checkpoint) at the path rank 0 gives: a volume every node mounts at the same path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from harnessrl.train import distributed as dist_mod
from harnessrl.train.batching import SeqItem
from harnessrl.train.distributed import DistContext, Rendezvous

if TYPE_CHECKING:
    from harnessrl.rl import nodes
    from harnessrl.rl.config import RLConfig, RLInputs
    from harnessrl.rl.records import RLSummary
    from harnessrl.train.trainer import Trainer

logger = logging.getLogger(__name__)


class Command(StrEnum):
    SETUP = "setup"
    STEP = "step"
    WEIGHTS = "weights"
    CHECKPOINT = "checkpoint"
    STOP = "stop"


@dataclass(frozen=True)
class Setup:
    policy_dir: str  # the run's starting policy
    checkpoint: str | None  # a resume: its weights (a LoRA run's: its adapter) and trainer state
    pad_id: int
    config: dict[str, Any]  # rank 0's settings (RLConfig.to_dict): every rank trains by them


def in_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def init_ranks(cfg: RLConfig) -> DistContext:
    """This process's place among the trainer ranks (the process group is started when there are several)."""
    ctx = dist_mod.init_from_env(cfg.device)
    if ctx.world_size != cfg.trainer_ranks:
        dist_mod.shutdown()
        raise ValueError(
            f"nproc {cfg.nproc} × nnodes {cfg.nnodes} is {cfg.trainer_ranks} ranks but this process is one of "
            f"{ctx.world_size} torchrun ranks; run `harnessrl stage rl --nproc N [--nnodes M ...]` without "
            "torchrun (it starts the ranks itself)"
        )
    return ctx


def trainer_threads(threads: int, world_size: int) -> int:
    """torch CPU threads of one trainer rank: the train config's count, else the node's cores shared by the
    ranks on it (torchrun's LOCAL_WORLD_SIZE; `world_size` outside torchrun)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return threads or max(1, (os.cpu_count() or 1) // local)


class _Doorbell:
    """Numbered commands rung on torchrun's store (TCPStore at MASTER_ADDR:MASTER_PORT): rank 0 rings before
    each broadcast, the others wait for the ring as long as it takes, then join the broadcast."""

    def __init__(self) -> None:
        from torch.distributed import PrefixStore, TCPStore  # pyright: ignore[reportPrivateImportUsage]

        store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(minutes=5),
        )
        self.store = PrefixStore("harnessrl/rl/ranks/", store)
        self.seq = 0

    def ring(self) -> None:
        self.store.set(str(self.seq), "1")
        self.seq += 1

    def wait(self) -> None:
        key, pause = [str(self.seq)], 0.001
        while not self.store.check(key):
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        self.seq += 1


class TrainerRanks:
    """Rank 0's side: each collective is announced to the other ranks first. With one rank, nothing is sent.
    `broken` is set while a collective runs, so a failure inside one does not send STOP into a half-done
    collective (torchrun stops the other ranks then)."""

    def __init__(self, ctx: DistContext | None = None):
        self.ctx = ctx or DistContext()
        self.broken = False
        self.stopped = False
        self.bell = _Doorbell() if self.ctx.enabled else None

    def _tell(self, command: Command, payload: Any = None) -> None:
        if self.bell is not None:
            self.bell.ring()
            dist.broadcast_object_list([str(command), payload], src=0)

    @contextlib.contextmanager
    def collective(self, command: Command, payload: Any = None) -> Iterator[None]:
        self._tell(command, payload)
        self.broken = True
        yield
        self.broken = False

    def shard(self, items: Sequence[SeqItem]) -> list[SeqItem]:
        return dist_mod.shard_items(items, self.ctx.rank, self.ctx.world_size)

    def stop(self) -> None:
        if self.stopped or not self.ctx.enabled:
            return
        self.stopped = True
        try:
            if not self.broken:
                self._tell(Command.STOP)
        except Exception:  # a rank already gone: torchrun stops the rest
            logger.warning("could not tell the other trainer ranks to stop", exc_info=True)
        finally:
            dist_mod.shutdown()


def _receive(bell: _Doorbell) -> tuple[Command, Any]:
    bell.wait()
    box: list[Any] = [None, None]
    dist.broadcast_object_list(box, src=0)
    return Command(box[0]), box[1]


def _tied_names(model: torch.nn.Module) -> set[str]:
    seen: set[int] = set()
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.add(id(p))
    return tied


def gather_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The full tensors, one at a time, in state-dict order (a tied weight once, under its first name). Under
    FSDP each sharded tensor is all-gathered: every rank must run this to the end, in lockstep."""
    from torch.distributed.tensor import DTensor

    tied = _tied_names(model)
    for name, t in model.state_dict().items():
        if name in tied:
            continue
        yield name, (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def build_trainer(cfg: RLConfig, ctx: DistContext, setup: Setup) -> tuple[Any, Trainer]:
    """The policy model on this rank's device (sharded with FSDP2 when there are several ranks) and its
    Trainer, as the train stage builds them."""
    from harnessrl.train.checkpoint import load_checkpoint_state
    from harnessrl.train.lora import load_trainable
    from harnessrl.train.trainer import Trainer, seed_everything

    seed_everything(cfg.train.seed)
    checkpoint = None if setup.checkpoint is None else Path(setup.checkpoint)
    for what, path in (("starting policy", Path(setup.policy_dir)), ("checkpoint", checkpoint)):
        if path is not None and not path.is_dir():
            raise FileNotFoundError(
                f"trainer rank {ctx.rank}: the {what} rank 0 loads, {path}, is not on this node: mount the "
                "run's volume at the same path on every node"
            )
    model = load_trainable(Path(setup.policy_dir), checkpoint, cfg.train.lora)
    torch.nn.Module.to(model, ctx.device)
    if ctx.enabled:
        dist_mod.wrap_fsdp(model)
    trainer = Trainer(model, cfg.train, device=ctx.device, pad_id=setup.pad_id)
    if setup.checkpoint is not None:
        trainer.load_state_dict(load_checkpoint_state(Path(setup.checkpoint))[0])
    return model, trainer


def follow(cfg: RLConfig, ctx: DistContext) -> None:
    """A rank other than 0: its part of every collective rank 0 announces, until STOP."""
    try:
        bell = _Doorbell()
        command, setup = _receive(bell)
        if command is Command.STOP:
            return
        cfg = type(cfg).from_dict(setup.config, "rank 0's rl config")
        torch.set_num_threads(trainer_threads(cfg.threads, ctx.world_size))
        model, trainer = build_trainer(cfg, ctx, setup)
        logger.info("trainer rank %d of %d ready on %s", ctx.rank, ctx.world_size, ctx.device)
        while True:
            command, payload = _receive(bell)
            if command is Command.STOP:
                return
            if command is Command.STEP:
                trainer.step(dist_mod.shard_items(payload, ctx.rank, ctx.world_size))
            elif command in (Command.WEIGHTS, Command.CHECKPOINT):
                for _ in gather_weights(model):
                    pass
                if command is Command.CHECKPOINT:
                    trainer.state_dict()
            else:
                raise RuntimeError(f"trainer rank {ctx.rank}: unexpected {command} from rank 0")
    finally:
        dist_mod.shutdown()


def launch(cfg: RLConfig, inputs: RLInputs, *, timeout: float | None = None) -> RLSummary | None:
    """`harnessrl stage rl` under torchrun with `cfg.nproc` ranks on this node (of `cfg.nnodes`; this process
    waits; the ranks' output passes through live). Returns rank 0's summary (OUT/metrics.json) on node 0, None
    on the others. A failed rank restarts every rank of this node as a fresh torchrun resumed from the newest
    checkpoint, `cfg.max_restarts` times (torchrun's own `--max-restarts` reuses its store, and a restarted
    gloo group then fails to connect: measured with torch 2.13); then raises launch.RanksFailed naming the
    rank that failed. Rank 0's own error (exit code 2: a bad setting, a refused engine) is not retried."""
    from harnessrl.io import atomic_write_json
    from harnessrl.rl import nodes
    from harnessrl.rl.modes import TrainerNodes

    if inputs.specs is not None and not isinstance(inputs.specs, str | Path):
        raise TypeError("specs: with nproc > 1 give a spec file path (the ranks read it)")
    out = inputs.out
    out.mkdir(parents=True, exist_ok=True)
    config = out / "rl_config.json"
    atomic_write_json(config, json.loads(json.dumps(cfg.to_dict(), default=list)))
    args = ["--workload", str(inputs.workload), "--tasks", str(inputs.tasks), "--out", str(out)]
    args += ["--config", str(config)]
    if inputs.policy:
        args += ["--policy", inputs.policy]
    if inputs.specs is not None:
        args += ["--specs", str(inputs.specs)]
    for url in inputs.engine_urls:
        args += ["--engine-url", url]
    if inputs.model_out is not None:
        args += ["--model-out", str(inputs.model_out)]
    if inputs.upload_to:
        args += ["--upload-to", inputs.upload_to]
    by_ray = inputs.trainer_nodes is TrainerNodes.RAY and cfg.nnodes > 1 and inputs.rendezvous.node_rank == 0
    try:
        _run_with_restarts(cfg, inputs, args, by_ray, timeout)
    finally:
        if by_ray:  # Ray prints what it hears of on stdout while connected: nothing may follow the summary
            nodes.disconnect()
    if inputs.rendezvous.node_rank != 0:
        return None
    from harnessrl.rl.records import RLSummary

    return RLSummary.from_dict(json.loads((out / "metrics.json").read_text(encoding="utf-8")))


def _run_with_restarts(
    cfg: RLConfig, inputs: RLInputs, args: list[str], by_ray: bool, timeout: float | None
) -> None:
    """This node's torchrun (and, `by_ray`, the other nodes' Ray tasks), restarted from the newest checkpoint
    when a rank or node fails, `cfg.max_restarts` times (launch's docstring)."""
    from harnessrl.rl import nodes
    from harnessrl.train.launch import RanksFailed, RanksStopped, run_ranks, stage_command

    for restart in range(cfg.max_restarts + 1):
        resume = ["--resume"] if inputs.resume or restart else []
        rendezvous, agents = inputs.rendezvous, []
        if by_ray:  # the other nodes: Ray tasks on other Ray nodes, meeting this one at a fresh port
            rendezvous, agents = _start_other_nodes(cfg, args + resume, inputs.out / "nodes")
        command = stage_command(cfg.nproc, "rl", args + resume, cfg.nnodes, rendezvous)
        try:
            run_ranks(
                command,
                cfg.trainer_ranks,
                timeout=timeout,
                stream=True,
                what="trainer rank",
                watch=functools.partial(nodes.failed_agent, agents) if agents else None,
            )
            nodes.finish(agents, stop=False)
            break
        except (RanksFailed, RanksStopped, nodes.TrainerNodesError) as e:
            nodes.finish(agents, stop=True)
            first = e.failures[0] if isinstance(e, RanksFailed) and e.failures else None
            if restart == cfg.max_restarts or (first is not None and first.rank == 0 and first.exitcode == 2):
                raise  # out of restarts, or rank 0's own error (it has printed it): the same again
            logger.warning(
                "%s: restarting every trainer rank from the newest checkpoint (restart %d of at most %d)",
                e,
                restart + 1,
                cfg.max_restarts,
            )


def _start_other_nodes(
    cfg: RLConfig, args: list[str], logs: Path
) -> tuple[Rendezvous, list[nodes.NodeAgent]]:
    """Trainer nodes 1 … nnodes-1 as Ray tasks (harnessrl.rl.nodes), each this stage's command with its node
    rank, meeting this node (0) at a fresh port; their output in `logs`."""
    from harnessrl.processes import free_port
    from harnessrl.rl import nodes

    ray_nodes, need = nodes.place(cfg.nnodes, cfg.nproc, gpus=torch.cuda.is_available())
    rendezvous = Rendezvous(0, nodes.driver_address(), free_port())
    stage = [sys.executable, "-m", "harnessrl.cli", "stage", "rl", *args]
    commands = [
        nodes.node_command(stage, k, rendezvous.master_addr, rendezvous.master_port)
        for k in range(1, cfg.nnodes)
    ]
    return rendezvous, nodes.start_agents(commands, ray_nodes, need, logs)
