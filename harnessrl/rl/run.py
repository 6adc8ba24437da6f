"""`RLRun`: everything one run of the RL loop holds, set up and torn down in one place (a context manager).

Setup, in order: the run's start (policy resolved, identity, the checkpoint to resume from, an earlier
attempt's leftovers swept: train.checkpoint.start_run, shared with the train stage) → the engines → the
gateway in front of them (its event loop is where engine calls run) → the weight-sync check → the trainer
(on every trainer rank) and its Learner → the metrics sink → the rollout pool and the mode's driver.
Teardown runs the other way round, whatever failed. The loop itself (loop.py) only calls the run's named
steps: collect, train, publish, record, checkpoint.

Outputs in `out/`: `model/` (final policy, HF layout), `checkpoints/step-NNNNNN/` (every `save_every` steps:
weights, trainer state, the loop's state — data cursor, policy version, pass-rate history, step records so
far), `steps.jsonl`, `tensorboard/`, `metrics.json`, `report.md` + `curves.png`. `resume=True` continues from
the newest checkpoint of the same run (fingerprint: settings less the step count, policy files, task file,
workload kind, the specs' content) with the same data order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from harnessrl.engine.base import Engine, EngineStats, WeightLoadingEngine
from harnessrl.gateway.replies import ReplyCounts
from harnessrl.io import atomic_write_json
from harnessrl.rl.collect import JournalTail
from harnessrl.rl.config import RLConfig, RLInputs
from harnessrl.rl.drivers import Driver, StepBatch, make_driver
from harnessrl.rl.groups import LoopState, RolloutPool
from harnessrl.rl.learner import Learner, Synced, run_on
from harnessrl.rl.metrics import MetricsSink
from harnessrl.rl.modes import RLMode, StepOutcome, WorkloadKind
from harnessrl.rl.ranks import Command, Setup, TrainerRanks, build_trainer
from harnessrl.rl.records import EngineRates, RLSummary, StepRecord, Update, summarize
from harnessrl.rl.rollout_log import read_step_rollouts, trajectory_section, write_step_rollouts
from harnessrl.rl.runners import gateway_host, make_runner
from harnessrl.rl.workloads import GatewayAccess, PromptWorkload, TaskSetWorkload, Workload
from harnessrl.train.fingerprint import RunIdentity, policy_digest

if TYPE_CHECKING:
    from harnessrl.engine.local import LocalEngine

logger = logging.getLogger(__name__)

STATS_TIMEOUT_S = 60.0  # engines' counters are read from memory (local) or one small HTTP call (vLLM)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def run_identity(cfg: RLConfig, inputs: RLInputs, policy_dir: Path, workload: Workload) -> RunIdentity:
    tasks = inputs.tasks / "tasks.jsonl" if inputs.tasks.is_dir() else inputs.tasks
    parts = {
        "settings": _digest(json.dumps(cfg.hashed_settings(), sort_keys=True, default=str).encode()),
        "policy": policy_digest(policy_dir),
        "tasks": _digest(tasks.read_bytes() if tasks.is_file() else "\n".join(workload.task_ids()).encode()),
        # the kind, as earlier versions hashed a run without specs (so their checkpoints still resume)
        "workload": _digest(json.dumps([str(inputs.workload), "None"]).encode()),
        **spec_parts(workload),
    }
    return RunIdentity(parts, inputs.policy or str(policy_dir))


def spec_parts(workload: Workload) -> dict[str, str]:
    """The identity's parts for the harness specs a task-set workload runs under, one per spec field
    (`specs.reward`, `specs.limits`, ...) over the parsed specs in their order: what the specs say, not how a
    file spells them or where it lies, and a refusal names the fields that changed. A spec's name is a label
    (not hashed); a run without specs (every task under its environment's default) has no such parts."""
    specs = workload.specs if isinstance(workload, TaskSetWorkload) else []
    rows = [{**asdict(s.spec), "environments": list(s.environments)} for s in specs]
    names = sorted(rows[0]) if rows else []
    return {
        f"specs.{name}": _digest(
            json.dumps([row[name] for row in rows], sort_keys=True, default=str).encode()
        )
        for name in names
    }


def make_workload(inputs: RLInputs, cfg: RLConfig, work: Path) -> Workload:
    if inputs.workload is WorkloadKind.PROMPT:
        return PromptWorkload(inputs.tasks, cfg.prompt_max_tokens, cfg.temperature)
    return TaskSetWorkload(
        inputs.tasks,
        inputs.specs,
        cfg.group_size,
        allow_unsandboxed=cfg.allow_unsandboxed,
        verify_timeout_s=cfg.verify_timeout_s,
        work=work,
        environments=tuple(cfg.environments),
        spec_mix=cfg.spec_mix,
    )


@dataclass
class Engines:
    """What the loop samples from: `front` is what the gateway fronts (a Router over several replicas),
    `local` the in-process engines this run started (and stops)."""

    front: WeightLoadingEngine
    replicas: list[Engine]
    local: list[LocalEngine]
    name: str  # for messages: "local engine" or the URLs

    @classmethod
    def start(cls, model_dir: Path, cfg: RLConfig, urls: list[str], version: int) -> Engines:
        replicas: list[WeightLoadingEngine]
        local: list[LocalEngine] = []
        if urls:
            from harnessrl.engine.http_client import HTTPEngine

            replicas = [HTTPEngine(u, policy_version=version) for u in urls]
            name = f"engine ({', '.join(urls)})"
        else:
            from harnessrl.engine.local import LocalEngine

            local = [
                LocalEngine(
                    model_dir,
                    max_batch=cfg.max_batch,
                    threads=cfg.engine_threads,
                    policy_version=version,
                    dtype=cfg.engine_dtype,
                )
                for _ in range(cfg.replicas)
            ]
            replicas, name = list[WeightLoadingEngine](local), "local engine"
        if len(replicas) == 1:
            return cls(replicas[0], list(replicas), local, name)
        from harnessrl.engine.router import Router

        return cls(Router(replicas), list(replicas), local, name)

    async def stats(self) -> list[EngineStats | None]:
        return [await e.stats() for e in self.replicas]

    def close(self) -> None:
        for engine in self.local:
            engine.close()


def _known(reported: list[EngineStats | None]) -> list[EngineStats] | None:
    known = [s for s in reported if s is not None]
    return known if len(known) == len(reported) else None


def busy_s(reported: list[EngineStats | None]) -> float | None:
    """Seconds of forward passes over the replicas; None when one reports no figures."""
    known = _known(reported)
    return None if known is None else sum(s.busy_s for s in known)


def engine_rates(reported: list[EngineStats | None]) -> EngineRates:
    known = _known(reported)
    if known is None:
        return EngineRates()
    decode_s = sum(s.decode_forward_s for s in known)
    prefill_s = sum(s.prefill_forward_s for s in known)
    return EngineRates(
        decode_tokens_per_s=sum(s.decode_emitted_tokens for s in known) / decode_s if decode_s else None,
        prefill_tokens_per_s=sum(s.prefill_forward_tokens for s in known) / prefill_s if prefill_s else None,
    )


class RLRun:
    """One run of the loop on rank 0 (see the module docstring). `step` is where the run is: optimizer steps
    taken; the rest of where it is (data order, pass rates, the policy version) is the driver's `state`."""

    def __init__(
        self,
        cfg: RLConfig,
        inputs: RLInputs,
        ranks: TrainerRanks,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg, self.inputs, self.ranks, self.echo = cfg, inputs, ranks, echo
        self.out = inputs.out
        self.work = self.out / "work"
        self.step = 0
        self._stack = contextlib.ExitStack()

    # -- setup and teardown -----------------------------------------------------------------------------
    def __enter__(self) -> RLRun:
        try:
            self._setup()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def _setup(self) -> None:
        """The setup steps, in order; each registers its teardown on the stack as it goes."""
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)  # journal and weight-sync files of an earlier attempt
        (self.work / "workspaces").mkdir(parents=True)
        workload = make_workload(self.inputs, self.cfg, self.work / "workspaces")
        earlier, checkpoint, state = self._start(workload)
        self._serve(None if self.cfg.train.lora.enabled else checkpoint, state.version)
        self._build_learner(checkpoint)
        if checkpoint is not None and self.cfg.train.lora.enabled:  # the engines serve the base until now
            self.learner.sync_weights(state.version)
        self.sink = MetricsSink(self.out, earlier, self.echo)
        self._stack.callback(self.sink.close)
        self._start_rollouts(workload, state)
        self.started = time.perf_counter()
        self._wall_before = earlier[-1].wall_s if earlier else 0.0  # earlier attempts' wall time
        self._busy_before = busy_s(self._engine_stats())

    def _start(self, workload: Workload) -> tuple[list[StepRecord], Path | None, LoopState]:
        """The run's start (train.checkpoint.start_run): the step records so far, the checkpoint to resume
        from and the loop's state there (a fresh run: none, and the state at its start)."""
        from harnessrl.train.checkpoint import read_meta, start_run

        cfg, inputs = self.cfg, self.inputs
        start = start_run(
            inputs.policy,
            self.out,
            inputs.final_model,
            lambda policy_dir: run_identity(cfg, inputs, policy_dir, workload),
            resume=inputs.resume,
        )
        self.identity, self.policy_dir, checkpoint = start.identity, start.policy_dir, start.checkpoint
        earlier: list[StepRecord] = []
        meta: dict[str, Any] = {}
        if checkpoint is not None:
            meta = read_meta(checkpoint) or {}
            self.step = int(meta["step"])
            earlier = [StepRecord.from_row(row) for row in meta.get("history", [])]
        state = LoopState.from_meta(
            workload.task_ids(), cfg.seed, cfg.history_last_k, cfg.pass_threshold, meta.get("loop")
        )
        if checkpoint is not None:
            logger.info(
                "resuming from %s: step %d of %d, version %d", checkpoint, self.step, cfg.steps, state.version
            )
        return earlier, checkpoint, state

    def _serve(self, checkpoint: Path | None, version: int) -> None:
        """The engines (serving policy `version`) and the gateway in front of them."""
        from harnessrl.gateway import GatewayConfig, GatewayServer
        from harnessrl.gateway.toolcalls import ToolParser
        from harnessrl.rollout.model_server import resolve_tool_parser
        from harnessrl.tinymodel import load_tokenizer

        cfg = self.cfg
        self.tokenizer = load_tokenizer(self.policy_dir)
        self.engines = Engines.start(checkpoint or self.policy_dir, cfg, self.inputs.engine_urls, version)
        self._stack.callback(self.engines.close)
        parser = resolve_tool_parser(
            ToolParser(cfg.tool_format) if cfg.tool_format else None, self.tokenizer, self.policy_dir
        )
        self.admin_token = "adm-" + secrets.token_urlsafe(16)
        gateway = GatewayServer(
            self.engines.front,
            self.tokenizer,
            self.work / "journal",
            self.admin_token,
            config=GatewayConfig(max_model_len=self._context_length(), tool_format=parser),
            host=gateway_host(cfg.rollout_workers),
        )
        self.gateway_url = gateway.start()
        self._stack.callback(gateway.stop)
        self.loop = gateway.loop  # engine calls run on the gateway's event loop
        self._publisher_check(checkpoint, version)

    def _build_learner(self, checkpoint: Path | None) -> None:
        """The trainer on every trainer rank, and rank 0's Learner around it."""
        tokenizer = self.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        setup = Setup(
            str(self.policy_dir.resolve()),
            None if checkpoint is None else str(checkpoint.resolve()),
            pad_id or 0,
            json.loads(json.dumps(self.cfg.to_dict(), default=list)),
        )
        with self.ranks.collective(Command.SETUP, setup):  # every trainer rank builds its part of the model
            model, trainer = build_trainer(self.cfg, self.ranks.ctx, setup)
        self.learner = Learner(
            model,
            tokenizer,
            trainer,
            self.cfg,
            self.out,
            self.identity,
            self.engines.front,
            loop=self.loop,
            upload_to=self.inputs.upload_to,
            ranks=self.ranks,
        )
        self._stack.callback(self.learner.close)

    def _start_rollouts(self, workload: Workload, state: LoopState) -> None:
        """The rollout pool and the mode's driver (which owns the loop's `state`), generating from now on."""
        from harnessrl.gateway import GatewayAdmin

        cfg = self.cfg
        runner = make_runner(
            cfg.rollout_workers,
            workload,
            GatewayAccess(self.gateway_url, self.admin_token),
            threads=cfg.rollout_slots + cfg.lent_rollouts,
        )
        self.pool = RolloutPool(
            runner,
            JournalTail(self.work / "journal"),
            group_size=cfg.group_size,
            slots=cfg.rollout_slots,
            seed=cfg.seed,
        )
        self._stack.callback(self.pool.close)
        admin = GatewayAdmin(self.gateway_url, self.admin_token)
        self.driver: Driver = make_driver(cfg, self.pool, state, admin)
        self._stack.callback(self.driver.stop)
        self.driver.start()

    def _context_length(self) -> int:
        """What the gateway may let a request hold: the engine's context length, asked before the gateway's
        loop exists (on a loop of its own, whose connections are let go at once)."""
        import asyncio

        front = self.engines.front

        async def ask() -> int | None:
            try:
                return await front.context_length()
            finally:
                await front.release()

        length = asyncio.run(ask())
        if length is None:
            logger.warning("%s does not say its context length; assuming 32768 tokens", self.engines.name)
        return length or 32768

    def _publisher_check(self, checkpoint: Path | None, version: int) -> None:
        """Before anything is trained: the engines must take weights the way the config sends them; a remote
        engine resumed from a checkpoint gets the checkpoint's weights (it still serves what it started
        with)."""
        from harnessrl.engine.weight_sync import ensure_weight_sync

        front = self.engines.front
        run_on(self.loop, ensure_weight_sync(front, self.engines.name, self.cfg.weight_sync))
        if checkpoint is not None and self.inputs.engine_urls:
            run_on(self.loop, front.load_weights(str(checkpoint), version))

    def _engine_stats(self) -> list[EngineStats | None]:
        """Each replica's counters; none (the figures they feed are left out, said in the log) when the
        gateway's loop does not answer within STATS_TIMEOUT_S: figures are not worth a stuck run."""
        try:
            return run_on(self.loop, self.engines.stats(), STATS_TIMEOUT_S)
        except TimeoutError as e:
            logger.warning("engine figures left out: %s", e)
            return [None] * len(self.engines.replicas)

    # -- the steps the loop calls -----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The policy version the engines serve (weight versions published so far)."""
        return self.driver.state.version

    def collect(self) -> StepBatch:
        """Generate and verify until `batch_groups` groups with signal are done (the mode decides
        how: drivers.py)."""
        return self.driver.collect()

    def train(self, batch: StepBatch) -> Update | None:
        """One optimizer step on the batch's groups (GRPO / RLOO, rollout-level advantages)."""
        batch.collected.pause_s = self.driver.before_train()
        if (
            self.cfg.mode is not RLMode.SEPARATE
        ):  # nothing generates until the sync: the trainer gets the room
            for engine in self.engines.local:
                engine.release_until_sync()
        return self.learner.train(batch.groups, self.version)

    def publish(self, update: Update | None) -> Synced | None:
        """New weights into every engine (when the step changed them: what the sync took), then rollouts
        resume."""
        version, synced = self.version, None
        if update is not None:
            version += 1
            synced = self.learner.sync_weights(version)
        self.driver.after_sync(version)
        return synced

    def record(
        self, started: float, batch: StepBatch, update: Update | None, synced: Synced | None
    ) -> StepRecord:
        """The step that began at `started` (time.perf_counter) into steps.jsonl, TensorBoard and its line."""
        self.step += 1
        now = time.perf_counter()
        step_s = now - started
        busy = busy_s(self._engine_stats())
        idle = None
        if busy is not None and self._busy_before is not None:
            idle = max(0.0, 1.0 - (busy - self._busy_before) / (step_s * len(self.engines.replicas)))
        self._busy_before = busy
        finished = batch.groups + [g for g, _ in batch.discarded]  # the step's rollouts (rollouts/step-N)
        record = StepRecord(
            step=self.step,
            mode=str(self.cfg.mode),
            outcome=StepOutcome.TRAINED if update is not None else StepOutcome.NO_SIGNAL,
            version=self.version,
            groups=[g.group_id for g in batch.groups],
            collected=batch.collected,
            update=update,
            weight_sync_s=synced.seconds if synced else 0.0,
            weight_sync_bytes=synced.nbytes if synced else 0,
            engine_idle_frac=idle,
            gen_tokens_per_s=batch.collected.tokens_generated / step_s,
            step_s=step_s,
            wall_s=self._wall_before + now - self.started,
            replies=sum((g.replies for g in finished), ReplyCounts()).figures(),
        )
        self.sink.add(record)
        write_step_rollouts(self.out, self.step, self.version, batch.groups, batch.discarded)
        return record

    def checkpoint_if_due(self) -> None:
        every = self.cfg.save_every
        if every and self.step % every == 0 and self.step < self.cfg.steps:
            meta = {"history": [r.row() for r in self.sink.records], "loop": self.driver.state.to_meta()}
            self.learner.checkpoint(self.step, meta)

    def finish(self) -> RLSummary:
        """Stops generating; writes the final model, `metrics.json` and the report."""
        from harnessrl.rl.report import write_report

        self.driver.stop()
        summary = summarize(
            self.sink.records,
            str(self.cfg.mode),
            self.pool.counts.groups_started,
            time.perf_counter() - self.started,
            engine_rates(self._engine_stats()),
            self.ranks.ctx.world_size,
            self.cfg.train.lora.rank,
        )
        model_out = self.inputs.final_model
        self.learner.save_final(model_out, {"steps": self.step, "version": self.version})
        atomic_write_json(self.out / "metrics.json", summary.to_dict())
        view = trajectory_section(
            read_step_rollouts(self.out, self.step),
            self.work / "journal",
            lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),
        )
        write_report(self.out, summary, self.sink.records, self.cfg, view)
        logger.info(
            "wrote %s after %d steps (policy version %d); metrics in %s",
            model_out,
            self.step,
            self.version,
            self.out,
        )
        return summary
