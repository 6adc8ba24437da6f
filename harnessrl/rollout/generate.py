"""`run_generate`: N rollouts per task, each with its own harness spec, through the gateway, in parallel.

Each rollout is one episode (episode.py: workspace -> sandbox -> gateway session -> harness -> diff), run by an
executor (threads or Ray, executors.py). After all rollouts the gateway's journal is exported:
`records.parquet` (every model call, exact token ids) and `samples.parquet` (training samples,
`rollout_status` set from our rollout rows). A rollout that crashed, timed out or hit an infrastructure
error keeps its row with the reason and is never trained as reward 0.

Output directory:
    rollouts.jsonl      one row per rollout (status, finish reason, counters, timings, model_patch)
    records.parquet     gateway records (one row per model call)
    samples.parquet     Sample rows for the trainer
    transcripts/        the harness's own view, for debugging only (never training data)
    metrics.json, report.md, *.png
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, write_jsonl
from harnessrl.progress import track
from harnessrl.rollout.config import GenerateConfig
from harnessrl.rollout.episode import (
    RolloutContext,
    RolloutRow,
    Sandboxes,
    import_harnesses,
    plan_row,
    rollout_seed,
    run_rollout,
    spec_for,
)
from harnessrl.rollout.executors import ExecutorName, RolloutJob, make_executor
from harnessrl.rollout.model_server import ModelServer, ModelSource
from harnessrl.rollout.report import export_and_summarize
from harnessrl.rollout.specs import NamedSpec, load_specs
from harnessrl.schema import SandboxKind
from harnessrl.taskset import TaskSet

logger = logging.getLogger(__name__)


def plan_rollouts(
    taskset: TaskSet, specs: list[NamedSpec], cfg: GenerateConfig
) -> list[tuple[RolloutRow, NamedSpec, dict]]:
    tasks = taskset.rows()
    if cfg.instance_ids:
        wanted = set(cfg.instance_ids)
        missing = wanted - {t["instance_id"] for t in tasks}
        if missing:
            raise ValueError(f"{taskset.tasks_path}: no task(s) {sorted(missing)[:5]}")
        tasks = [t for t in tasks if t["instance_id"] in wanted]
    if cfg.max_tasks is not None:
        tasks = tasks[: cfg.max_tasks]
    if cfg.group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {cfg.group_size}")
    plan = []
    for i, task in enumerate(tasks):
        for k in range(cfg.group_size):
            spec = spec_for(task, specs, i, k, cfg.group_size)
            if cfg.spec_options:
                spec = NamedSpec(
                    spec.name, replace(spec.spec, options={**spec.spec.options, **cfg.spec_options})
                )
            plan.append((plan_row(task, spec, k), spec, task))
    return plan


def run_generate(
    tasks: str | Path,
    out: str | Path,
    specs: list[NamedSpec] | str | Path | None = None,
    model: ModelSource | None = None,
    config: GenerateConfig | None = None,
) -> dict[str, Any]:
    """Generates rollouts into `out` (replaced atomically); returns the metrics dict."""
    from harnessrl.sandbox.leftovers import temp_prefix

    cfg = config or GenerateConfig()
    taskset = TaskSet.open(tasks)
    specs = specs if isinstance(specs, list) else load_specs(specs)
    plan = plan_rollouts(taskset, specs, cfg)
    if not plan:
        raise ValueError(f"{taskset.tasks_path}: no tasks selected; nothing to generate")
    sandboxes = Sandboxes(taskset, cfg.allow_unsandboxed)
    for _, spec, _ in plan:  # refuse a forbidden sandbox before starting anything (plan_row refused the rest)
        if spec.spec.sandbox is SandboxKind.LOCAL and not cfg.allow_unsandboxed:
            sandboxes.runtime(spec, "", Path("."))
    import_harnesses({spec.spec.harness for _, spec, _ in plan})
    jobs = [RolloutJob(row, spec, task, rollout_seed(cfg.seed, row.rollout_id)) for row, spec, task in plan]
    executor = make_executor(cfg.executor, cfg.concurrency, cfg.ray_cpus)
    started = time.monotonic()
    try:
        with atomic_output(out) as tmp, tempfile.TemporaryDirectory(prefix=temp_prefix("ws")) as work_dir:
            transcripts = tmp / "transcripts"
            transcripts.mkdir(parents=True)
            if cfg.keep_workspaces:
                work: str | None = str(tmp / "workspaces")
                Path(work).mkdir(parents=True)
            else:  # threads share one temp dir; Ray workers (maybe on other machines) make their own
                work = work_dir if executor.name is ExecutorName.THREADS else None
            rows: list[RolloutRow] = []
            with ModelServer(model or ModelSource(), tmp / "journal", host=executor.gateway_host()) as server:
                ctx = RolloutContext(
                    sandboxes, server.admin.base_url, server.admin_token, work, cfg.keep_workspaces
                )
                for outcome in track(executor.run(jobs, run_rollout, ctx), "rollouts", len(jobs)):
                    for name, text in outcome.files.items():
                        atomic_write_text(transcripts / name, text)
                    rows.append(outcome.row)
                gateway_metrics = server.admin.metrics()
                server.admin.export(str(tmp / "gateway_export"))
                decode = server.gateway.renderer.decode  # the policy's tokenizer: the report's trajectories
            rows.sort(key=lambda r: (r.group_id, r.sample_index))
            wall = time.monotonic() - started
            row_dicts = [asdict(r) for r in rows]
            metrics = export_and_summarize(tmp, row_dicts, gateway_metrics, wall, cfg.failed_samples, decode)
            metrics["executor"] = executor.name
            if "engine" in gateway_metrics:  # prefix cache hit rate, prefill/decode seconds, FLOP/s
                metrics["engine"] = gateway_metrics["engine"]
            write_jsonl(tmp / "rollouts.jsonl", row_dicts)
            atomic_write_json(tmp / "metrics.json", metrics)
    finally:
        executor.close()
    return metrics
