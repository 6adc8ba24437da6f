"""Where tool calls execute: the `ToolRuntime` interface and its implementations.

`LocalSubprocessRuntime` runs commands as plain subprocesses in a directory (tests, trusted debugging only);
`SandboxRuntime` runs them through the bubblewrap sandbox. File reads/writes happen host-side on the
workspace, confined to it (symlinks that point outside are refused), on regular files only, streamed and
capped: the agent controls every file in the workspace, so nothing here may read a whole file into memory,
block on a FIFO, or let an error the agent caused escape as a harness failure (`ToolError` is what the agent
is told instead).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from harnessrl.sandbox import quota
from harnessrl.sandbox.base import Limits, Sandbox

# outcome values follow the sandbox's RunResult
OK, NONZERO, TIMEOUT, RESOURCE_LIMIT, SANDBOX_ERROR = (
    "ok",
    "nonzero",
    "timeout",
    "resource_limit",
    "sandbox_error",
)
MAX_OUTPUT_CHARS = 20_000
VIEW_MAX_LINES = 1000  # lines one `view` returns
VIEW_MAX_BYTES = 16_000  # bytes of file content one `view` returns (below MAX_OUTPUT_CHARS with numbering)
VIEW_MAX_LINE_BYTES = 2000  # longer lines are cut
MAX_EDIT_BYTES = 4 << 20  # largest file `str_replace` reads whole
# What an agent can cause with the files it makes (loops, a file where a directory should be, a FIFO, ...).
# Anything else (ENOSPC, EIO, EMFILE, ...) is the host's problem and stays an exception.
AGENT_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EEXIST,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.EACCES,
        errno.EPERM,
        errno.ENXIO,
        errno.ETXTBSY,
        errno.EINVAL,
        errno.ENOTEMPTY,
        errno.EFBIG,
    }
)


@dataclass
class ShellResult:
    outcome: str  # ok | nonzero | timeout | resource_limit | sandbox_error
    exit_code: int | None
    output: str  # stdout then stderr, truncated to MAX_OUTPUT_CHARS
    wall_s: float


class SandboxFailure(RuntimeError):
    """The sandbox itself failed (not the command): an infrastructure error, not the agent's fault."""


class ToolError(Exception):
    """A file operation the agent asked for cannot be done (missing file, symlink loop, outside the workspace,
    too large, over quota): the agent gets the message as an observation; the episode goes on."""


class PathOutsideWorkspace(ToolError, ValueError):
    """A tool tried to read or write outside the task workspace."""


@dataclass
class FileView:
    """Lines `first`..`last` (1-based) of a file, as `view` shows them."""

    lines: list[str] = field(default_factory=list)
    first: int = 1
    last: int = 0
    more: bool = False  # the file goes on after `last` (the view was capped or a range was asked for)
    file_bytes: int = 0
    cut_lines: int = 0  # lines longer than VIEW_MAX_LINE_BYTES, shown cut


class ToolRuntime(Protocol):
    workspace: Path

    def run_shell(self, command: str, timeout: float) -> ShellResult: ...

    def read_file(self, path: str, max_bytes: int = MAX_EDIT_BYTES) -> str: ...

    def view_file(self, path: str, first: int = 1, last: int | None = None) -> FileView: ...

    def write_file(self, path: str, content: str) -> None: ...


def truncate(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters elided ...]\n{text[-half:]}"


@contextlib.contextmanager
def _agent_errors(path: str) -> Iterator[None]:
    """OSErrors the agent's files can cause become ToolErrors; the rest propagate."""
    try:
        yield
    except OSError as e:
        if e.errno not in AGENT_ERRNOS:
            raise
        raise ToolError(f"{path}: {e.strerror or e}") from None


