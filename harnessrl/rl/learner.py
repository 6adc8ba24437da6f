"""The trainer's side of the loop: one optimizer step on finished groups, weight sync into the engine(s),
checkpoints. The step is the train stage's step plan (data.assemble → plan.plan_round → plan.step_items →
Trainer.step) on the shared update settings, so advantages, loss aggregation, PPO clip and TIS on the
behaviour log-probs are the train stage's, not a second copy. With several trainer ranks (harnessrl.rl.ranks)
the Learner lives on rank 0: each step's items, and each gather of the full weights, is announced to the other
ranks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import faulthandler
import logging
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.rl.config import RLConfig
from harnessrl.rl.groups import Group
from harnessrl.rl.publish import WeightPublisher, make_publisher
from harnessrl.rl.ranks import Command, TrainerRanks, gather_weights, trainer_threads
from harnessrl.rl.records import Update
from harnessrl.train.checkpoint import save_checkpoint, save_model, upload_dir
from harnessrl.train.lora import (
    FINAL_ADAPTER,
    adapter_of,
    adapter_writer,
    base_name,
    is_adapter_tensor,
    merged_weights,
)
from harnessrl.train.plan import plan_round, step_items
from harnessrl.train.summary import stats

if TYPE_CHECKING:
    from harnessrl.engine.base import WeightLoadingEngine
    from harnessrl.train.fingerprint import RunIdentity
    from harnessrl.train.trainer import Trainer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Synced:
    """One weight sync: its seconds and the tensor bytes it sent (a LoRA run: the adapter's, when the engines
    take adapters)."""

    seconds: float
    nbytes: int


def run_on(
    loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, Any], timeout_s: float | None = None
) -> Any:
    """Runs an engine coroutine on the gateway's event loop (an HTTP engine's connections live there). Past
    `timeout_s` it raises TimeoutError after writing every thread's stack to stderr: a loop that does not
    get to the call is stuck somewhere, and the stacks say where."""
    if loop is None:
        return asyncio.run(coro)
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        faulthandler.dump_traceback(all_threads=True)
        raise TimeoutError(
            f"the gateway's event loop did not finish an engine call in {timeout_s:g} s (every thread's stack "
            "is above)"
        ) from None


class Learner:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        trainer: Trainer,
        cfg: RLConfig,
        out: Path,
        identity: RunIdentity,
        engine: WeightLoadingEngine,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        upload_to: str | None = None,
        ranks: TrainerRanks | None = None,
    ):
        self.model, self.tokenizer, self.trainer, self.cfg = model, tokenizer, trainer, cfg
        self.out, self.identity, self.engine, self.upload_to = out, identity, engine, upload_to
        self.ranks = ranks or TrainerRanks()
        self.loop = loop  # the gateway's event loop: engine calls run there
        self.publisher: WeightPublisher | None = None  # made at the first sync

    def train(self, groups: list[Group], version: int) -> Update | None:
        """One optimizer step on exactly `groups` (the loop did dynamic sampling); None when none of them has
        a trainable rollout."""
        samples, rewards = [], {}
        for g in groups:
            samples += g.samples
            rewards.update(g.reward_rows())
        cfg = self.cfg
        prepared = cfg.prepare(samples, rewards)
        plan = plan_round(prepared, cfg)
        if not plan.steps:
            return None
        items, members = step_items(plan, plan.steps[0], cfg)
        t0 = time.perf_counter()
        self.model.train()
        # torch's thread count is process-wide and the local engine adapts it to the machine's load; the
        # step runs at the train config's count (0: every core) whatever the engine chose last
        engine_threads = torch.get_num_threads()
        torch.set_num_threads(trainer_threads(cfg.threads, self.ranks.ctx.world_size))
        try:
            with self.ranks.collective(Command.STEP, items):  # every rank trains on its share of the items
                figures = self.trainer.step(self.ranks.shard(items))
        finally:
            torch.set_num_threads(engine_threads)
        rewards_step = stats([r.reward for r in members])
        staleness = [version - g.oldest_version() for g in groups]
        return Update(
            trainer=figures,
            train_s=time.perf_counter() - t0,
            reward_mean=rewards_step["mean"],
            reward_std=rewards_step["std"],
            rollouts_trained=len(members),
            groups_trained=len(plan.steps[0]),
            staleness_mean=sum(staleness) / len(staleness),
            staleness_max=max(staleness),
            partial_rollouts=sum(g.partial_rollouts() for g in groups),
            excluded=sum(prepared.excluded.values()),
        )

    def full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full (unsharded) tensors, one at a time, on the trainer's device (a LoRA run's: the
        base layers and adapter halves apart). A collective with several trainer ranks: on rank 0 it first
        tells the other ranks (waiting in ranks.follow) to join, so a caller just consumes it here, once and to
        the end."""
        with self.ranks.collective(Command.WEIGHTS):
            yield from gather_weights(self.model)

    def sync_weights(self, version: int) -> Synced:
        """Publishes the policy to every engine as `version` (`cfg.weight_sync`: a checkpoint path the engines
        load, or a broadcast to them; harnessrl.rl.publish); a LoRA run's adapter alone. A broadcast that an
        engine replica's death broke off is sent once more, to the replicas that answer (the router has
        marked the dead one down; the publisher forms its group again without it)."""
        from harnessrl.engine.base import EngineUnreachable
        from harnessrl.engine.broadcast import BroadcastError

        try:
            return self._sync(version)
        except (EngineUnreachable, BroadcastError) as e:
            logger.warning("weight sync of version %d broke off (%s): sending it again", version, e)
            return self._sync(version)

    def _sync(self, version: int) -> Synced:
        if self.publisher is None:
            self.publisher = make_publisher(
                self.cfg.weight_sync,
                self.engine,
                self.loop,
                model=self.model,
                sync_root=self.out / "work" / "sync",
                fingerprint=self.identity.digest,
            )
        lora = self.cfg.train.lora
        if lora.enabled:
            adapter = adapter_of(self.full_weights(), lora)
            return Synced(self.publisher.publish_adapter(version, adapter), adapter.nbytes)
        sent = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal sent
            for name, tensor in self.full_weights():
                sent += tensor.nbytes
                yield name, tensor

        return Synced(self.publisher.publish(version, counted()), sent)

    def close(self) -> None:
        """Releases what the weight publisher holds (a broadcast group with the engines, its event loop)."""
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    def checkpoint(self, step: int, meta: dict[str, Any]) -> Path:
        lora = self.cfg.train.lora
        with self.ranks.collective(Command.CHECKPOINT):  # the same two collectives on every rank, in order
            weights = {
                name: t.cpu()
                for name, t in gather_weights(self.model)
                if not lora.enabled or is_adapter_tensor(name)
            }
            trainer_state = self.trainer.state_dict()
        ckpt = save_checkpoint(
            self.out / "checkpoints",
            step,
            self.model,
            self.tokenizer,
            trainer_state,
            {**self.identity.to_meta(), **meta, "config": self.cfg.to_dict()},
            keep=self.cfg.keep_checkpoints,
            state_dict=weights,
            write_weights=adapter_writer(weights, lora, base_name(self.identity.policy)),
        )
        if self.upload_to:
            upload_dir(ckpt, f"{self.upload_to.rstrip('/')}/checkpoints/{ckpt.name}")
        return ckpt

    def save_final(self, model_out: Path, meta: dict[str, Any]) -> Path:
        """The trained policy as a Hugging Face model (a LoRA run's merged, and its adapter in `adapter/`)."""
        lora = self.cfg.train.lora
        state = {name: t.cpu() for name, t in self.full_weights()}
        path = save_model(
            self.model,
            self.tokenizer,
            model_out,
            self.identity.digest,
            state_dict=dict(merged_weights(state.items(), lora)) if lora.enabled else state,
            extra_json={
                "harnessrl_rl.json": {**self.identity.to_meta(), **meta, "config": self.cfg.to_dict()}
            },
            write_extra=adapter_writer(state, lora, base_name(self.identity.policy), FINAL_ADAPTER),
        )
        if self.upload_to:
            upload_dir(path, f"{self.upload_to.rstrip('/')}/model")
        return path
