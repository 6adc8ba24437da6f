"""One rollout episode: a task and a harness spec in, a rollout row (and the harness's transcript) out.

Per rollout: the room the harness needs on this task (rollout.fit: the one rule) -> a fresh workspace (the
environment's `WorkspaceHooks`, swe: the task's repository; or, for an answer-graded task, a scratch one with
TASK.md) -> sandbox (per spec) -> gateway session -> harness episode -> what the agent produced in the final
workspace (swe: the diff; what verify grades) -> end the session (failed if the rollout was not ok). A room
without a workspace has no sandbox: no tools (chat), or its environment's host tools (search). A
rollout that crashed, timed out or hit an infrastructure error keeps its row with the reason and is never
trained as reward 0. The generate stage (generate.py) runs many of these through an executor; the RL loop's
SWE workload (harnessrl.rl.workloads) runs one per planned rollout and verifies it.

`plan_row` is the one constructor of a row from task + spec + index; `RolloutContext` carries what every
episode of a run shares (the opened task set and its sandboxes, the gateway), and pickles to Ray workers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import HostTools
from harnessrl.environments.registry import (
    environment_name,
    environment_of,
    resolve_reward,
    workspace_hooks,
)
from harnessrl.environments.scratch import ScratchWorkspace
from harnessrl.harness.base import Endpoint, EpisodeEnd, HarnessResult, TaskPrompt, TurnError
from harnessrl.harness.runtime import NoToolsRuntime, SandboxRuntime
from harnessrl.rollout.fit import Need, Room, fit, harness_needs, host_commands
from harnessrl.rollout.snapshots import SnapshotRuntime
from harnessrl.rollout.specs import NamedSpec, assign, build_harness, sandbox_limits
from harnessrl.sandbox.base import AgentSandbox
from harnessrl.sandbox.host_tools import TOOLS_MOUNT, HostToolSocket
from harnessrl.schema import HarnessName, RolloutStatus, SandboxKind, SpecMix
from harnessrl.taskset import TaskSet

if TYPE_CHECKING:
    from harnessrl.gateway.client import GatewayAdmin
    from harnessrl.harness.runtime import ToolRuntime

logger = logging.getLogger(__name__)


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
    reward_fn: str  # the reward the spec names, resolved for the task's environment
    environment: str = "swe"
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
    model_patch: str = ""  # what the agent produced in its workspace (swe: the framework's diff)
    final_answer: str = ""  # the agent's last reply (what answer-graded environments reward)
    snapshots: list[str] = field(default_factory=list)  # earlier distinct products (Episode.snapshots)
    spec: dict[str, Any] = field(default_factory=dict)


def rollout_id(instance_id: str, k: int) -> str:
    return f"{instance_id}__r{k}"


def rollout_seed(seed: int, rollout_id: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{rollout_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") * 1000  # leaves room for per-call offsets


def spec_for(
    task: Mapping[str, Any],
    specs: list[NamedSpec],
    position: int,
    index: int,
    group_size: int,
    mix: SpecMix = SpecMix.SAMPLE,
) -> NamedSpec:
    """The spec rollout `index` of a task runs under: the run's specs for the task's environment round-robin
    (specs.assign: `position` is the task's index, or the group's under SpecMix.GROUP), or, when the run gives
    none for it, the task's environment's default."""
    env = environment_of(task)
    names = {env.name, environment_name(task)}  # a custom environment: its name or its import path
    fitting = [s for s in specs if not s.environments or names & set(s.environments)]
    if fitting:
        return assign(fitting, position, index, group_size, mix)
    spec = env.episode(task).default_spec
    return NamedSpec(f"{spec.harness}/{spec.sandbox}#0", spec)


def plan_row(
    task: dict[str, Any],
    spec: NamedSpec,
    index: int,
    *,
    group_id: str | None = None,
    rollout: str | None = None,
) -> RolloutRow:
    """The row of rollout `index` of `task` under `spec`, before it runs. `group_id` defaults to the task
    (the generate stage's groups); the RL loop names a group per position of its data order. ValueError
    (rollout.fit.Unfit, naming the task and the spec) when the spec cannot run the task."""
    env = environment_of(task)
    env.check_task(task)
    instance_id = task["instance_id"]
    fit(env, task, spec.spec, spec.name)
    return RolloutRow(
        rollout_id=rollout or rollout_id(instance_id, index),
        group_id=group_id or instance_id,
        instance_id=instance_id,
        repo=str(task.get("repo") or ""),
        sample_index=index,
        spec_name=spec.name,
        harness=spec.spec.harness,
        sandbox=spec.spec.sandbox,
        reward_fn=resolve_reward(env, spec.spec.reward, task),
        environment=env.name,
        spec=spec.to_row(),
    )


@dataclass
class RolloutOutcome:
    row: RolloutRow
    files: dict[str, str] = field(default_factory=dict)  # transcripts/<name> -> text, written by the driver


@dataclass(frozen=True)
class RolloutContext:
    """What every episode of a run shares; plain values and the opened task set, so it pickles to Ray workers
    (on a Ray cluster the task set's path must be the same on every worker, e.g. a shared volume)."""

    sandboxes: Sandboxes
    gateway_url: str
    admin_token: str
    work: str | None  # where workspaces go; None: a private temp dir per rollout (removed afterwards)
    keep_workspace: bool = False


class Sandboxes:
    """Builds the ToolRuntime a spec asks for; per-repo envs are created once per process (the object
    pickles without them: each Ray worker process builds its own)."""

    def __init__(self, taskset: TaskSet, allow_unsandboxed: bool):
        self.taskset = taskset
        self.allow_unsandboxed = allow_unsandboxed
        self._envs: dict[str, Path] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"taskset": self.taskset, "allow_unsandboxed": self.allow_unsandboxed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["taskset"], state["allow_unsandboxed"])

    def env_dir(self, repo: str) -> Path:
        from harnessrl.sandbox.envs import ensure_env

        with self._lock:
            if repo not in self._envs:
                self._envs[repo] = ensure_env(self.taskset, repo)
            return self._envs[repo]

    def runtime(
        self,
        spec: NamedSpec,
        repo: str,
        workspace: Path,
        image: str | None = None,
        env_dir: Callable[[], Path] | None = None,
    ) -> ToolRuntime:
        """`image`: the task's image_name (podman / kubernetes run the rollout in it); `env_dir`: the Python
        environment bubblewrap runs (default: the task repository's, built once per process)."""
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
            env_dir=(env_dir or (lambda: self.env_dir(repo)))() if needs_env(kind) else None,
            image=image,
            limits=Limits(**sandbox_limits(spec.spec)),
            network=spec.spec.network,
        )
        return SandboxRuntime(sandbox, workspace)


