"""bubblewrap sandbox: the default backend locally and in CI.

    BubblewrapSandbox(workspace: Path, env_dir: Path | None, gateway_socket: Path | None = None, ...)
        .run(cmd, timeout, limits=None, cwd="/workspace") -> RunResult

Inside: a read-only system (/usr, a whitelisted /etc, the Python install), the per-repo venv read-only, the
workspace writable at /workspace (persistent across calls), a private /tmp tmpfs, new pid/net/ipc/uts
namespaces (no network at all), a cleared environment (no host secrets), no capabilities. Optionally one Unix
socket (the gateway) is bound at /run/harnessrl/gateway.sock: the only thing inside that reaches outside.

Each run is its own process group; on the wall-clock timeout the group is SIGKILLed, and since the sandbox's
pid 1 dies with its parent (`--die-with-parent`) the whole pid namespace goes with it. Memory and process
limits use a per-run cgroup when the host allows (exact, and the OOM/pids events tell us a limit was hit),
else rlimits; CPU time, file size and open files always use rlimits (via util-linux `prlimit`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from harnessrl.sandbox import cgroups
from harnessrl.sandbox.base import (
    GATEWAY_SOCKET_MOUNT,
    WORKSPACE_MOUNT,
    Limits,
    Outcome,
    RunResult,
    Sandbox,
    SandboxError,
)

# /etc entries a shell, git and Python need; everything else in the host's /etc (credentials, pip/apt
# configs with tokens) stays outside.
ETC_WHITELIST = (
    "passwd",
    "group",
    "hostname",
    "hosts",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "localtime",
    "mime.types",
    "services",
    "protocols",
)
TOP_LEVEL_SYSTEM = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
MAX_OUTPUT_BYTES = 2 << 20  # per stream kept in the result: head + tail around a truncation marker
GIT_STUB = '#!/bin/sh\necho "git: disabled in this sandbox (strict workspace: no repository history)" >&2\nexit 127\n'
ENV_MANIFEST = "harnessrl-env.json"  # written by envs.ensure_env: extra read-only paths the venv needs

# Messages a process prints when an rlimit (not a cgroup) stopped it; used only when no cgroup is available
# and only for a failing command.
_RLIMIT_MARKERS = re.compile(
    r"MemoryError|Cannot allocate memory|Resource temporarily unavailable|"
    r"fork: retry|File too large|std::bad_alloc"
)


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError("bubblewrap is not installed: `apt-get install bubblewrap` (or `make sysdeps`)")
    return path


def _read_capped(path: Path, cap: int = MAX_OUTPUT_BYTES) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= cap:
            data = f.read()
        else:
            head = f.read(cap // 2)
            f.seek(size - cap // 2)
            tail = f.read()
            data = head + f"\n[... {size - cap} bytes truncated ...]\n".encode() + tail
    return data.decode("utf-8", errors="replace")


class BubblewrapSandbox(Sandbox):
    def __init__(
        self,
        workspace: Path,
        env_dir: Path | None = None,
        gateway_socket: Path | None = None,
        *,
        git_stub: bool | None = None,
        extra_env: dict[str, str] | None = None,
        limits: Limits | None = None,
        read_only_workspace: bool = False,
    ) -> None:
        self.bwrap = bwrap_path()
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} is not a directory")
        self.env_dir = Path(env_dir).resolve() if env_dir is not None else None
        if self.env_dir is not None and not (self.env_dir / "bin" / "python").exists():
            raise SandboxError(f"env {self.env_dir} has no bin/python: create it with envs.ensure_env")
        self.gateway_socket = Path(gateway_socket).resolve() if gateway_socket is not None else None
        if self.gateway_socket is not None and not self.gateway_socket.is_socket():
            raise SandboxError(f"gateway socket {self.gateway_socket} is not a Unix socket")
        # Strict workspaces have no .git: a `git` that refuses instead of one that finds a parent repo.
        self.git_stub = (not (self.workspace / ".git").exists()) if git_stub is None else git_stub
        self.extra_env = dict(extra_env or {})
        self.default_limits = limits or Limits()
        self.read_only_workspace = read_only_workspace
        self.is_root = os.geteuid() == 0
        self._stub_dir: Path | None = None

    # -- argv -------------------------------------------------------------------------------------------
    def _ro_paths(self) -> list[Path]:
        paths: list[Path] = []
        if self.env_dir is not None:
            paths.append(self.env_dir)
            cfg = self.env_dir / "pyvenv.cfg"
            if cfg.is_file():
                for line in cfg.read_text().splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "home":
                        paths.append(Path(value.strip()).resolve().parent)  # the base Python install
            manifest = self.env_dir / ENV_MANIFEST
            if manifest.is_file():
                paths.extend(Path(p) for p in json.loads(manifest.read_text()).get("ro_paths", []))
        out: list[Path] = []
        for p in paths:
            if (
                p.exists()
                and not any(p == q or q in p.parents for q in out)
                and Path("/usr") not in [p, *p.parents]
            ):
                out.append(p)
        return out

    def _path_env(self) -> str:
        parts = []
        if self.git_stub:
            parts.append("/run/harnessrl/bin")
        if self.env_dir is not None:
            parts.append(str(self.env_dir / "bin"))
        parts += ["/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"]
        return ":".join(parts)

    def _git_stub_file(self) -> Path:
        if self._stub_dir is None:
            self._stub_dir = Path(tempfile.mkdtemp(prefix="harnessrl-gitstub-"))
            stub = self._stub_dir / "git"
            stub.write_text(GIT_STUB)
            stub.chmod(0o755)
        return self._stub_dir / "git"

    def build_argv(self, argv: list[str], limits: Limits, cwd: str, status_fd: int) -> list[str]:
        a = [self.bwrap]
        if self.is_root:
            # As root, a user namespace would map us to uid 0 anyway; drop every capability instead.
            a += [
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
            ]
        else:
            a += ["--unshare-all"]
        a += [
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--json-status-fd",
            str(status_fd),
        ]
        # /tmp, /dev and /proc first: a bind below /tmp (an env or socket the host keeps there) must land on top
        # of the private tmpfs, not under it.
        a += ["--dev", "/dev", "--proc", "/proc", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
        a += ["--ro-bind", "/usr", "/usr"]
        for name in TOP_LEVEL_SYSTEM:
            host = Path("/") / name
            if host.is_symlink():
                a += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                a += ["--ro-bind", str(host), str(host)]
        for name in ETC_WHITELIST:
            host = Path("/etc") / name
            if host.exists():
                a += ["--ro-bind", str(host), str(host)]
        for p in self._ro_paths():
            a += ["--ro-bind", str(p), str(p)]
        a += ["--bind" if not self.read_only_workspace else "--ro-bind", str(self.workspace), WORKSPACE_MOUNT]
        if self.git_stub:
            stub = str(self._git_stub_file())
            a += ["--ro-bind", stub, "/run/harnessrl/bin/git", "--ro-bind", stub, "/usr/bin/git"]
        env = {
            "PATH": self._path_env(),
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
        }
        if self.env_dir is not None:
            env["VIRTUAL_ENV"] = str(self.env_dir)
        if self.gateway_socket is not None:
            a += ["--bind", str(self.gateway_socket), GATEWAY_SOCKET_MOUNT]
            env["HARNESSRL_GATEWAY_SOCKET"] = GATEWAY_SOCKET_MOUNT
        env.update(self.extra_env)
        a += ["--clearenv"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        a += ["--chdir", cwd, "--", *argv]
        return a

    # -- run --------------------------------------------------------------------------------------------
    def run(
        self,
        cmd: list[str] | str,
        timeout: float,
        limits: Limits | None = None,
        cwd: str = WORKSPACE_MOUNT,
    ) -> RunResult:
        limits = limits or self.default_limits
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        factory = cgroups.factory()
        _warn_if_processes_unbounded(factory.available(), self.is_root)
        cgroup = None
        if factory.available():
            try:
                cgroup = factory.create(limits.memory_mb << 20, limits.processes + 8)
            except OSError:
                cgroup = None
        prlimit = [
            "prlimit",
            f"--cpu={limits.cpu_s}:{limits.cpu_s + 5}",
            f"--fsize={limits.file_size_mb << 20}",
            f"--nofile={limits.open_files}",
            "--core=0",
        ]
        if cgroup is None:
            prlimit.append(f"--as={limits.memory_mb << 20}")
            if not self.is_root:  # RLIMIT_NPROC never applies to root
                prlimit.append(f"--nproc={_user_process_count() + limits.processes + 8}")
        prlimit.append("--")
        status_r, status_w = os.pipe()
        os.set_blocking(status_r, False)
        tmpdir = Path(tempfile.mkdtemp(prefix="harnessrl-run-"))
        started = time.monotonic()
        killed_for_timeout = False
        try:
            full = prlimit + self.build_argv(argv, limits, cwd, status_w)
            if cgroup is not None:
                join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 121; shift; done; shift; exec "$@"'
                full = ["/bin/sh", "-c", join, "sh", *map(str, cgroup.procs_files), "--", *full]
            with open(tmpdir / "out", "wb") as out, open(tmpdir / "err", "wb") as err:
                try:
                    proc = subprocess.Popen(
                        full,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                        pass_fds=(status_w,),
                        start_new_session=True,
                        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    )
                except OSError as e:
                    return RunResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, f"could not start bwrap: {e}")
                finally:
                    os.close(status_w)
                    status_w = -1
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    killed_for_timeout = True
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    if cgroup is not None:
                        cgroup.kill_all()
                    proc.wait()
            wall = time.monotonic() - started
            status = _read_status(status_r)
            events = cgroup.events() if cgroup is not None else {}
            stdout = _read_capped(tmpdir / "out")
            stderr = _read_capped(tmpdir / "err")
        finally:
            if status_w != -1:
                os.close(status_w)
            os.close(status_r)
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(tmpdir, ignore_errors=True)
        return _classify(
            proc.returncode,
            status,
            events,
            stdout,
            stderr,
            wall,
            killed_for_timeout,
            timeout,
            cgroup is not None,
        )

    def close(self) -> None:
        if self._stub_dir is not None:
            shutil.rmtree(self._stub_dir, ignore_errors=True)
            self._stub_dir = None


_warned = False


def _warn_if_processes_unbounded(have_cgroups: bool, is_root: bool) -> None:
    global _warned
    if not have_cgroups and is_root and not _warned:
        _warned = True
        warnings.warn(
            "running as root without a writable cgroup hierarchy: sandbox memory is capped with "
            "RLIMIT_AS but the process limit cannot be enforced (RLIMIT_NPROC does not bind root); "
            "run as an unprivileged user or give harnessrl a delegated cgroup",
            RuntimeWarning,
            stacklevel=3,
        )


def enforcement() -> dict[str, str]:
    """How limits are enforced on this host (for reports and docs)."""
    f = cgroups.factory()
    if f.available():
        return {"memory": f"cgroup v{f.version}", "processes": f"cgroup v{f.version}"}
    return {"memory": "RLIMIT_AS", "processes": "none (root)" if os.geteuid() == 0 else "RLIMIT_NPROC"}


def _user_process_count() -> int:
    uid = os.getuid()
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if d.stat().st_uid == uid:
                    n += 1
    return n


def _read_status(fd: int) -> list[dict]:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    records = []
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def _limits_hit(events: dict[str, int]) -> str:
    hit = []
    if events.get("oom_kill"):
        hit.append(f"memory limit ({events['oom_kill']} OOM kill(s))")
    if events.get("pids_max"):
        hit.append(f"process limit ({events['pids_max']} fork(s) refused)")
    return "; ".join(hit)


def _classify(
    returncode: int,
    status: list[dict],
    events: dict[str, int],
    stdout: str,
    stderr: str,
    wall: float,
    killed_for_timeout: bool,
    timeout: float,
    exact_limits: bool,
) -> RunResult:
    exit_codes = [r["exit-code"] for r in status if "exit-code" in r]
    started = any("child-pid" in r for r in status)
    if killed_for_timeout:
        if events:  # e.g. a fork bomb: refused forks, then spinning until the clock ran out
            return RunResult(
                Outcome.RESOURCE_LIMIT,
                None,
                stdout,
                stderr,
                wall,
                f"{_limits_hit(events)}, then killed at the {timeout:g} s wall-clock limit",
                events,
            )
        return RunResult(
            Outcome.TIMEOUT,
            None,
            stdout,
            stderr,
            wall,
            f"killed after the {timeout:g} s wall-clock limit",
            events,
        )
    if returncode == 121 and not status:
        return RunResult(
            Outcome.SANDBOX_ERROR, None, stdout, stderr, wall, "could not join the run's cgroup", events
        )
    if not exit_codes:
        if started and "bwrap: execvp" in stderr:  # the command itself does not exist: the caller's error
            return RunResult(Outcome.NONZERO, 127, stdout, stderr, wall, "command not found", events)
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"bwrap exited {returncode}"
        return RunResult(Outcome.SANDBOX_ERROR, None, stdout, stderr, wall, f"sandbox failed: {last}", events)
    code = exit_codes[-1]
    if code == 0:
        return RunResult(Outcome.OK, 0, stdout, stderr, wall, "", events)
    signum = code - 128 if code > 128 else 0
    if events:
        return RunResult(Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, _limits_hit(events), events)
    if signum in (signal.SIGXCPU, signal.SIGXFSZ) or (signum == signal.SIGKILL and not exact_limits):
        return RunResult(
            Outcome.RESOURCE_LIMIT,
            code,
            stdout,
            stderr,
            wall,
            f"killed by {signal.Signals(signum).name}",
            events,
        )
    if not exact_limits and _RLIMIT_MARKERS.search(stdout[-200_000:] + stderr[-200_000:]):
        return RunResult(
            Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, "rlimit reached (from output)", events
        )
    if "File too large" in stderr[-200_000:] + stdout[-200_000:]:
        return RunResult(Outcome.RESOURCE_LIMIT, code, stdout, stderr, wall, "file size limit", events)
    return RunResult(Outcome.NONZERO, code, stdout, stderr, wall, "", events)
