"""`run_rl`: the RL stage — engine(s), gateway, rollout workers, verifiers and the trainer in one process for
N optimizer steps, in one of three modes (drivers.py).

Outputs in `out/`: `model/` (final policy, HF layout), `checkpoints/step-NNNNNN/` (every `save_every` steps:
weights, trainer state, the loop's state — data cursor, policy version, pass-rate history, metrics so far),
`steps.jsonl` (one row per step), `tensorboard/` (event files), `metrics.json` (summary), `report.md` +
`curves.png`. `resume=True` continues from the newest checkpoint of the same run (fingerprint: settings
less the step count, policy files, task file, specs) with the same data order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_json
from harnessrl.rl.collect import JournalTail
from harnessrl.rl.config import RLConfig
from harnessrl.rl.drivers import Driver, StepCounts
from harnessrl.rl.groups import DataOrder, PassRates, RolloutPool
from harnessrl.rl.learner import Learner, run_on
from harnessrl.rl.modes import StepOutcome, WorkloadKind
from harnessrl.rl.ranks import Command, Setup, TrainerRanks, build_trainer, follow, init_ranks
from harnessrl.rl.workloads import GatewayAccess, PromptWorkload, SWEWorkload, Workload
from harnessrl.train.fingerprint import RunIdentity, policy_digest

logger = logging.getLogger(__name__)

# settings that change no step's result: a resumed run may extend `steps` or change how often it saves
UNHASHED = ("steps", "save_every", "keep_checkpoints", "engine_threads", "weight_sync")


@dataclass
class RLInputs:
    workload: WorkloadKind
    tasks: Path  # task-set directory (swe) or prompt JSONL (prompt)
    out: Path
    policy: str | None = None  # HF model dir or s3:// URI; None: the tiny model
    specs: Any = None  # swe: harness specs (path, list or None for the default)
    engine_urls: list[str] = field(default_factory=list)  # remote engines; empty: local engines
    resume: bool = False
    model_out: Path | None = None
    upload_to: str | None = None  # s3:// prefix for checkpoints and the final model


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def run_identity(cfg: RLConfig, inputs: RLInputs, policy_dir: Path, workload: Workload) -> RunIdentity:
    settings = {k: v for k, v in cfg.to_dict().items() if k not in UNHASHED}
    tasks = inputs.tasks / "tasks.jsonl" if inputs.tasks.is_dir() else inputs.tasks
    parts = {
        "settings": _digest(json.dumps(settings, sort_keys=True, default=str).encode()),
        "policy": policy_digest(policy_dir),
        "tasks": _digest(tasks.read_bytes() if tasks.is_file() else "\n".join(workload.task_ids()).encode()),
        "workload": _digest(json.dumps([str(inputs.workload), str(inputs.specs)], default=str).encode()),
    }
    return RunIdentity(parts, inputs.policy or str(policy_dir))


def make_workload(inputs: RLInputs, cfg: RLConfig, work: Path) -> Workload:
    if inputs.workload is WorkloadKind.PROMPT:
        return PromptWorkload(inputs.tasks, cfg.prompt_max_tokens, cfg.temperature)
    return SWEWorkload(
        inputs.tasks,
        inputs.specs,
        cfg.group_size,
        allow_unsandboxed=cfg.allow_unsandboxed,
        verify_timeout_s=cfg.verify_timeout_s,
        work=work,
    )


def make_engine(model_dir: Path, cfg: RLConfig, urls: list[str], version: int) -> tuple[Any, list[Any]]:
    """The engine the gateway fronts (a Router when there are several replicas) and the replicas."""
    if urls:
        from harnessrl.engine.http_client import HTTPEngine

        replicas: list[Any] = [HTTPEngine(u, policy_version=version) for u in urls]
    else:
        from harnessrl.engine.local import LocalEngine

        replicas = [
            LocalEngine(
                model_dir, max_batch=cfg.max_batch, threads=cfg.engine_threads, policy_version=version
            )
            for _ in range(cfg.replicas)
        ]
    if len(replicas) == 1:
        return replicas[0], replicas
    from harnessrl.engine.router import Router

    return Router(replicas), replicas


def engine_busy_s(replicas: list[Any]) -> float | None:
    """Seconds of forward passes so far over the local replicas (None for remote engines)."""
    total = 0.0
    for e in replicas:
        stats = getattr(e, "stats", None)
        if not callable(stats):
            return None
        s = stats()
        if not isinstance(s, dict):
            return None
        total += float(s.get("prefill_forward_s", 0.0)) + float(s.get("decode_forward_s", 0.0))
    return total


def run_rl(cfg: RLConfig, inputs: RLInputs, echo: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the stage; returns the summary (also `out/metrics.json`). Under torchrun (`cfg.nproc` ranks,
    harnessrl.rl.ranks) rank 0 runs the loop and the other ranks only their part of the trainer ({})."""

    ctx = init_ranks(cfg)
    if not ctx.is_main:
        follow(cfg, ctx)
        return {}
    ranks = TrainerRanks(ctx)
    try:
        return _run_loop(cfg, inputs, echo, ranks)
    finally:
        ranks.stop()


