"""`run_generate`: N rollouts per task, each with its own harness spec, through the gateway, in parallel.

Per rollout: materialize a fresh workspace -> sandbox (per spec) -> gateway session -> harness episode ->
diff of the final workspace (what verify grades) -> end the session (failed if the rollout was not ok).
After all rollouts the gateway's journal is exported: `records.parquet` (every model call, exact token ids)
and `samples.parquet` (training samples, `rollout_status` set from our rollout rows). A rollout that crashed,
timed out or hit an infrastructure error keeps its row with the reason and is never trained as reward 0.

Output directory:
    rollouts.jsonl      one row per rollout (status, finish reason, counters, timings, model_patch)
    records.parquet     gateway records (one row per model call)
    samples.parquet     Sample rows for the trainer
    transcripts/        the harness's own view, for debugging only (never training data)
    metrics.json, report.md, *.png
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.harness.base import (
    STATUS_FAILED,
    STATUS_INFRA,
    STATUS_OK,
    Endpoint,
    HarnessResult,
    TaskPrompt,
)
from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, write_jsonl
from harnessrl.rollout.executors import EXECUTORS, RolloutJob, RolloutOutcome, make_executor
from harnessrl.rollout.model_server import PolicyServer, PolicySource
from harnessrl.rollout.specs import NamedSpec, assign, build_harness, load_specs, sandbox_limits
from harnessrl.taskset import TaskSet

FAILED_POLICIES = ("keep", "drop")  # samples of non-ok rollouts: keep (status set; trainer masks) | drop


@dataclass
class GenerateConfig:
    group_size: int = 4
    concurrency: int = 4
    max_tasks: int | None = None
    instance_ids: list[str] | None = None
    failed_samples: str = "keep"
    allow_unsandboxed: bool = False
    keep_workspaces: bool = False
    seed: int = 0
    executor: str = "threads"  # threads | ray (executors.py)
    ray_cpus: float = 0.5  # CPUs Ray reserves per rollout (the engine's GPUs stay with the engine service)


@dataclass
class RolloutRow:
    rollout_id: str
    group_id: str
    instance_id: str
    repo: str
    sample_index: int
    spec_name: str
    harness: str
    sandbox: str
    reward_fn: str
    rollout_status: str = STATUS_OK
    finish_reason: str = ""
    error: str = ""
    turns: int = 0
    failed_turns: int = 0
    tool_calls: int = 0
    harness_errors: dict[str, int] = field(default_factory=dict)
    compactions: int = 0
    session_id: str = ""
    model_s: float = 0.0
    tool_s: float = 0.0
    harness_wall_s: float = 0.0
    setup_s: float = 0.0  # workspace + sandbox + session
    teardown_s: float = 0.0  # diff + session end
    wall_s: float = 0.0
    model_patch: str = ""
    spec: dict[str, Any] = field(default_factory=dict)


def _rollout_id(instance_id: str, k: int) -> str:
    return f"{instance_id}__r{k}"


def _rollout_seed(seed: int, rollout_id: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{rollout_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") * 1000  # leaves room for per-call offsets


class _Sandboxes:
    """Builds the ToolRuntime a spec asks for; per-repo envs are created once."""

    def __init__(self, taskset: TaskSet, allow_unsandboxed: bool):
        self.taskset = taskset
        self.allow_unsandboxed = allow_unsandboxed
        self._envs: dict[str, Path] = {}
        self._lock = threading.Lock()

    def env_dir(self, repo: str) -> Path:
        from harnessrl.sandbox.envs import ensure_env

        with self._lock:
            if repo not in self._envs:
                self._envs[repo] = ensure_env(self.taskset, repo)
            return self._envs[repo]

    def runtime(self, spec: NamedSpec, repo: str, workspace: Path) -> Any:
        from harnessrl.harness.runtime import LocalSubprocessRuntime, SandboxRuntime

        kind = spec.spec.sandbox
        if kind == "local":
            if not self.allow_unsandboxed:
                raise ValueError(
                    f"spec {spec.name!r}: sandbox 'local' runs agent commands unisolated on this host; "
                    "pass --allow-unsandboxed to permit it (debugging only)"
                )
            return LocalSubprocessRuntime(workspace)
        from harnessrl.sandbox.base import Limits
        from harnessrl.sandbox.bwrap import BubblewrapSandbox

        sandbox = BubblewrapSandbox(workspace, self.env_dir(repo), limits=Limits(**sandbox_limits(spec.spec)))
        return SandboxRuntime(sandbox, workspace)


@dataclass(frozen=True)
class RolloutContext:
    """What a rollout worker needs besides its job; plain values, so it pickles to Ray workers."""

    tasks: str  # task-set directory (on a Ray cluster: the same path on every worker, e.g. a shared volume)
    gateway_url: str
    admin_token: str
    allow_unsandboxed: bool
    work: str | None  # where workspaces go; None: a private temp dir per rollout (removed afterwards)
    keep_workspace: bool


_SANDBOXES: dict[tuple[str, bool], _Sandboxes] = {}
_SANDBOXES_LOCK = threading.Lock()


def _sandboxes_for(ctx: RolloutContext) -> _Sandboxes:
    """One `_Sandboxes` per process (threads share it; each Ray worker process builds its own)."""
    key = (ctx.tasks, ctx.allow_unsandboxed)
    with _SANDBOXES_LOCK:
        if key not in _SANDBOXES:
            _SANDBOXES[key] = _Sandboxes(TaskSet.open(ctx.tasks), ctx.allow_unsandboxed)
        return _SANDBOXES[key]


def run_rollout(
    ctx: RolloutContext, row: RolloutRow, spec: NamedSpec, task: dict, seed: int
) -> RolloutOutcome:
    """One rollout, start to end; errors are caught and kept in the row. Runs in a thread or a Ray worker."""
    from harnessrl.gateway import GatewayAdmin
    from harnessrl.sandbox.workspace import RepoCache, materialize

    t0 = time.monotonic()
    sandboxes = _sandboxes_for(ctx)
    taskset = sandboxes.taskset
    admin = GatewayAdmin(ctx.gateway_url, ctx.admin_token)
    own_work = ctx.work is None
    work = Path(tempfile.mkdtemp(prefix="harnessrl-ws-")) if own_work else Path(ctx.work)
    workspace = work / row.rollout_id
    files: dict[str, str] = {}
    session = None
    result: HarnessResult | None = None
    try:
        _import_harnesses({spec.spec.harness})
        materialize(taskset, row.instance_id, workspace, strict=spec.spec.sandbox == "bubblewrap-strict")
        runtime = sandboxes.runtime(spec, row.repo, workspace)
        session = admin.create_session(rollout_id=row.rollout_id, group_id=row.group_id)
        row.session_id = session.session_id
        row.setup_s = time.monotonic() - t0
        harness = build_harness(spec.spec, seed=seed)
        result = harness.run(
            TaskPrompt(row.instance_id, task["problem_statement"]),
            Endpoint(session.openai_base_url, session.api_key),
            runtime,
        )
        row.rollout_status, row.finish_reason, row.error = result.status, result.finish_reason, result.error
        row.turns, row.failed_turns, row.tool_calls = result.turns, result.failed_turns, result.tool_calls
        row.harness_errors, row.compactions = dict(result.errors), result.compactions
        row.model_s, row.tool_s, row.harness_wall_s = result.model_s, result.tool_s, result.wall_s
        t1 = time.monotonic()
        cache = RepoCache.for_repo(taskset, row.repo)
        row.model_patch = cache.diff_worktree(cache.task_tip(row.instance_id), workspace).decode(
            "utf-8", errors="replace"
        )
        row.teardown_s = time.monotonic() - t1
    except Exception as e:  # setup / infrastructure: the rollout is kept with its reason
        row.rollout_status = STATUS_INFRA if result is None else STATUS_FAILED
        row.finish_reason = row.finish_reason or "setup_error"
        row.error = f"{type(e).__name__}: {e}"
        files[f"{row.rollout_id}.traceback.txt"] = traceback.format_exc()
    finally:
        if session is not None:
            try:
                ok = row.rollout_status == STATUS_OK
                admin.end_session(
                    session.session_id,
                    "ok" if ok else "failed",
                    None if ok else f"{row.rollout_status}: {row.finish_reason} {row.error}"[:500],
                )
            except Exception as e:  # the rollout row already says what happened
                row.error = (row.error + f"; ending the gateway session failed: {e}").strip("; ")
        if result is not None:
            files[f"{row.rollout_id}.json"] = (
                json.dumps(result.transcript, indent=2, sort_keys=True, default=str) + "\n"
            )
        if not ctx.keep_workspace:
            shutil.rmtree(workspace if not own_work else work, ignore_errors=True)
    row.wall_s = time.monotonic() - t0
    return RolloutOutcome(row, files)


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
            spec = assign(specs, i, k, cfg.group_size)
            row = RolloutRow(
                _rollout_id(task["instance_id"], k),
                task["instance_id"],
                task["instance_id"],
                task["repo"],
                k,
                spec.name,
                spec.spec.harness,
                spec.spec.sandbox,
                spec.spec.reward,
                spec=spec.to_row(),
            )
            plan.append((row, spec, task))
    return plan


def run_generate(
    tasks: str | Path,
    out: str | Path,
    specs: list[NamedSpec] | str | Path | None = None,
    policy: PolicySource | None = None,
    config: GenerateConfig | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Generates rollouts into `out` (replaced atomically); returns the metrics dict."""
    from harnessrl.rollout.report import export_and_summarize

    cfg = config or GenerateConfig()
    if cfg.failed_samples not in FAILED_POLICIES:
        raise ValueError(f"failed_samples must be one of {FAILED_POLICIES}, got {cfg.failed_samples!r}")
    if cfg.concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {cfg.concurrency}")
    if cfg.executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {cfg.executor!r}")
    taskset = TaskSet.open(tasks)
    specs = specs if isinstance(specs, list) else load_specs(specs)
    plan = plan_rollouts(taskset, specs, cfg)
    if not plan:
        raise ValueError(f"{taskset.tasks_path}: no tasks selected; nothing to generate")
    sandboxes = _Sandboxes(taskset, cfg.allow_unsandboxed)
    for _, spec, _ in plan:  # refuse a forbidden sandbox before starting anything
        if spec.spec.sandbox == "local" and not cfg.allow_unsandboxed:
            sandboxes.runtime(spec, "", Path("."))
    _import_harnesses({spec.spec.harness for _, spec, _ in plan})
    jobs = [RolloutJob(row, spec, task, _rollout_seed(cfg.seed, row.rollout_id)) for row, spec, task in plan]
    executor = make_executor(cfg.executor, cfg.concurrency, cfg.ray_cpus)
    started = time.monotonic()
    try:
        with atomic_output(out) as tmp, tempfile.TemporaryDirectory(prefix="harnessrl-ws-") as work_dir:
            transcripts = tmp / "transcripts"
            transcripts.mkdir(parents=True)
            if cfg.keep_workspaces:
                work: str | None = str(tmp / "workspaces")
                Path(work).mkdir(parents=True)
            else:  # threads share one temp dir; Ray workers (maybe on other machines) make their own
                work = work_dir if executor.name == "threads" else None
            rows: list[RolloutRow] = []
            with PolicyServer(
                policy or PolicySource(), tmp / "journal", host=executor.gateway_host()
            ) as server:
                ctx = RolloutContext(
                    str(taskset.root.resolve()),
                    server.admin.base_url,
                    server.admin_token,
                    cfg.allow_unsandboxed,
                    work,
                    cfg.keep_workspaces,
                )
                for outcome in _progress(executor.run(jobs, run_rollout, ctx), len(jobs), progress):
                    for name, text in outcome.files.items():
                        atomic_write_text(transcripts / name, text)
                    rows.append(outcome.row)
                gateway_metrics = server.admin.metrics()
                server.admin.export(str(tmp / "gateway_export"))
            rows.sort(key=lambda r: (r.group_id, r.sample_index))
            wall = time.monotonic() - started
            row_dicts = [asdict(r) for r in rows]
            metrics = export_and_summarize(tmp, row_dicts, gateway_metrics, wall, cfg)  # adds gateway stats
            metrics["executor"] = executor.name
            write_jsonl(tmp / "rollouts.jsonl", row_dicts)
            atomic_write_json(tmp / "metrics.json", metrics)
    finally:
        executor.close()
    return metrics


def _import_harnesses(kinds: set[str]) -> None:
    """Imports harness client libraries once, in this thread: concurrent first imports of openai / httpx /
    litellm from several rollout threads race into half-initialized modules."""
    import openai  # noqa: F401

    if "mini-swe-agent" in kinds:
        from harnessrl.harness.mini_swe_agent import _import_minisweagent

        _import_minisweagent()
        import litellm  # noqa: F401
        import minisweagent.agents.default  # noqa: F401
        import minisweagent.models.litellm_textbased_model  # noqa: F401


def _progress(iterable, total: int, enabled: bool):
    if not enabled:
        yield from iterable
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("rollouts", total=total)
        for item in iterable:
            yield item
            bar.advance(task)
