"""The one small interface every sandbox backend implements, and its typed results.

    Sandbox.run(cmd: list[str] | str, timeout: float, limits: Limits | None = None, cwd: str = "/workspace")
        -> RunResult(outcome, exit_code, stdout, stderr, wall_s, detail, limit_events)

Outcomes: `ok` (exit 0), `nonzero` (the command failed), `timeout` (wall clock; the whole sandbox was killed),
`resource_limit` (memory / processes / CPU time / file size / workspace quota), `sandbox_error` (the sandbox itself could not
start or broke: an infrastructure failure that must never be reported as the agent's failure).
A string `cmd` runs under `/bin/sh -c`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

WORKSPACE_MOUNT = "/workspace"
# The whole environment an agent's command starts with (plus PATH, and VIRTUAL_ENV where there is one):
# nothing of the host's leaks in.
AGENT_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONNOUSERSITE": "1",
    "GIT_CONFIG_NOSYSTEM": "1",
    "USER": "agent",
    "LOGNAME": "agent",
}
GATEWAY_SOCKET_MOUNT = "/run/harnessrl/gateway.sock"


class Outcome(enum.StrEnum):
    OK = "ok"
    NONZERO = "nonzero"
    TIMEOUT = "timeout"
    RESOURCE_LIMIT = "resource_limit"
    SANDBOX_ERROR = "sandbox_error"


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits. Memory and process limits use cgroups where this host lets us create them
    (exact, with OOM/pids events) and rlimits otherwise (RLIMIT_AS / RLIMIT_NPROC)."""

    memory_mb: int = 2048
    processes: int = 256
    cpu_s: int = 600  # CPU seconds (RLIMIT_CPU): SIGXCPU at the limit, SIGKILL 5 s later
    file_size_mb: int = 512  # largest single file a command may write (RLIMIT_FSIZE)
    open_files: int = 1024
    tmp_mb: int = 512  # size of the private /tmp tmpfs
    workspace_mb: int = 1024  # how much the workspace may grow over its size when the sandbox was made
    workspace_files: int = 100_000  # how many entries it may gain

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{f.name} must be a positive integer, got {value!r}")


@dataclass
class RunResult:
    outcome: Outcome
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    detail: str = ""  # why: which limit was hit, what broke in the sandbox
    limit_events: dict[str, int] = field(default_factory=dict)  # e.g. {"oom_kill": 1, "pids_max": 37}

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def infra_error(self) -> bool:
        return self.outcome is Outcome.SANDBOX_ERROR

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d


class SandboxError(RuntimeError):
    """The sandbox could not be created or used (missing bwrap, bad workspace path): infrastructure, not agent."""


if TYPE_CHECKING:
    from harnessrl.sandbox.quota import Quota


class Sandbox(ABC):
    """A place to run an agent's or a verifier's commands, with the workspace at /workspace."""

    @abstractmethod
    def run(
        self,
        cmd: list[str] | str,
        timeout: float,
        limits: Limits | None = None,
        cwd: str = WORKSPACE_MOUNT,
    ) -> RunResult: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases backend resources (pods, cgroups). The workspace itself is left alone."""

    def workspace_quota(self, limits: Limits | None = None) -> Quota | None:
        """The bound on the workspace's growth that host-side writes (the harness's file tools) must respect
        too; None where the backend enforces none on the host's side."""
        return None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AgentSandbox(Sandbox):
    """A sandbox a whole agent can run inside (a production CLI: harness/cli_episode.py), not only its commands:
    it takes more read-only binds (the CLI's install prefix, the task), the gateway as its one way out, and
    variables per run. Bubblewrap and podman are; the Kubernetes pod backend runs commands only."""

    default_limits: Limits

    @abstractmethod
    def bind_read_only(self, host: Path, inside: str) -> None:
        """Binds `host` (a file or directory) read-only at `inside` for later runs."""

    @abstractmethod
    def connect_gateway(self, url: str) -> str:
        """Makes the gateway at `url` (http://host:port/...) reachable from later runs through one Unix socket,
        and nothing else; returns its path inside (GATEWAY_SOCKET_MOUNT)."""

    @abstractmethod
    def run(
        self,
        cmd: list[str] | str,
        timeout: float,
        limits: Limits | None = None,
        cwd: str = WORKSPACE_MOUNT,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """`env`: variables for this run only, on top of the sandbox's (a harness's settings and key)."""


def checked_bind(host: Path, inside: str) -> Path:
    """`host` resolved, for a read-only bind at `inside`: it must exist, and a bind may add paths, never cover
    the sandbox's own (the workspace, /tmp, the system)."""
    host = Path(host).resolve()
    if not host.exists():
        raise SandboxError(f"{host} does not exist")
    if not inside.startswith("/") or inside.rstrip("/") in ("", WORKSPACE_MOUNT, "/tmp", "/usr", "/proc"):
        raise SandboxError(f"cannot bind over {inside!r}")
    return host
