"""`evaluate` stage: k rollouts per task per policy through the training path (run_generate -> run_verify),
then pass@1 / pass@k with intervals, breakdowns, what the replies looked like, and paired comparisons against
the first policy — on the whole task set and per held-out group (`eval_group`) — and one request answered by
every policy side by side.

Output directory (replaced atomically):
    evaluation.json     the comparable result (schema `harnessrl.evaluation/1`; `harnessrl stage evaluate
                        --compare A.json B.json` reads it)
    report.md, pass_at_1.png, metrics.json
    runs/<policy>/<mode>/rollouts/, verified/   the generate and verify outputs behind every number
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.difficulty.selection import Split
from harnessrl.environments.registry import environment_of
from harnessrl.evaluate.results import (
    SCHEMA,
    EvalMode,
    comparisons,
    eval_groups,
    first_replies,
    group_figures,
    score_run,
    side_by_side,
)
from harnessrl.gateway.replies import ReplyFigures
from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, read_jsonl
from harnessrl.rollout.config import DEFAULT_CONCURRENCY
from harnessrl.rollout.executors import ExecutorName
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import NamedSpec, load_specs
from harnessrl.sandbox.workspace import safe_name
from harnessrl.taskset import TaskSet

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Policy:
    """A policy to evaluate. `push_weights`: load `checkpoint` into the engine at `engine_url` first (one
    remote engine serving several policies in turn); without it a remote engine serves what it has."""

    name: str
    checkpoint: str | None = None  # HF model dir, or a LoRA adapter dir over its base; None: the tiny model
    engine_url: str | None = None
    push_weights: bool = False

    def source(self, max_batch: int = 16) -> ModelSource:
        return ModelSource(checkpoint=self.checkpoint, engine_url=self.engine_url, max_batch=max_batch)

    def describe(self) -> str:
        if self.engine_url:
            return (
                f"{self.engine_url} (weights {self.checkpoint} pushed)"
                if self.push_weights
                else self.engine_url
            )
        return self.checkpoint or "tiny base model"


@dataclass
class EvaluateConfig:
    k: int = 4  # rollouts per task in sampled mode (greedy: 1)
    modes: tuple[EvalMode, ...] = (EvalMode.SAMPLED,)
    concurrency: int = DEFAULT_CONCURRENCY
    verify_workers: int = 2
    seed: int = 0
    max_tasks: int | None = None
    instance_ids: list[str] | None = None
    bootstrap_iterations: int = 10_000
    allow_unsandboxed: bool = False
    executor: ExecutorName = ExecutorName.THREADS
    max_batch: int = 16

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k (rollouts per task) must be >= 1, got {self.k}")
        if not self.modes:
            raise ValueError("give at least one mode (greedy, sampled)")
        self.modes = tuple(dict.fromkeys(parse_choice(EvalMode, m, "mode") for m in self.modes))


def resolve_tasks(path: str | Path, split: Split = Split.TEST) -> Path:
    """A task-set directory, or the output of `select` (then its held-out `test/` split by default)."""
    path = Path(path)
    if not (path / "tasks.jsonl").is_file() and (path / split / "tasks.jsonl").is_file():
        return path / split
    return path


def mode_options(mode: EvalMode) -> dict[str, Any]:
    """Greedy: every rollout's spec at temperature 0 (every harness takes the `temperature` option);
    sampled: as given."""
    return {} if mode is EvalMode.SAMPLED else {"temperature": 0.0}


def _push_weights(policy: Policy, version: int) -> None:
    from harnessrl.engine.http_client import HTTPEngine

    url, checkpoint = policy.engine_url, policy.checkpoint
    if not url or not checkpoint:
        raise ValueError(f"policy {policy.name!r}: pushing weights needs both an engine URL and a checkpoint")

    async def push() -> None:
        from harnessrl.train.lora import is_adapter_dir

        engine = HTTPEngine(url)
        try:
            if is_adapter_dir(Path(checkpoint)):  # a LoRA adapter: the engine merges it onto its base
                await engine.load_adapter(checkpoint, version)
            else:
                await engine.load_weights(checkpoint, version)
        finally:
            await engine.release()

    try:
        asyncio.run(push())
    except Exception as e:
        raise ValueError(
            f"policy {policy.name!r}: the engine at {policy.engine_url} did not load {policy.checkpoint} "
            f"({type(e).__name__}: {e}); serve each policy on its own engine, or use an engine that takes "
            "new weights (`harnessrl engine serve`)"
        ) from None


def run_evaluate(
    tasks: str | Path,
    out: str | Path,
    policies: Sequence[Policy],
    specs: list[NamedSpec] | str | Path | None = None,
    config: EvaluateConfig | None = None,
) -> dict[str, Any]:
    """Evaluates every policy in every mode on `tasks`; writes `out`; returns the evaluation (evaluation.json)."""
    from components.evaluate.report import render_report
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.verify.rollouts import run_verify

    cfg = config or EvaluateConfig()
    taskset = TaskSet.open(resolve_tasks(tasks))
    if not policies:
        raise ValueError("give at least one policy to evaluate")
    names = [p.name for p in policies]
    if len(set(names)) != len(names) or len({safe_name(n) for n in names}) != len(names):
        raise ValueError(f"policy names must be distinct: {names}")
    named = specs if isinstance(specs, list) else load_specs(specs)
    task_rows = taskset.rows()
    if not task_rows:
        return _nothing_to_evaluate(taskset, out, cfg, named)
    results: list[dict[str, Any]] = []
    firsts: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (policy, mode) -> task -> first rollout
    with atomic_output(out) as tmp:
        for version, policy in enumerate(policies, 1):
            if policy.push_weights:
                _push_weights(policy, version)
            for mode in cfg.modes:
                run = tmp / "runs" / safe_name(policy.name) / mode
                group = 1 if mode is EvalMode.GREEDY else cfg.k
                logger.info("evaluate: %s (%s), %s, %d per task", policy.name, policy.describe(), mode, group)
                run_generate(
                    taskset.root,
                    run / "rollouts",
                    named,
                    policy.source(cfg.max_batch),
                    GenerateConfig(
                        spec_options=mode_options(mode),
                        group_size=group,
                        concurrency=cfg.concurrency,
                        max_tasks=cfg.max_tasks,
                        instance_ids=cfg.instance_ids,
                        allow_unsandboxed=cfg.allow_unsandboxed,
                        seed=cfg.seed,
                        executor=cfg.executor,
                    ),
                )
                run_verify(taskset.root, run / "rollouts", run / "verified", cfg.verify_workers, sandbox=None)
                rollouts = list(read_jsonl(run / "rollouts" / "rollouts.jsonl"))
                rewards = list(read_jsonl(run / "verified" / "rewards.jsonl"))
                calls = model_calls(run / "rollouts" / "records.parquet")
                result = score_run(rollouts, rewards, policy.name, mode, group, calls)
                result["source"] = policy.describe()
                results.append(result)
                firsts[policy.name, str(mode)] = first_replies(rollouts, rewards)
        evaluation = build_evaluation(str(taskset.root), task_rows, cfg, named, results, firsts)
        atomic_write_json(tmp / "evaluation.json", evaluation)
        metrics = flat_metrics(evaluation)
        atomic_write_json(tmp / "metrics.json", metrics)
        atomic_write_text(tmp / "report.md", render_report(evaluation, tmp))
    return evaluation


def model_calls(records: Path) -> Iterator[dict[str, Any]]:
    """The sampled ids and finish reason of every model call in a generate run's gateway records."""
    import pyarrow.parquet as pq

    if not records.is_file():
        return
    for batch in pq.ParquetFile(records).iter_batches(columns=["completion_ids", "finish_reason"]):
        yield from batch.to_pylist()


