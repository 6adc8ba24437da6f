"""One episode of a production CLI agent (Claude Code, Codex) as a training harness: the flow they share.

`CliHarness.run` checks that the runtime is the rollout's sandbox and that it can host a whole agent
(`AgentSandbox`: bubblewrap, podman, a Kubernetes pod), requires the pinned CLI
(`cli_agents`, installed by `make cli-agents`), binds its install prefix read-only at its mount and the task at
`PROMPT_MOUNT` (the CLI reads it on stdin), connects the gateway's socket, runs the CLI once, bounded by the wall
clock and the sandbox's limits, and reads how it ended. What differs per CLI is its `CliConfig`: its name and
mount, its command line and environment (how it reaches the gateway: the socket itself, or a loopback bridge
in front of it), and how its output becomes turns, tool calls and a finish reason (docs/harness.md).
"""

from __future__ import annotations

import json
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Self

from harnessrl.harness.base import (
    Endpoint,
    EpisodeEnd,
    HarnessResult,
    TaskPrompt,
    model_error_status,
    spec_kwargs,
)
from harnessrl.harness.cli_agents import CliNotInstalled, require
from harnessrl.harness.runtime import SandboxRuntime, ToolRuntime
from harnessrl.sandbox.base import AgentSandbox, Limits, Outcome, RunResult
from harnessrl.schema import RolloutStatus

PROMPT_MOUNT = "/run/harnessrl/task.md"
CLI_ADDRESS_SPACE_MB = 8192
SOCKET_WAIT_S = 30
TRANSCRIPT_EVENTS = 2000  # events kept in the transcript (the CLI's whole output is capped by the sandbox)
Ending = tuple[RolloutStatus, EpisodeEnd, str]


@dataclass
class CliConfig(ABC):
    """Per-sample settings every CLI has (HarnessSpec `limits.turns`, `limits.wall_s` and `options`), and what
    the episode needs to know of its CLI."""

    LIMITS: ClassVar[dict[str, str]] = {
        "turns": "max_turns",
        "wall_s": "wall_s",
        "reply_tokens": "reply_tokens",
    }
    tool: ClassVar[str]  # its name in cli_agents
    mount: ClassVar[str]  # where its install prefix is bound
    own_env: ClassVar[tuple[str, ...]]  # variables the harness sets: an option may not
    binds: ClassVar[dict[str, Path]] = {}  # more read-only binds its command needs: inside -> host
    setup: ClassVar[str] = ""  # shell run in the sandbox before the CLI starts

    version: str
    max_turns: int = 20
    wall_s: float = 600.0
    reply_tokens: int | None = None  # limits.reply_tokens: the gateway cuts each call there
    env: dict[str, str] = field(default_factory=dict)  # more variables for the CLI (and its tools)
    extra_args: list[str] = field(default_factory=list)  # more arguments for the CLI

    def __post_init__(self) -> None:
        if int(self.max_turns) < 1:
            raise ValueError(f"{self.tool} max_turns must be >= 1, got {self.max_turns!r}")
        if float(self.wall_s) <= 0:
            raise ValueError(f"{self.tool} wall_s must be > 0, got {self.wall_s!r}")
        for f in fields(self):  # the list options: lists of strings (or None, where that is the default)
            value = getattr(self, f.name)
            if "list[str]" in str(f.type) and not (value is None and f.default is None):
                if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                    raise ValueError(
                        f"{self.tool} option {f.name}: expected a list of strings, got {value!r}"
                    )
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError(f"{self.tool} option env: expected string -> string, got {self.env!r}")
        owned = sorted(set(self.env) & set(self.own_env))
        if owned:
            raise ValueError(f"{self.tool} option env: {owned} are set by the harness")

    @classmethod
    def from_spec(cls, limits: dict[str, Any], options: dict[str, Any]) -> Self:
        return cls(**spec_kwargs(cls, limits, options, cls.tool))

    @abstractmethod
    def command(self, executable: str, endpoint: Endpoint, socket: str) -> tuple[list[str], dict[str, str]]:
        """Its command line inside the sandbox (`executable` is the CLI's there; the task comes on stdin) and
        its environment, pointed at the gateway session `endpoint` through `socket`, the gateway's socket inside
        the sandbox."""

    @abstractmethod
    def read(self, res: HarnessResult, run: RunResult, events: list[dict[str, Any]]) -> Ending:
        """Counts the episode's turns, tool calls, ... into `res` from the run's output (`events`: its JSON
        lines) and says how it ended."""