def _run_loop(
    cfg: RLConfig, inputs: RLInputs, echo: Callable[[str], None] | None, ranks: TrainerRanks
) -> dict[str, Any]:
    import torch

    from harnessrl.engine.weight_sync import ensure_weight_sync
    from harnessrl.gateway import GatewayAdmin, GatewayConfig, GatewayServer
    from harnessrl.gateway.toolcalls import ToolParser
    from harnessrl.rl.report import write_report
    from harnessrl.rollout.model_server import resolve_tool_parser
    from harnessrl.tinymodel import load_tokenizer, tiny_model_dir
    from harnessrl.train.checkpoint import (
        check_checkpoints,
        clean_checkpoints,
        fetch_policy,
        read_meta,
        sweep_partials,
    )

    out = inputs.out
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)  # journal and weight-sync files of an earlier attempt
    (work / "workspaces").mkdir(parents=True)
    policy_dir = Path(inputs.policy) if inputs.policy else tiny_model_dir()
    if inputs.policy and inputs.policy.startswith("s3://"):
        policy_dir = fetch_policy(inputs.policy, out / "policy_in")
    if not (policy_dir / "config.json").is_file():
        raise FileNotFoundError(f"{policy_dir}: not a Hugging Face model directory (no config.json)")
    workload = make_workload(inputs, cfg, work / "workspaces")
    identity = run_identity(cfg, inputs, policy_dir, workload)
    model_out = inputs.model_out or out / "model"
    ckpt_root = out / "checkpoints"
    ckpt = check_checkpoints(ckpt_root, identity, resume=inputs.resume)
    clean_checkpoints(ckpt_root, identity, resume=inputs.resume)
    sweep_partials(model_out.parent, re.escape(model_out.name), identity.digest)

    step = version = 0
    history: list[dict[str, Any]] = []
    loop_state: dict[str, Any] = {}
    if ckpt is not None:
        meta = read_meta(ckpt) or {}
        step, history, loop_state = int(meta["step"]), list(meta.get("history", [])), dict(meta["loop"])
        version = int(loop_state["version"])
        logger.info("resuming from %s: step %d of %d, policy version %d", ckpt, step, cfg.steps, version)
    order_state = loop_state.get("order", {})
    order = DataOrder(workload.task_ids(), cfg.seed, order_state.get("cursor", 0), order_state.get("done"))
    pass_rates = PassRates(
        cfg.history_last_k, cfg.pass_threshold, [tuple(r) for r in loop_state.get("pass_rates", [])]
    )

    tokenizer = load_tokenizer(policy_dir)
    engine, replicas = make_engine(ckpt or policy_dir, cfg, inputs.engine_urls, version)
    parser = resolve_tool_parser(
        ToolParser(cfg.tool_format) if cfg.tool_format else None, tokenizer, policy_dir
    )
    max_len = int(getattr(engine, "max_context", 0) or getattr(replicas[0], "max_context", 0) or 32768)
    admin_token = "adm-" + secrets.token_urlsafe(16)
    gateway = GatewayServer(
        engine,
        tokenizer,
        work / "journal",
        admin_token,
        config=GatewayConfig(max_model_len=max_len, tool_format=parser),
    )
    pool: RolloutPool | None = None
    driver: Driver | None = None
    sink = None
    model: Any = None
    trainer: Any = None
    learner: Learner | None = None
    try:
        base = gateway.start()
        gateway_loop = gateway._loop  # engine calls run on the gateway's event loop
        name = f"engine ({', '.join(inputs.engine_urls)})" if inputs.engine_urls else "local engine"
        run_on(gateway_loop, ensure_weight_sync(engine, name, cfg.weight_sync))  # before anything is trained
        if ckpt is not None and inputs.engine_urls:  # a remote engine still serves what it started with
            run_on(gateway_loop, engine.load_weights(str(ckpt), version))

        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        setup = Setup(str(ckpt or policy_dir), None if ckpt is None else str(ckpt), pad_id or 0)
        with ranks.collective(Command.SETUP, setup):  # every trainer rank builds its part of the model
            model, trainer = build_trainer(cfg, ranks.ctx, setup)
        learner = Learner(
            model, tokenizer, trainer, cfg, out, identity, engine, upload_to=inputs.upload_to, ranks=ranks
        )
        learner.loop = gateway_loop
        from harnessrl.rl.metrics import MetricsSink

        sink = MetricsSink(out, history, echo)
        admin = GatewayAdmin(base, admin_token)
        pool = RolloutPool(
            workload,
            GatewayAccess(base, admin_token),
            JournalTail(work / "journal"),
            order,
            pass_rates,
            group_size=cfg.group_size,
            slots=cfg.rollout_slots,
            max_slots=cfg.rollout_slots + cfg.lent_rollouts,
            seed=cfg.seed,
            dynamic_low=cfg.dynamic_low,
            dynamic_high=cfg.dynamic_high,
            version=lambda: driver.version if driver is not None else version,
        )
        driver = Driver(cfg, pool, version, admin)
        driver.start()
        started = time.perf_counter()
        wall0 = float(history[-1]["wall_s"]) if history else 0.0
        busy_prev = engine_busy_s(replicas)
        skipped_prev = pool.counts.groups_skipped_dynamic
        while step < cfg.steps:
            t_step = time.perf_counter()
            counts = StepCounts()
            groups = driver.collect(counts)
            row: dict[str, Any] = {
                "step": step + 1,
                "mode": str(cfg.mode),
                "groups": [g.group_id for g in groups],
            }
            metrics = None
            sync_s = 0.0
            if groups:
                driver.before_train(counts)
                metrics = learner.train(groups, version)
                if metrics is not None:
                    version += 1
                    sync_s = learner.sync_weights(version)
                driver.after_sync(version)
                for g in groups:
                    order.consume(g.group_index)
            step += 1
            now = time.perf_counter()
            busy = engine_busy_s(replicas)
            step_s = now - t_step
            row.update(metrics or {"groups_trained": 0})
            row.update(counts.as_dict())
            row.update(
                outcome=str(StepOutcome.TRAINED if metrics else StepOutcome.NO_SIGNAL),
                version=version,
                weight_sync_s=sync_s,
                groups_skipped_dynamic=pool.counts.groups_skipped_dynamic - skipped_prev,
                groups_skipped=pool.skipped[skipped_prev:],
                dynamic_sampling_exhausted=pool.counts.dynamic_sampling_exhausted,
                engine_idle_frac=None
                if busy is None or busy_prev is None
                else max(0.0, 1.0 - (busy - busy_prev) / (step_s * len(replicas))),
                gen_tokens_per_s=counts.tokens_generated / step_s,
                step_s=step_s,
                wall_s=wall0 + now - started,
            )
            busy_prev, skipped_prev = busy, pool.counts.groups_skipped_dynamic
            sink.add(row)
            if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
                learner.checkpoint(step, _loop_meta(sink.rows, version, order, pass_rates))
        driver.stop()
        summary = summarize(sink.rows, cfg, pool, time.perf_counter() - started)
        summary.update(engine_rates(replicas), trainer_ranks=ranks.ctx.world_size)
        learner.save_final(model_out, {"steps": step, "version": version})
        atomic_write_json(out / "metrics.json", summary)
        write_report(out, summary, sink.rows, cfg)
        logger.info(
            "wrote %s after %d steps (policy version %d); metrics in %s", model_out, step, version, out
        )
        return summary
    finally:
        if driver is not None:
            driver.stop()
        if pool is not None:
            pool.close()
        if sink is not None:
            sink.close()
        if learner is not None:
            learner.close()
        gateway.stop()
        for e in replicas:
            close = getattr(e, "close", None)
            if callable(close) and not _is_coroutine_function(close):
                close()
        del model, trainer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _is_coroutine_function(fn: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def _loop_meta(rows: list[dict], version: int, order: DataOrder, pass_rates: PassRates) -> dict[str, Any]:
    return {
        "history": rows,
        "loop": {"version": version, "order": order.state(), "pass_rates": pass_rates.to_rows()},
    }


def engine_rates(replicas: list[Any]) -> dict[str, float | None]:
    """Measured engine speeds over the run (local engines): forward-pass tokens per second of decode rows and
    of prompt tokens (what benchmarks/async_sim.py calibrates from)."""
    sums = {"decode_tokens": 0.0, "decode_s": 0.0, "prefill_tokens": 0.0, "prefill_s": 0.0}
    for e in replicas:
        stats = getattr(e, "stats", None)
        s = stats() if callable(stats) else None
        if not isinstance(s, dict):
            return {"decode_tokens_per_s": None, "prefill_tokens_per_s": None}
        # tokens decode rows emitted (with speculative decoding a row emits several per step)
        sums["decode_tokens"] += float(s.get("decode_emitted_tokens", s.get("decode_row_tokens", 0)))
        sums["decode_s"] += float(s.get("decode_forward_s", 0.0))
        sums["prefill_tokens"] += float(s.get("prefill_forward_tokens", 0))
        sums["prefill_s"] += float(s.get("prefill_forward_s", 0.0))
    return {
        "decode_tokens_per_s": sums["decode_tokens"] / sums["decode_s"] if sums["decode_s"] else None,
        "prefill_tokens_per_s": sums["prefill_tokens"] / sums["prefill_s"] if sums["prefill_s"] else None,
    }


def summarize(rows: list[dict], cfg: RLConfig, pool: RolloutPool, wall_s: float) -> dict[str, Any]:
    from harnessrl.train.summary import stats, strict_json

    trained = [r for r in rows if r.get("outcome") == StepOutcome.TRAINED]

    def mean(key: str, among: list[dict]) -> float | None:
        return stats([float(r[key]) for r in among if r.get(key) is not None])["mean"]

    last = rows[-1] if rows else {}
    return strict_json(
        {
            "mode": str(cfg.mode),
            "steps": len(rows),
            "steps_trained": len(trained),
            "version": last.get("version", 0),
            "groups_trained": sum(int(r.get("groups_trained") or 0) for r in rows),
            "groups_zero_variance": sum(int(r.get("groups_zero_variance") or 0) for r in rows),
            "groups_stale_dropped": sum(int(r.get("groups_stale_dropped") or 0) for r in rows),
            "groups_skipped_dynamic": sum(int(r.get("groups_skipped_dynamic") or 0) for r in rows),
            "groups_started": pool.counts.groups_started,
            "reward_first": trained[0].get("reward_mean") if trained else None,
            "reward_last": trained[-1].get("reward_mean") if trained else None,
            "reward_all_mean": mean("reward_all_mean", rows),
            "loss_last": trained[-1].get("loss") if trained else None,
            "staleness_mean": mean("staleness_mean", trained),
            "staleness_max": max((int(r.get("staleness_max") or 0) for r in trained), default=0),
            "partial_rollouts": sum(int(r.get("partial_rollouts") or 0) for r in rows),
            "engine_idle_frac": mean("engine_idle_frac", rows),
            "weight_sync_s": mean("weight_sync_s", trained),
            "train_s": mean("train_s", trained),
            "train_tokens_per_s": mean("tokens_per_s", trained),
            "role_switches": sum(int(r.get("role_switches") or 0) for r in rows),
            "wall_s": last.get("wall_s", wall_s),
            "this_attempt_s": wall_s,
        }
    )