def build_evaluation(
    tasks_path: str,
    task_rows: list[dict[str, Any]],
    cfg: EvaluateConfig,
    specs: list[NamedSpec],
    results: list[dict[str, Any]],
    firsts: Mapping[tuple[str, str], Mapping[str, dict[str, Any]]],
) -> dict[str, Any]:
    """evaluation.json: the run's settings, the results (one per policy and mode, the baseline's first), every
    policy against the first on the whole set and per held-out group, and one request answered side by side
    (`firsts`: each result's `first_replies`; in the sampled mode when there is one)."""
    evaluated = {i for r in results for i in r["per_task"]}
    rows = {str(t["instance_id"]): t for t in task_rows if t["instance_id"] in evaluated}
    mode = str(EvalMode.SAMPLED if EvalMode.SAMPLED in cfg.modes else cfg.modes[0])
    policies = dict.fromkeys(r["policy"] for r in results)
    iterations, seed = cfg.bootstrap_iterations, cfg.seed
    return {
        "schema": SCHEMA,
        "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "tasks": {"path": tasks_path, "count": len(task_rows)},
        "k": cfg.k,
        "modes": [str(m) for m in cfg.modes],
        "seed": cfg.seed,
        "specs": [s.to_row() for s in specs],
        "results": results,
        "comparisons": comparisons(results, iterations=iterations, seed=seed),
        "groups": group_figures(results, eval_groups(rows.values()), iterations=iterations, seed=seed),
        "example": side_by_side(
            {p: firsts[p, mode] for p in policies if (p, mode) in firsts},
            lambda i: environment_of(rows[i]).episode(rows[i]).prompt,
            mode,
        ),
    }