def run_rollout(
    ctx: RolloutContext, row: RolloutRow, spec: NamedSpec, task: dict, seed: int
) -> RolloutOutcome:
    """One rollout, start to end; errors are caught and kept in the row. Runs in a thread or a Ray worker."""
    from harnessrl.gateway import GatewayAdmin
    from harnessrl.sandbox.leftovers import make_tempdir
    from harnessrl.sandbox.workspace import safe_name

    t0 = time.monotonic()
    sandboxes = ctx.sandboxes
    taskset = sandboxes.taskset
    admin = GatewayAdmin(ctx.gateway_url, ctx.admin_token)
    own_work = ctx.work is None
    work = make_tempdir("ws") if ctx.work is None else Path(ctx.work)
    workspace = work / safe_name(row.rollout_id)
    files: dict[str, str] = {}
    session = None
    runtime: Any = None
    result: HarnessResult | None = None
    tool_socket: HostToolSocket | None = None
    try:
        import_harnesses({spec.spec.harness})
        env = environment_of(task)
        episode = env.episode(task)
        room = fit(env, task, spec.spec, spec.name)
        prompt = episode.prompt
        if room is Room.SCRATCH_WORKSPACE and isinstance(env, HostTools):  # its tools as shell commands
            tool_socket = HostToolSocket(env.host_runtime(task, taskset), host_commands(env))
            prompt = f"{prompt}\n\n{tool_socket.usage()}"
        hooks = workspace_hooks(env) if room is Room.TASK_WORKSPACE else ScratchWorkspace(prompt)
        if room in (Room.TASK_WORKSPACE, Room.SCRATCH_WORKSPACE):
            hooks.prepare(task, workspace, taskset, spec.spec.sandbox is SandboxKind.BUBBLEWRAP_STRICT)
            runtime = sandboxes.runtime(
                spec, row.repo, workspace, task.get("image_name"), lambda: hooks.sandbox_env(task, taskset)
            )
            if tool_socket is not None:  # fit admits bubblewrap only here
                assert isinstance(runtime, SandboxRuntime) and isinstance(runtime.sandbox, AgentSandbox)
                runtime.sandbox.bind_read_only(tool_socket.dir, TOOLS_MOUNT)
            # a CLI agent runs its own tools, out of our sight: its product is taken when it ends
            if episode.snapshots and harness_needs(spec.spec) is not Need.AGENT_HOST:
                runtime = SnapshotRuntime(
                    runtime, lambda: hooks.produced(task, workspace, taskset), episode.snapshots
                )
        elif room is Room.HOST_TOOLS and isinstance(env, HostTools):  # lookups in read-only data, no code
            runtime = env.host_runtime(task, taskset)
        else:  # nothing to work on, nothing executed: no sandbox either
            runtime = NoToolsRuntime(workspace)
        session = admin.create_session(
            rollout_id=row.rollout_id,
            group_id=row.group_id,
            train_chains=spec.spec.train_chains,
            reply_tokens=spec.spec.limits.get("reply_tokens"),  # validated when the specs were read
            context_tokens=spec.spec.limits.get("context_tokens"),
        )
        row.session_id = session.session_id
        row.setup_s = time.monotonic() - t0
        harness = build_harness(spec.spec, seed=seed)
        result = harness.run(
            TaskPrompt(row.instance_id, prompt),
            Endpoint(session.openai_base_url, session.api_key),
            runtime,
        )
        _record(row, result)
        failure = engine_failure(admin, session.session_id)
        if failure is not None:  # whatever the harness made of the errors it got afterwards
            row.rollout_status, row.finish_reason = RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR
            row.error = failure
        if room is Room.TASK_WORKSPACE:
            t1 = time.monotonic()
            _produced(row, lambda: hooks.produced(task, workspace, taskset))
            if isinstance(runtime, SnapshotRuntime):
                row.snapshots = [s for s in runtime.snapshots if s != row.model_patch]
            row.teardown_s = time.monotonic() - t1
    except Exception as e:  # setup / infrastructure: the rollout is kept with its reason
        row.rollout_status = RolloutStatus.INFRA_ERROR if result is None else RolloutStatus.FAILED
        row.finish_reason = row.finish_reason or EpisodeEnd.SETUP_ERROR
        row.error = f"{type(e).__name__}: {e}"
        files[f"{safe_name(row.rollout_id)}.traceback.txt"] = traceback.format_exc()
        logger.warning("rollout %s: %s", row.rollout_id, row.error)
    finally:
        inner = runtime.inner if isinstance(runtime, SnapshotRuntime) else runtime
        sandbox = inner.sandbox if isinstance(inner, SandboxRuntime) else None
        if sandbox is not None:  # pods / containers go now, not when the object is collected
            try:
                sandbox.close()
            except Exception as e:
                row.error = (row.error + f"; closing the sandbox failed: {e}").strip("; ")
        if tool_socket is not None:
            tool_socket.close()
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


