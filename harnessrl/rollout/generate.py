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
import logging
import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.choices import parse_choice
from harnessrl.harness.base import (
    Endpoint,
    EpisodeEnd,
    HarnessResult,
    RolloutStatus,
    TaskPrompt,
    TurnError,
)
from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, write_jsonl
from harnessrl.progress import track
from harnessrl.rollout.executors import ExecutorName, RolloutJob, RolloutOutcome, make_executor
from harnessrl.rollout.model_server import ModelServer, ModelSource
from harnessrl.rollout.specs import NamedSpec, assign, build_harness, load_specs, sandbox_limits
from harnessrl.schema import HarnessName, RewardName, SandboxKind
from harnessrl.taskset import TaskSet

if TYPE_CHECKING:
    from harnessrl.gateway.client import GatewayAdmin

logger = logging.getLogger(__name__)


class FailedSamples(StrEnum):
    """What happens to the samples of non-ok rollouts in samples.parquet."""

    KEEP = "keep"  # kept with their rollout_status; the trainer masks or drops them
    DROP = "drop"  # left out


# Rollouts in flight at once. The engine batches their turns: on the local engine a decode step for 8 rows
# costs ~1.5x one for 4 (its weights are read once per step), so 8 at once finish ~1.3x sooner than 4 then 4.
DEFAULT_CONCURRENCY = 8


@dataclass
class GenerateConfig:
    group_size: int = 4
    concurrency: int = DEFAULT_CONCURRENCY
    max_tasks: int | None = None
    instance_ids: list[str] | None = None
    failed_samples: FailedSamples = FailedSamples.KEEP
    allow_unsandboxed: bool = False
    keep_workspaces: bool = False
    seed: int = 0
    executor: ExecutorName = ExecutorName.THREADS
    ray_cpus: float = 0.5  # CPUs Ray reserves per rollout (the engine's GPUs stay with the engine service)

    def __post_init__(self) -> None:  # modes may arrive as strings (KFP parameters, Python callers)
        self.failed_samples = parse_choice(FailedSamples, self.failed_samples, "failed_samples")
        self.executor = parse_choice(ExecutorName, self.executor, "executor")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


