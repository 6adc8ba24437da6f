"""One rule for which harness runs on which task, and in what room: every stage asks here.

Each harness declares what it needs (`harness_needs`), each environment offers what its episode says: a
workspace it grades (swe, kernel: the agent's product), or an answer it grades (instruction, search,
procedural), plus its host tools (search: `HostTools`). `fit` pairs them and names the room the episode runs
in, or refuses in one line saying what to run instead:

    needs \\ offers        workspace-graded           answer-graded               answer-graded + host tools
    nothing (chat,         refused: nothing can       NONE                        NONE
      react answer/submit)   change the workspace
    host tools (react      refused                    refused                     HOST_TOOLS
      search/read)
    workspace (react       TASK_WORKSPACE             SCRATCH_WORKSPACE           SCRATCH_WORKSPACE + its
      bash/edit, mini-swe)                                                          tools as commands
    agent host (claude-    TASK_WORKSPACE             SCRATCH_WORKSPACE           SCRATCH_WORKSPACE + its
      code, codex)                                                                  tools as commands

React on an answer-graded task needs its `answer` tool (its final answer); without it, refused. A scratch
workspace holds the task as `TASK.md` and nothing else; the environment grades the harness's final answer
(environments.scratch). Host tools reach an agent in a sandbox as commands over a socket of the rollout's
own (sandbox.host_tools; bubblewrap only, for now). A container sandbox (podman, kubernetes) needs the task's
`image_name`. `check_spec` holds what a spec alone decides (a harness that runs whole inside
its sandbox needs a backend that can host it), used when specs are parsed; `fit` is used when rows are
planned (generate, the RL loop, evaluate: rollout.episode.plan_row), for a whole run before its first
rollout (`check_run`), and to build the episode's runtime (rollout.episode.run_rollout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from harnessrl.environments.base import Environment, Episode, HostTools
from harnessrl.harness.tools import Tool, toolset
from harnessrl.schema import HarnessName, HarnessSpec, SandboxKind

if TYPE_CHECKING:
    from harnessrl.rollout.specs import NamedSpec


class Need(StrEnum):
    NOTHING = "nothing"  # one reply, or tools that touch nothing (answer, submit)
    HOST_TOOLS = "host_tools"  # the environment's tools on its read-only data (search, read)
    WORKSPACE = "workspace"  # tool calls that act on files, through our runtime
    AGENT_HOST = "agent_host"  # the harness runs whole inside the sandbox, its own tools with it


class Room(StrEnum):
    NONE = "none"  # no sandbox: nothing is executed
    HOST_TOOLS = "host_tools"  # the environment's host runtime (no sandbox: lookups, never code)
    TASK_WORKSPACE = "task_workspace"  # the environment's workspace in the spec's sandbox
    SCRATCH_WORKSPACE = "scratch_workspace"  # TASK.md only, in the spec's sandbox; the final answer is graded


WORKSPACE_TOOLS = frozenset({"bash", "edit", "str_replace_editor"})
CORPUS_TOOLS = frozenset({"search", "read"})
ENDING_TOOLS = frozenset({"answer", "submit"})  # an agent with its own loop ends with its final message
CONTAINERS = frozenset({SandboxKind.PODMAN, SandboxKind.KUBERNETES})  # they run the task's image
BUBBLEWRAP = frozenset({SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT})
# harnesses that run inside the rollout's sandbox -> the backends that can host a whole agent
# (sandbox.base.AgentSandbox)
AGENT_HOSTS = frozenset(
    {SandboxKind.BUBBLEWRAP, SandboxKind.BUBBLEWRAP_STRICT, SandboxKind.PODMAN, SandboxKind.KUBERNETES}
)
_WORKSPACE_HARNESSES = "react with bash/edit, mini-swe-agent, claude-code or codex"


class Unfit(ValueError):
    """A harness spec that cannot run on a task: one line, with what to run instead."""


def harness_needs(spec: HarnessSpec) -> Need:
    if spec.harness in (HarnessName.CLAUDE_CODE, HarnessName.CODEX):
        return Need.AGENT_HOST
    if spec.harness is HarnessName.MINI_SWE_AGENT:
        return Need.WORKSPACE
    if spec.harness is HarnessName.CHAT:
        return Need.NOTHING
    tools = set(spec.tools)
    if tools & WORKSPACE_TOOLS:
        return Need.WORKSPACE
    return Need.HOST_TOOLS if tools & CORPUS_TOOLS else Need.NOTHING


def check_spec(spec: HarnessSpec, where: str) -> None:
    """What a spec decides alone: its harness's needs against its sandbox (Unfit naming `where`)."""
    need = harness_needs(spec)
    if need is Need.AGENT_HOST and spec.sandbox not in AGENT_HOSTS:
        raise Unfit(
            f"{where}.sandbox: harness {spec.harness} runs inside the sandbox, which it supports on "
            f"{sorted(AGENT_HOSTS)} only (not {spec.sandbox})"
        )
    corpus, workspace = set(spec.tools) & CORPUS_TOOLS, set(spec.tools) & WORKSPACE_TOOLS
    if spec.harness is HarnessName.REACT and corpus and workspace:
        raise Unfit(
            f"{where}.tools: {sorted(corpus)} run on the host's corpus and {sorted(workspace)} in a sandbox; "
            "a react episode has one or the other (a CLI agent in a search task gets both: the corpus as a "
            "command in its sandbox)"
        )


