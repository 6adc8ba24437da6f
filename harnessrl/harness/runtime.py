"""Where tool calls execute: the `ToolRuntime` interface and its implementations.

`LocalSubprocessRuntime` runs commands as plain subprocesses in a directory (tests, trusted debugging only);
`SandboxRuntime` runs them through the bubblewrap sandbox. File reads/writes happen host-side on the
workspace, confined to it (symlinks that point outside are refused).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# outcome values follow the sandbox's RunResult
OK, NONZERO, TIMEOUT, RESOURCE_LIMIT, SANDBOX_ERROR = (
    "ok",
    "nonzero",
    "timeout",
    "resource_limit",
    "sandbox_error",
)
MAX_OUTPUT_CHARS = 20_000


@dataclass
class ShellResult:
    outcome: str  # ok | nonzero | timeout | resource_limit | sandbox_error
    exit_code: int | None
    output: str  # stdout then stderr, truncated to MAX_OUTPUT_CHARS
    wall_s: float


class SandboxFailure(RuntimeError):
    """The sandbox itself failed (not the command): an infrastructure error, not the agent's fault."""


class PathOutsideWorkspace(ValueError):
    """A tool tried to read or write outside the task workspace."""


class ToolRuntime(Protocol):
    workspace: Path

    def run_shell(self, command: str, timeout: float) -> ShellResult: ...

    def read_file(self, path: str) -> str: ...

    def write_file(self, path: str, content: str) -> None: ...


def truncate(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters elided ...]\n{text[-half:]}"


class WorkspaceFiles:
    """Host-side file access confined to one workspace directory."""

    workspace: Path

    def resolve(self, path: str) -> Path:
        root = self.workspace.resolve()
        raw = Path(path)
        if raw.is_absolute():
            # the agent sees the workspace at /workspace (sandbox) or its real path (local)
            for prefix in (Path("/workspace"), root):
                if raw == prefix or prefix in raw.parents:
                    raw = raw.relative_to(prefix)
                    break
            else:
                raise PathOutsideWorkspace(
                    f"{path}: outside the workspace; use a path relative to the repo root"
                )
        resolved = (root / raw).resolve()
        if resolved != root and root not in resolved.parents:
            raise PathOutsideWorkspace(f"{path}: resolves outside the workspace")
        return resolved

    def read_file(self, path: str) -> str:
        target = self.resolve(path)
        if not target.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        return target.read_text(encoding="utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> None:
        target = self.resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")


class LocalSubprocessRuntime(WorkspaceFiles):
    """Runs `bash -c` in the workspace as a plain subprocess: no isolation. For tests and debugging only."""

    def __init__(self, workspace: str | Path, env: dict[str, str] | None = None):
        self.workspace = Path(workspace)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workspace),
            "LANG": "C.UTF-8",
            **(env or {}),
        }

    def run_shell(self, command: str, timeout: float) -> ShellResult:
        start = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.workspace,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            errors="replace",
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return ShellResult(TIMEOUT, None, truncate(out or ""), time.monotonic() - start)
        outcome = OK if proc.returncode == 0 else NONZERO
        return ShellResult(outcome, proc.returncode, truncate(out or ""), time.monotonic() - start)


class SandboxRuntime(WorkspaceFiles):
    """Runs commands in the bubblewrap sandbox (`components.sandbox.bwrap.BubblewrapSandbox`)."""

    def __init__(self, sandbox: Any, workspace: str | Path, limits: Any = None):
        self.sandbox = sandbox
        self.workspace = Path(workspace)
        self.limits = limits

    def run_shell(self, command: str, timeout: float) -> ShellResult:
        start = time.monotonic()
        try:
            kwargs = {"limits": self.limits} if self.limits is not None else {}
            res = self.sandbox.run(command, timeout=timeout, **kwargs)
        except Exception as e:  # the sandbox machinery broke (SandboxError…), not the command
            raise SandboxFailure(f"sandbox run failed: {type(e).__name__}: {e}") from e
        outcome = str(getattr(res.outcome, "value", res.outcome))
        if outcome == SANDBOX_ERROR:
            detail = getattr(res, "detail", "") or (res.stderr or "").strip()[-500:]
            raise SandboxFailure(f"sandbox error: {detail}")
        out = (res.stdout or "") + (res.stderr or "")
        if outcome == RESOURCE_LIMIT and getattr(res, "detail", ""):
            out += f"\n[resource limit: {res.detail}]"
        return ShellResult(
            outcome, res.exit_code, truncate(out), getattr(res, "wall_s", time.monotonic() - start)
        )