def _nothing_to_evaluate(
    taskset: TaskSet, out: str | Path, cfg: EvaluateConfig, specs: list[NamedSpec]
) -> dict[str, Any]:
    """An empty task set (e.g. a held-out split that came out empty) is a result, not a crash at the end of a
    run: the evaluation says so, with no numbers."""
    note = (
        f"no tasks to evaluate in {taskset.root} (an empty held-out split: give more tasks or raise "
        "select's test_fraction); nothing was generated"
    )
    logger.warning("evaluate: %s", note)
    evaluation = {**build_evaluation(str(taskset.root), [], cfg, specs, [], {}), "note": note}
    with atomic_output(out) as tmp:
        tmp.mkdir(parents=True)
        atomic_write_json(tmp / "evaluation.json", evaluation)
        atomic_write_json(tmp / "metrics.json", {})
        atomic_write_text(tmp / "report.md", f"# Evaluation\n\nNothing evaluated: {note}.\n")
    return evaluation


def flat_metrics(evaluation: dict[str, Any]) -> dict[str, float]:
    """Numbers for a KFP Metrics artifact: `<policy>_<mode>_pass_at_1`, its interval, pass@k, the reply figures
    (`_mean_reply_tokens`, `_length_finish_share`, `_distinct_2`), differences."""
    out: dict[str, float] = {}
    for r in evaluation["results"]:
        key = f"{safe_name(r['policy'])}_{r['mode']}"
        for name, value in (
            ("pass_at_1", r["pass_at_1"]),
            ("pass_at_1_low", r["pass_at_1_ci"][0]),
            ("pass_at_1_high", r["pass_at_1_ci"][1]),
            ("graded", r["graded"]),
            ("resolved", r["resolved"]),
            *((f"pass_at_{k}", v["value"]) for k, v in r["pass_at_k"].items() if k != "1"),
            *ReplyFigures.from_row(r).row().items(),
        ):
            if value is not None:
                out[f"{key}_{name}"] = float(value)
    for c in evaluation["comparisons"]:
        key = f"{safe_name(c['b'])}_vs_{safe_name(c['a'])}_{c['mode']}"
        out.update({f"{key}_diff": c["diff"], f"{key}_low": c["low"], f"{key}_high": c["high"]})
        out[f"{key}_significant"] = float(c["significant"])
    return out