def fit(env: Environment, task: Mapping[str, Any], spec: HarnessSpec, spec_name: str) -> Room:
    """The room spec `spec_name` runs `task` of `env` in; Unfit in one line when it cannot."""
    what = f"task {task.get('instance_id')!r} ({env.name}), spec {spec_name!r} (harness {spec.harness})"
    room = _room(env, env.episode(task), spec, what)
    needs_image = room in (Room.TASK_WORKSPACE, Room.SCRATCH_WORKSPACE) and spec.sandbox in CONTAINERS
    if needs_image and not task.get("image_name"):
        raise Unfit(
            f"{what}: sandbox {spec.sandbox} runs the task's image_name, and it has none: give the task one "
            "(the build-environments stage) or use sandbox bubblewrap"
        )
    if room is Room.SCRATCH_WORKSPACE and isinstance(env, HostTools) and spec.sandbox not in BUBBLEWRAP:
        raise Unfit(
            f"{what}: the task's tools reach an agent's sandbox as commands over a socket bound in from this "
            f"host, which bubblewrap takes and {spec.sandbox} does not yet: use sandbox bubblewrap, or react "
            "with the task's tools"
        )
    return room


def _room(env: Environment, episode: Episode, spec: HarnessSpec, what: str) -> Room:
    need = harness_needs(spec)
    host_tools = set(env.host_tools) if isinstance(env, HostTools) else set()
    foreign = sorted(set(spec.tools) & CORPUS_TOOLS - host_tools) if spec.harness is HarnessName.REACT else []
    if foreign:
        raise Unfit(
            f"{what}: tools {foreign} are the search environment's; this task has none: drop them"
            + (f" (its own: {', '.join(sorted(host_tools))})" if host_tools else "")
        )
    if episode.workspace:
        if need in (Need.NOTHING, Need.HOST_TOOLS):
            raise Unfit(
                f"{what}: the task is graded on what the agent leaves in its workspace, and this harness "
                f"cannot change files (tools {sorted(spec.tools)}): use {_WORKSPACE_HARNESSES}"
                if spec.harness is HarnessName.REACT
                else f"{what}: the task is graded on what the agent leaves in its workspace, and chat only "
                f"replies: use {_WORKSPACE_HARNESSES}"
            )
        return Room.TASK_WORKSPACE
    if spec.harness is HarnessName.REACT and "answer" not in spec.tools:
        raise Unfit(
            f"{what}: the task is graded on the agent's final answer, which react gives with its `answer` "
            f"tool: add 'answer' to tools {sorted(spec.tools)}"
        )
    if need is Need.NOTHING:
        return Room.NONE
    if need is Need.HOST_TOOLS:
        return Room.HOST_TOOLS
    return Room.SCRATCH_WORKSPACE


def host_commands(env: HostTools) -> dict[str, Tool]:
    """The environment's host tools an agent with its own tool loop runs as commands (sandbox.host_tools)."""
    return toolset([t for t in env.host_tools if t not in ENDING_TOOLS])


def check_run(
    tasks: Iterable[Mapping[str, Any]],
    pick: Callable[[Mapping[str, Any], int, int], NamedSpec],
    group_size: int,
) -> None:
    """Every (task, spec) pairing a run will make, checked before its first rollout (`pick(task, task_index,
    sample_index)`: the spec a rollout runs under): Unfit for the first that cannot run, so a run never stops
    at step 7 on a pairing it could have refused at once."""
    from harnessrl.environments.registry import environment_of

    for i, task in enumerate(tasks):
        env = environment_of(task)
        env.check_task(task)
        seen: set[str] = set()
        for k in range(group_size):
            named = pick(task, i, k)
            if named.name not in seen:
                seen.add(named.name)
                fit(env, task, named.spec, named.name)
