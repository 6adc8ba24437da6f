"""Multi-process data parallelism for the train stage (torchrun: WORLD_SIZE / RANK / LOCAL_RANK).

- `init_from_env` starts `torch.distributed` (nccl on GPU, gloo on CPU) when WORLD_SIZE > 1.
- `shard_items` gives each rank its share of one optimizer step's sequences. The aggregation weights were
  computed from the *whole* step before sharding (losses.sequence_weights), so the global token / sequence /
  rollout denominators are the same on every rank; the Trainer multiplies each rank's loss by the world size
  and FSDP's reduce-scatter averages, which sums the shares back to the full-batch gradient.
- `wrap_fsdp` shards the model with FSDP2 (`torch.distributed.fsdp.fully_shard`): each decoder layer, then the
  root. FSDP2 runs on CPU with gloo in torch 2.13 (tests/train/test_distributed.py runs it), so one code path
  serves CPU tests and multi-GPU nodes.
- `full_state_dict` gathers the unsharded weights (a collective: every rank calls it) for rank 0 to save.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from harnessrl.processes import end_with_parent
from harnessrl.train.batching import SeqItem


@dataclass(frozen=True)
class Rendezvous:
    """Where one node's ranks meet the other nodes' (torchrun's static rendezvous: node ranks are given, so
    rank 0, which runs the RL loop, is on node 0). `master_addr`: node 0's address, reachable from every node;
    node 0's torchrun agent hosts the store there at `master_port`."""

    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    def torchrun_args(self, nnodes: int) -> list[str]:
        if nnodes == 1:
            return ["--standalone"]
        if not 0 <= self.node_rank < nnodes:
            raise ValueError(f"node rank {self.node_rank} outside {nnodes} nodes (0 … {nnodes - 1})")
        return [
            "--nnodes", str(nnodes), "--node-rank", str(self.node_rank),
            "--master-addr", self.master_addr, "--master-port", str(self.master_port),
        ]  # fmt: skip


@dataclass(frozen=True)
class DistContext:
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env(device: str) -> DistContext:
    """Reads torchrun's environment; with WORLD_SIZE > 1 initializes the default process group.

    `device` is the stage's setting: "auto" (a GPU when there is one), "cpu", "cuda" or "cuda:N"; on CUDA
    each rank takes GPU LOCAL_RANK.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(device=device)
    end_with_parent()  # torchrun puts each rank in a session of its own: a rank must not outlive its agent
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        if torch.cuda.device_count() <= local_rank:
            raise RuntimeError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} GPU(s) are visible; "
                f"start torchrun with --nproc-per-node ≤ the GPU count"
            )
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
    return DistContext(
        world_size=dist.get_world_size(), rank=dist.get_rank(), local_rank=local_rank, device=device
    )


def shard_items(items: Sequence[SeqItem], rank: int, world_size: int) -> list[SeqItem]:
    """This rank's share of a step's sequences, balanced by token count (longest first onto the least-loaded
    rank; ties by index and lowest rank), so every rank computes the same split without communicating."""
    if world_size <= 1:
        return list(items)
    loads = [0] * world_size
    owner = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-len(items[i]), i)):
        r = min(range(world_size), key=lambda r: (loads[r], r))
        owner[i] = r
        loads[r] += len(items[i])
    return [it for i, it in enumerate(items) if owner[i] == rank]


def wrap_fsdp(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: shard every decoder layer, then the root (embeddings, final norm, lm_head; tied weights stay
    together in the root's group)."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: expected a causal LM with .model.layers to shard with FSDP")
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def is_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """Unsharded CPU state dict (collective; complete on rank 0 — other ranks get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # tied parameters (embeddings ↔ lm_head) come back as separate copies: keep the first name only, as
    # save_pretrained does for an unsharded model
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            full.pop(name, None)
        seen.add(id(p))
    return full


def all_reduce_sum(values: dict[str, float], device: str) -> dict[str, float]:
    """Sums scalar metrics across ranks (identity without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist(), strict=True))


def max_across_ranks(value: int, device: str) -> int:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