class CliHarness:
    """Runs the CLI `config` describes once, in the rollout's sandbox."""

    def __init__(self, config: CliConfig) -> None:
        self.config = config

    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime) -> HarnessResult:
        from harnessrl.sandbox.leftovers import make_tempdir

        cfg = self.config
        res = HarnessResult()
        start = time.monotonic()
        if not (isinstance(runtime, SandboxRuntime) and isinstance(runtime.sandbox, AgentSandbox)):
            kind = type(runtime.sandbox if isinstance(runtime, SandboxRuntime) else runtime).__name__
            return _end(
                res,
                RolloutStatus.INFRA_ERROR,
                EpisodeEnd.SETUP_ERROR,
                f"{cfg.tool} runs inside the rollout's sandbox, which must be able to host a whole agent "
                f"(bubblewrap, podman, kubernetes); {kind} cannot: name one of them as its spec's `sandbox`",
                start,
            )
        sandbox = runtime.sandbox
        try:
            cli = require(cfg.tool, cfg.version)
        except CliNotInstalled as e:
            return _end(res, RolloutStatus.INFRA_ERROR, EpisodeEnd.SETUP_ERROR, str(e), start)
        prompt_dir = make_tempdir("prompt")
        try:
            prompt = prompt_dir / "task.md"
            prompt.write_text(task.problem_statement)
            prompt.chmod(0o644)
            for inside, host in {cfg.mount: cli.prefix, **cfg.binds, PROMPT_MOUNT: prompt}.items():
                sandbox.bind_read_only(host, inside)
            socket = sandbox.connect_gateway(endpoint.base_url)
            argv, env = cfg.command(f"{cfg.mount}/{cli.relative_executable()}", endpoint, socket)
            # a pod's forwarder may still be starting: wait for its socket (at once elsewhere)
            wait = f"i=0; while [ ! -S {socket} ] && [ $i -lt {SOCKET_WAIT_S * 10} ]; do sleep 0.1; i=$((i+1)); done; "
            script = f'{wait}{cfg.setup}exec "$0" "$@" < {PROMPT_MOUNT}'
            remaining = max(cfg.wall_s - (time.monotonic() - start), 1.0)
            limits = cli_limits(runtime.limits or sandbox.default_limits)
            run = sandbox.run(["/bin/sh", "-c", script, *argv], timeout=remaining, limits=limits, env=env)
        except Exception as e:  # the sandbox machinery broke (binds, forwarder), not the agent
            return _end(
                res, RolloutStatus.INFRA_ERROR, EpisodeEnd.SANDBOX_ERROR, f"{type(e).__name__}: {e}", start
            )
        finally:
            shutil.rmtree(prompt_dir, ignore_errors=True)
        events = parse_events(run.stdout)
        res.transcript = events[:TRANSCRIPT_EVENTS]
        return _end(res, *cfg.read(res, run, events), start)


def cli_limits(limits: Limits) -> Limits:
    """Where memory is limited by RLIMIT_AS (no cgroup on this host), a CLI needs more address space than it
    uses (Claude Code's Bun crashes at start under 2 GB; measured: 3 GB runs). Then the limit is at least
    CLI_ADDRESS_SPACE_MB of address space per process; with a cgroup it stays the spec's."""
    from harnessrl.sandbox import cgroups

    if cgroups.factory().available() or limits.memory_mb >= CLI_ADDRESS_SPACE_MB:
        return limits
    return replace(limits, memory_mb=CLI_ADDRESS_SPACE_MB)


def parse_events(stdout: str) -> list[dict[str, Any]]:
    """The CLI's JSON events, one a line; lines that are not JSON objects (a cut at the sandbox's output cap,
    noise) are skipped."""
    events = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def sandbox_ending(outcome: str, detail: str, tail: str) -> Ending | None:
    """How the sandbox ended the run, where it did (it killed the run or could not start it): these come before
    anything the CLI said. `tail` is the last line of the CLI's stderr."""
    if outcome == Outcome.SANDBOX_ERROR:
        return RolloutStatus.INFRA_ERROR, EpisodeEnd.SANDBOX_ERROR, f"sandbox error: {detail or tail}"
    if outcome == Outcome.TIMEOUT:
        return (
            RolloutStatus.TIMEOUT,
            EpisodeEnd.WALL_TIME,
            f"the CLI was killed at the wall-clock limit ({detail})",
        )
    if outcome == Outcome.RESOURCE_LIMIT:
        return RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR, f"the CLI's run hit a sandbox limit: {detail}"
    return None


def unfinished(exit_code: int | None, tail: str, without: str) -> Ending:
    """The CLI stopped without saying how its episode ended (`without`: what it never printed)."""
    how = f"exited {exit_code}" if exit_code else "ended"
    return (
        RolloutStatus.FAILED,
        EpisodeEnd.HARNESS_ERROR,
        f"the CLI {how} without {without}" + (f": {tail}" if tail else ""),
    )


def model_error(http_status: int | None, text: str) -> Ending:
    """A model call that failed after the CLI's retries: a route the gateway does not serve is infrastructure
    (the CLI asked for something we do not offer), the rest as `model_error_status` says."""
    if http_status in (404, 405, 501):
        return (
            RolloutStatus.INFRA_ERROR,
            EpisodeEnd.MODEL_ERROR,
            f"the gateway does not serve what the CLI asked for (HTTP {http_status}): {text[:300]}",
        )
    return model_error_status(http_status), EpisodeEnd.MODEL_ERROR, text[:300]


def _end(
    res: HarnessResult, status: RolloutStatus, finish: EpisodeEnd, error: str, start: float
) -> HarnessResult:
    res.status, res.finish_reason, res.error = status, finish, error
    res.wall_s = time.monotonic() - start
    res.tool_s = max(0.0, res.wall_s - res.model_s)  # the CLI's own time is in here too
    return res