@dataclass
class RolloutRow:
    rollout_id: str
    group_id: str
    instance_id: str
    repo: str
    sample_index: int
    spec_name: str
    harness: HarnessName
    sandbox: SandboxKind
    reward_fn: RewardName
    rollout_status: RolloutStatus = RolloutStatus.OK
    finish_reason: EpisodeEnd | None = None  # set when the rollout ends
    error: str = ""
    turns: int = 0
    failed_turns: int = 0
    tool_calls: int = 0
    harness_errors: dict[TurnError, int] = field(default_factory=dict)
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

    def runtime(self, spec: NamedSpec, repo: str, workspace: Path, image: str | None = None) -> Any:
        """`image`: the task's image_name (podman / kubernetes run the rollout in it)."""
        from harnessrl.harness.runtime import LocalSubprocessRuntime, SandboxRuntime

        kind = spec.spec.sandbox
        if kind is SandboxKind.LOCAL:
            if not self.allow_unsandboxed:
                raise ValueError(
                    f"spec {spec.name!r}: sandbox 'local' runs agent commands unisolated on this host; "
                    "pass --allow-unsandboxed to permit it (debugging only)"
                )
            return LocalSubprocessRuntime(workspace)
        from harnessrl.sandbox.backends import make_sandbox, needs_env
        from harnessrl.sandbox.base import Limits

        sandbox = make_sandbox(
            kind,
            workspace,
            env_dir=self.env_dir(repo) if needs_env(kind) else None,
            image=image,
            limits=Limits(**sandbox_limits(spec.spec)),
            network=spec.spec.network,
        )
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
    from harnessrl.sandbox.leftovers import make_tempdir
    from harnessrl.sandbox.workspace import MAX_PATCH_BYTES, PatchTooLarge, RepoCache, materialize, safe_name

    t0 = time.monotonic()
    sandboxes = _sandboxes_for(ctx)
    taskset = sandboxes.taskset
    admin = GatewayAdmin(ctx.gateway_url, ctx.admin_token)
    own_work = ctx.work is None
    work = make_tempdir("ws") if ctx.work is None else Path(ctx.work)
    workspace = work / safe_name(row.rollout_id)
    files: dict[str, str] = {}
    session = None
    runtime: Any = None
    result: HarnessResult | None = None
    try:
        _import_harnesses({spec.spec.harness})
        strict = spec.spec.sandbox is SandboxKind.BUBBLEWRAP_STRICT
        materialize(taskset, row.instance_id, workspace, strict=strict)
        runtime = sandboxes.runtime(spec, row.repo, workspace, task.get("image_name"))
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
        engine_failure = _engine_failure(admin, session.session_id)
        if engine_failure is not None:  # whatever the harness made of the errors it got afterwards
            row.rollout_status, row.finish_reason = RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR
            row.error = engine_failure
        t1 = time.monotonic()
        cache = RepoCache.for_repo(taskset, row.repo)
        try:
            patch = cache.diff_worktree(cache.task_tip(row.instance_id), workspace, max_bytes=MAX_PATCH_BYTES)
            row.model_patch = patch.decode("utf-8", errors="replace")
        except PatchTooLarge as e:  # the agent's doing: the row says so, no patch is stored
            if row.rollout_status is RolloutStatus.OK:
                row.rollout_status = RolloutStatus.PATCH_TOO_LARGE
            row.error = (row.error + "; " + str(e)).strip("; ")
        row.teardown_s = time.monotonic() - t1
    except Exception as e:  # setup / infrastructure: the rollout is kept with its reason
        row.rollout_status = RolloutStatus.INFRA_ERROR if result is None else RolloutStatus.FAILED
        row.finish_reason = row.finish_reason or EpisodeEnd.SETUP_ERROR
        row.error = f"{type(e).__name__}: {e}"
        files[f"{safe_name(row.rollout_id)}.traceback.txt"] = traceback.format_exc()
        logger.warning("rollout %s: %s", row.rollout_id, row.error)
    finally:
        sandbox = getattr(runtime, "sandbox", None)
        if sandbox is not None:  # pods / containers go now, not when the object is collected
            try:
                sandbox.close()
            except Exception as e:
                row.error = (row.error + f"; closing the sandbox failed: {e}").strip("; ")
        if session is not None:
            try:
                ok = row.rollout_status is RolloutStatus.OK
                admin.end_session(
                    session.session_id,
                    "ok" if ok else "failed",
                    None if ok else f"{row.rollout_status}: {row.finish_reason} {row.error}"[:500],
                )
            except Exception as e:  # the rollout row already says what happened
                row.error = (row.error + f"; ending the gateway session failed: {e}").strip("; ")
        if result is not None:
            files[f"{safe_name(row.rollout_id)}.json"] = (
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
    model: ModelSource | None = None,
    config: GenerateConfig | None = None,
) -> dict[str, Any]:
    """Generates rollouts into `out` (replaced atomically); returns the metrics dict."""
    from harnessrl.rollout.report import export_and_summarize
    from harnessrl.sandbox.leftovers import temp_prefix

    cfg = config or GenerateConfig()
    taskset = TaskSet.open(tasks)
    specs = specs if isinstance(specs, list) else load_specs(specs)
    plan = plan_rollouts(taskset, specs, cfg)
    if not plan:
        raise ValueError(f"{taskset.tasks_path}: no tasks selected; nothing to generate")
    sandboxes = _Sandboxes(taskset, cfg.allow_unsandboxed)
    for _, spec, task in plan:  # refuse a forbidden sandbox or a missing image before starting anything
        if spec.spec.sandbox is SandboxKind.LOCAL and not cfg.allow_unsandboxed:
            sandboxes.runtime(spec, "", Path("."))
        if spec.spec.sandbox in (SandboxKind.PODMAN, SandboxKind.KUBERNETES) and not task.get("image_name"):
            raise ValueError(
                f"{taskset.tasks_path}: task {task['instance_id']!r} has no image_name, which spec "
                f"{spec.name!r} (sandbox {spec.spec.sandbox}) needs; build the task images "
                "(build_environments) or use sandbox bubblewrap"
            )
    _import_harnesses({spec.spec.harness for _, spec, _ in plan})
    jobs = [RolloutJob(row, spec, task, _rollout_seed(cfg.seed, row.rollout_id)) for row, spec, task in plan]
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
                    str(taskset.root.resolve()),
                    server.admin.base_url,
                    server.admin_token,
                    cfg.allow_unsandboxed,
                    work,
                    cfg.keep_workspaces,
                )
                for outcome in track(executor.run(jobs, run_rollout, ctx), "rollouts", len(jobs)):
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
            if "engine" in gateway_metrics:  # prefix cache hit rate, prefill/decode seconds, FLOP/s
                metrics["engine"] = gateway_metrics["engine"]
            write_jsonl(tmp / "rollouts.jsonl", row_dicts)
            atomic_write_json(tmp / "metrics.json", metrics)
    finally:
        executor.close()
    return metrics


def _import_harnesses(kinds: set[HarnessName]) -> None:
    """Imports harness client libraries once, in this thread: concurrent first imports of openai / httpx /
    litellm from several rollout threads race into half-initialized modules."""
    import openai  # noqa: F401

    if HarnessName.MINI_SWE_AGENT in kinds:
        from harnessrl.harness.mini_swe_agent import import_minisweagent

        import_minisweagent()
        import minisweagent.agents.default
        import minisweagent.models.litellm_textbased_model  # noqa: F401


def _engine_failure(admin: GatewayAdmin, session_id: str) -> str | None:
    """The gateway's reason when it failed the session itself, which it does only when the engine failed
    (unreachable, crashed): the harness then saw a 502 and, on retrying, a closed session."""
    from harnessrl.gateway.enums import SessionStatus

    view = admin.session(session_id)
    if view.get("status") != SessionStatus.FAILED:
        return None
    return str(view.get("reason") or "the gateway failed the session: engine error")