class WorkspaceFiles:
    """Host-side file access confined to one workspace directory."""

    workspace: Path

    def workspace_quota(self) -> quota.Quota | None:
        """How big the workspace may get (None: unbounded)."""
        return None

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
        try:
            resolved = (root / raw).resolve()
        except RuntimeError as e:  # Python 3.11: "Symlink loop from ..."
            raise ToolError(f"{path}: {e}") from None
        except OSError as e:
            if e.errno not in AGENT_ERRNOS:
                raise
            raise ToolError(f"{path}: {e.strerror or e}") from None
        if resolved != root and root not in resolved.parents:
            raise PathOutsideWorkspace(f"{path}: resolves outside the workspace")
        return resolved

    def _open_regular(self, path: str) -> BinaryIO:
        """A regular file of the workspace, opened for reading without ever blocking (FIFOs) or following a
        link swapped in after `resolve`."""
        target = self.resolve(path)
        with _agent_errors(path):
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            kind = "a directory (list it with bash: ls)" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise ToolError(f"{path}: {kind}")
        return os.fdopen(fd, "rb")

    def read_file(self, path: str, max_bytes: int = MAX_EDIT_BYTES) -> str:
        with self._open_regular(path) as f, _agent_errors(path):
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ToolError(f"{path}: larger than {max_bytes} bytes; edit it with bash (sed, python) instead")
        return data.decode("utf-8", errors="replace")

    def view_file(self, path: str, first: int = 1, last: int | None = None) -> FileView:
        """Lines `first`..`last` (default: as many as the caps allow), read line by line: memory stays
        bounded by the caps whatever the file's size or line lengths."""
        if first < 1 or (last is not None and last < first):
            raise ToolError(f"view_range [{first}, {last}]: need 1 <= first <= last")
        view = FileView(first=first, last=first - 1)
        used = 0
        with self._open_regular(path) as f, _agent_errors(path):
            view.file_bytes = os.fstat(f.fileno()).st_size
            for number, (raw, cut) in enumerate(_capped_lines(f, VIEW_MAX_LINE_BYTES), 1):
                if number < first:
                    continue
                if (
                    (last is not None and number > last)
                    or len(view.lines) >= VIEW_MAX_LINES
                    or (used + len(raw) > VIEW_MAX_BYTES and view.lines)
                ):
                    view.more = True
                    break
                view.lines.append(raw.decode("utf-8", errors="replace"))
                view.cut_lines += cut
                used += len(raw)
                view.last = number
        return view

    def write_file(self, path: str, content: str) -> None:
        """Writes in place; new files and directories take the owner of the workspace root (the sandbox's
        unprivileged uid when we run as root), so the agent can change them afterwards."""
        target = self.resolve(path)
        data = content.encode("utf-8")
        root = self.workspace.resolve()
        new_dirs = [
            d for d in (target.parent, *target.parent.parents) if root in d.parents and not d.exists()
        ]
        with _agent_errors(path):
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(
                target, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
            )
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ToolError(f"{path}: not a regular file")
            self._check_room(path, len(data) - st.st_size)
            owner = os.stat(root)
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (owner.st_uid, owner.st_gid):
                os.fchown(fd, owner.st_uid, owner.st_gid)
                for d in new_dirs:
                    os.chown(d, owner.st_uid, owner.st_gid, follow_symlinks=False)
            with _agent_errors(path):
                os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def _check_room(self, path: str, growth: int) -> None:
        q = self.workspace_quota()
        if q is None or growth <= 0:
            return
        usage = quota.measure(self.workspace, stop_at=q)
        if growth > q.room(usage) or q.violation(usage):
            raise ToolError(
                f"{path}: writing {growth} more bytes would exceed the workspace quota "
                f"({usage.describe()} now, {q.max_bytes >> 20} MB allowed); delete files first"
            )


def _capped_lines(f: BinaryIO, cap: int) -> Iterator[tuple[bytes, bool]]:
    """(line without its newline, cut) for each line; at most `cap` bytes of a line are ever kept."""
    while True:
        raw = f.readline(cap + 1)
        if not raw:
            return
        cut = len(raw) > cap and not raw.endswith(b"\n")
        if cut:
            raw = raw[:cap]
            while True:  # skip the rest of the long line in bounded reads
                rest = f.readline(1 << 16)
                if not rest or rest.endswith(b"\n"):
                    break
        yield raw.rstrip(b"\n").rstrip(b"\r"), cut


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
    """Runs commands in a sandbox (`harnessrl.sandbox.bwrap.BubblewrapSandbox`); host-side writes respect the
    sandbox's workspace quota."""

    def __init__(self, sandbox: Sandbox, workspace: str | Path, limits: Limits | None = None):
        self.sandbox = sandbox
        self.workspace = Path(workspace)
        self.limits = limits

    def workspace_quota(self) -> quota.Quota | None:
        return self.sandbox.workspace_quota(self.limits)

    def run_shell(self, command: str, timeout: float) -> ShellResult:
        try:
            res = self.sandbox.run(command, timeout=timeout, limits=self.limits)
        except Exception as e:  # the sandbox machinery broke (SandboxError…), not the command
            raise SandboxFailure(f"sandbox run failed: {type(e).__name__}: {e}") from e
        outcome = str(res.outcome)
        if outcome == SANDBOX_ERROR:
            detail = res.detail or (res.stderr or "").strip()[-500:]
            raise SandboxFailure(f"sandbox error: {detail}")
        out = (res.stdout or "") + (res.stderr or "")
        if outcome == RESOURCE_LIMIT and res.detail:
            out += f"\n[resource limit: {res.detail}]"
        return ShellResult(outcome, res.exit_code, truncate(out), res.wall_s)


class NoToolsRuntime:
    """The runtime of a task without a workspace (an environment graded on the answer alone): every tool
    refuses. Harnesses that need tools are refused for such tasks before they run (rollout.episode)."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace  # empty; nothing is read from it

    def _refuse(self) -> ToolError:
        return ToolError("this task has no workspace: its environment gives the agent no tools")

    def run_shell(self, command: str, timeout: float) -> ShellResult:
        raise self._refuse()

    def read_file(self, path: str, max_bytes: int = MAX_EDIT_BYTES) -> str:
        raise self._refuse()

    def view_file(self, path: str, first: int = 1, last: int | None = None) -> FileView:
        raise self._refuse()

    def write_file(self, path: str, content: str) -> None:
        raise self._refuse()