def _record(row: RolloutRow, result: HarnessResult) -> None:
    row.rollout_status, row.finish_reason, row.error = result.status, result.finish_reason, result.error
    row.turns, row.failed_turns, row.tool_calls = result.turns, result.failed_turns, result.tool_calls
    row.harness_errors, row.compactions = dict(result.errors), result.compactions
    row.model_s, row.tool_s, row.harness_wall_s = result.model_s, result.tool_s, result.wall_s
    row.final_answer = result.final_answer


def _produced(row: RolloutRow, produced: Callable[[], str]) -> None:
    """What the agent produced in the final workspace (swe: the diff against the task tip; what verify
    grades)."""
    from harnessrl.sandbox.workspace import PatchTooLarge

    try:
        row.model_patch = produced()
    except PatchTooLarge as e:  # the agent's doing: the row says so, no patch is stored
        if row.rollout_status is RolloutStatus.OK:
            row.rollout_status = RolloutStatus.PATCH_TOO_LARGE
        row.error = (row.error + "; " + str(e)).strip("; ")


def import_harnesses(kinds: set[HarnessName]) -> None:
    """Imports harness client libraries once, in this thread: concurrent first imports of openai / httpx /
    litellm from several rollout threads race into half-initialized modules."""
    import openai  # noqa: F401

    if HarnessName.MINI_SWE_AGENT in kinds:
        from harnessrl.harness.mini_swe_agent import import_minisweagent

        import_minisweagent()
        import minisweagent.agents.default
        import minisweagent.models.litellm_textbased_model  # noqa: F401


def engine_failure(admin: GatewayAdmin, session_id: str) -> str | None:
    """The gateway's reason when it failed the session itself, which it does only when the engine failed
    (unreachable, crashed): the harness then saw a 502 and, on retrying, a closed session."""
    from harnessrl.gateway.enums import SessionStatus

    view = admin.session(session_id)
    if view.get("status") != SessionStatus.FAILED:
        return None
    return str(view.get("reason") or "the gateway failed the session: engine error")
