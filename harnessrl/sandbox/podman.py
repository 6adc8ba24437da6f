"""podman sandbox: one container per rollout (or per verification) from the task's environment image.

    PodmanSandbox(workspace: Path, image: str, limits: Limits, network: str | None = None,
                  *, gateway_socket: Path | None = None, read_only_workspace: bool = False)
        .run(cmd, timeout, limits=None, cwd="/workspace") -> RunResult

The container starts once (`podman run -d --init ... sleep infinity`, main process root without any
capability) and every command runs in it with `podman exec` as an unprivileged uid of this sandbox's own
(identity.py: the same reserved host range bubblewrap uses, so an escape lands on a uid that owns nothing),
with the environment cleared to a fixed list. The prepared workspace (one commit, no history) is bind-mounted
at /workspace; the root filesystem is read-only, /tmp a size-limited tmpfs; no network (`--network none`)
unless `network` names a podman network (an egress allow-list the operator made); the gateway's Unix socket,
when given, is bound at GATEWAY_SOCKET_MOUNT. A whole agent can run inside (`AgentSandbox`: a production CLI):
`bind_read_only` adds read-only binds (its install prefix, the task) and `connect_gateway` a forwarder to the
gateway's address on a Unix socket of its own (forward.UnixForwarder, as under bubblewrap), and the container is
started again with them before the next command (a mount cannot be added to a running container; the
workspace is a bind, so nothing of it is lost). Memory (`--memory`, no swap) and processes (`--pids-limit`)
are the container's cgroup, fixed at construction; CPU time, file size and open files are per command
(`ulimit` in the exec'd shell). After a command, its leftover processes (daemons) are killed (`kill -KILL -1`
as the sandbox uid from inside: everything but the root-owned init), so nothing outlives it, as under
bubblewrap. close() kills the container's init (every process goes with it) and podman removes the
container (`--rm`) in the background.

Outcomes follow bubblewrap's: podman's own failures (exit 125, no container) are `sandbox_error`; an OOM kill
or refused forks seen in the container's cgroup counters are `resource_limit`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harnessrl.sandbox import identity, leftovers, quota
from harnessrl.sandbox.base import (
    AGENT_ENV,
    GATEWAY_SOCKET_MOUNT,
    WORKSPACE_MOUNT,
    AgentSandbox,
    Limits,
    Outcome,
    RunResult,
    SandboxError,
    checked_bind,
)
from harnessrl.sandbox.cgroups import Cgroup
from harnessrl.sandbox.identity import let_group_connect
from harnessrl.sandbox.images import podman_problem
from harnessrl.sandbox.outcomes import exited, read_capped, timed_out

logger = logging.getLogger(__name__)

OWNER_LABEL = (
    "org.harnessrl.sandbox-owner"  # the creating process's leftovers tag: sweep what killed runs left
)
# Runs the command, then kills what it left running (kill(-1) spares the caller and pid 1; the container's
# main process is root's, out of the sandbox uid's reach), and exits with the command's status.
# CPU time as bubblewrap sets it: SIGXCPU at the soft limit, SIGKILL 5 s later.
_WRAP = (
    'ulimit -S -t "$1" && ulimit -H -t "$(($1 + 5))" && ulimit -f "$2" && ulimit -n "$3" && ulimit -c 0 '
    '|| { echo "harnessrl: could not set the command limits" >&2; exit 125; }; shift 3; '
    '"$@"; rc=$?; kill -KILL -1 2>/dev/null; exit $rc'
)
SETUP_FAILED = "harnessrl: could not set the command limits"  # as _WRAP prints it
PODMAN_FAILED = 125  # podman exec's own error (container gone, runtime failure) or the limits above
_FSIZE_BLOCK = 512  # sh's `ulimit -f` unit
CONTAINER_NPROC = 32768  # RLIMIT_NPROC counts the uid's processes host-wide; --pids-limit is the real bound


def _podman(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


class PodmanSandbox(AgentSandbox):
    def __init__(
        self,
        workspace: Path,
        image: str,
        limits: Limits,
        network: str | None = None,
        *,
        gateway_socket: Path | None = None,
        read_only_workspace: bool = False,
    ) -> None:
        problem = podman_problem()
        if problem is not None:
            raise SandboxError(f"podman sandbox: {problem}")
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} is not a directory")
        if not image:
            raise SandboxError("podman sandbox: no image (the task's image_name)")
        self.gateway_socket = Path(gateway_socket).resolve() if gateway_socket is not None else None
        if self.gateway_socket is not None and not self.gateway_socket.is_socket():
            raise SandboxError(f"gateway socket {self.gateway_socket} is not a Unix socket")
        self.image, self.limits, self.network = image, limits, network
        self.default_limits = limits
        self.read_only_workspace = read_only_workspace
        self.read_only_binds: list[tuple[Path, str]] = []  # (host path, path inside): bind_read_only
        _sweep_once()
        self.identity = identity.acquire()
        uid, gid = (self.identity.uid, self.identity.gid) if self.identity else (os.getuid(), os.getgid())
        self.user = f"{uid}:{gid}"
        self._box = _Container()
        self._closers: list[Callable[[], None]] = []  # a gateway forwarder
        self._finalizer = weakref.finalize(self, _remove, self._box, self.identity, self._closers)
        self._cgroup: Cgroup | None = None
        self._mounts_changed = False
        try:
            if self.gateway_socket is not None and self.identity is not None:
                let_group_connect(self.gateway_socket, gid)
            self.baseline = self.last_usage = quota.measure(
                self.workspace, owner=(uid, gid) if self.identity else None
            )
            self._start()
        except BaseException:
            self.close()
            raise

    @property
    def name(self) -> str:
        """The container's name (a new one each time it is started again)."""
        return self._box.name

    # -- what an agent that runs inside adds --------------------------------------------------------------
    def bind_read_only(self, host: Path, inside: str) -> None:
        """Binds `host` (a file or directory, e.g. a CLI's prefix) read-only at `inside` for later runs."""
        self.read_only_binds.append((checked_bind(host, inside), inside))
        self._mounts_changed = True

    def connect_gateway(self, url: str) -> str:
        """The gateway at `url` through one Unix socket at GATEWAY_SOCKET_MOUNT, forwarded to it by this sandbox
        until it closes: the only way out (the container has no network). Returns the path inside."""
        from harnessrl.sandbox.forward import forwarder_for

        if self.gateway_socket is not None:
            raise SandboxError(f"this sandbox already has a gateway socket ({self.gateway_socket})")
        gid = self.identity.gid if self.identity is not None else None
        self.gateway_socket = forwarder_for(url, self._closers, gid)
        self._mounts_changed = True
        return GATEWAY_SOCKET_MOUNT

    def run_args(self) -> list[str]:
        """`podman run` options (before the image)."""
        lim = self.limits
        a = ["run", "-d", "--rm", "--name", self.name, "--label", f"{OWNER_LABEL}={leftovers.current_tag()}"]
        a += ["--init", "--user", "0:0", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
        a += ["--network", self.network or "none", "--hostname", "sandbox"]
        a += ["--read-only", "--read-only-tmpfs=false"]
        a += ["--tmpfs", f"/tmp:rw,nosuid,nodev,size={lim.tmp_mb}m,mode=1777"]
        a += ["--memory", f"{lim.memory_mb}m", "--memory-swap", f"{lim.memory_mb}m"]
        a += ["--pids-limit", str(lim.processes + 8)]  # + init, sleep, the exec'd shell and its kill
        # every rlimit podman sets is named: one --ulimit drops containers.conf's defaults for the others, and
        # runc (no CAP_SYS_RESOURCE) cannot raise them to the host's defaults
        a += ["--ulimit", f"nofile={lim.open_files}:{lim.open_files}", "--ulimit", "core=0:0"]
        a += ["--ulimit", f"nproc={CONTAINER_NPROC}:{CONTAINER_NPROC}"]
        mode = "ro" if self.read_only_workspace else "rw"
        a += ["--mount", f"type=bind,src={self.workspace},dst={WORKSPACE_MOUNT},{mode}"]
        if self.gateway_socket is not None:
            a += ["--mount", f"type=bind,src={self.gateway_socket},dst={GATEWAY_SOCKET_MOUNT}"]
        for host, inside in self.read_only_binds:
            a += ["--mount", f"type=bind,src={host},dst={inside},ro"]
        a += ["--workdir", WORKSPACE_MOUNT, "--env", "HOME=/tmp"]
        return a

    def _start(self) -> None:
        self._box.name = f"harnessrl-sb-{uuid.uuid4().hex[:12]}"
        self._mounts_changed = False
        # podman 4.3's conmon stays in the directory `podman run` started in and drops an empty `oom` file
        # there after an OOM kill: start it in a directory that is gone by then, so it leaves nothing behind.
        start_dir = leftovers.make_tempdir("podmanrun")
        try:
            proc = _podman(*self.run_args(), self.image, "sleep", "infinity", cwd=start_dir)
        finally:
            shutil.rmtree(start_dir, ignore_errors=True)
        if proc.returncode != 0:
            raise SandboxError(f"podman run {self.image} failed: {proc.stderr.strip()[-1000:]}")
        # the container's init (killed at close) and its cgroup (v1: one per controller; v2: one), which holds
        # the OOM-kill and pids.max counters
        state = _podman(
            "inspect", "--format", "{{.State.Pid}} {{.State.CgroupPath}}", self.name
        ).stdout.split()
        with contextlib.suppress(ValueError, IndexError, OSError):
            self._box.init.append(os.pidfd_open(int(state[0])))
        path = state[1].lstrip("/") if len(state) > 1 else ""
        if not path:
            logger.warning("%s: no cgroup path from podman; limit hits will not be told apart", self.name)
            return
        root = Path("/sys/fs/cgroup")
        v1 = [root / c / path for c in ("memory", "pids") if (root / c / path).is_dir()]
        dirs = v1 or [d for d in (root / path,) if d.is_dir()]
        self._cgroup = Cgroup(dirs=dirs, version=1 if v1 else 2)

    def exec_args(
        self, argv: list[str], limits: Limits, cwd: str, extra_env: dict[str, str] | None = None
    ) -> list[str]:
        env = dict(AGENT_ENV)
        if self.gateway_socket is not None:
            env["HARNESSRL_GATEWAY_SOCKET"] = GATEWAY_SOCKET_MOUNT
        env.update(extra_env or {})
        a = ["exec", "--user", self.user, "--workdir", cwd]
        for k, v in env.items():
            a += ["--env", f"{k}={v}"]
        fsize = (limits.file_size_mb << 20) // _FSIZE_BLOCK
        nofile = min(limits.open_files, self.limits.open_files)  # the container's hard limit binds
        a += [self.name, "/bin/sh", "-c", _WRAP, "sh"]
        return [*a, str(limits.cpu_s), str(fsize), str(nofile), *argv]

    def run(
        self,
        cmd: list[str] | str,
        timeout: float,
        limits: Limits | None = None,
        cwd: str = WORKSPACE_MOUNT,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """`env`: variables for this run only, on top of the sandbox's (a harness's settings and key)."""
        if self._finalizer is None or not self._finalizer.alive:
            raise SandboxError("this sandbox is closed")
        limits = limits or self.limits
        if self._mounts_changed:
            _stop(self._box)
            try:
                self._start()
            except SandboxError as e:
                return RunResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, str(e))
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        allowed = quota.Quota.growth(self.baseline, limits).relaxed_to(self.last_usage)
        before = self._events()
        tmpdir = leftovers.make_tempdir("podman")
        started = time.monotonic()
        try:
            with open(tmpdir / "out", "wb") as out, open(tmpdir / "err", "wb") as err:
                proc = subprocess.Popen(
                    ["podman", *self.exec_args(argv, limits, cwd, env)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                stopped_for = quota.wait_watching(proc, timeout, self.workspace, allowed)
                if stopped_for:
                    self._kill_commands()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            wall = time.monotonic() - started
            stdout, stderr = read_capped(tmpdir / "out"), read_capped(tmpdir / "err")
        except OSError as e:
            return RunResult(Outcome.SANDBOX_ERROR, None, "", "", time.monotonic() - started, f"podman: {e}")
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        after = self._events()
        events = {k: v - before.get(k, 0) for k, v in after.items() if v > before.get(k, 0)}
        usage = quota.measure(self.workspace, stop_at=allowed)
        violation = allowed.violation(usage)
        self.last_usage = quota.measure(self.workspace) if violation else usage
        stopped_for = stopped_for or violation
        if stopped_for and stopped_for != "timeout":
            return RunResult(Outcome.RESOURCE_LIMIT, None, stdout, stderr, wall, stopped_for, events)
        return _classify(proc.returncode, events, stdout, stderr, wall, stopped_for == "timeout", timeout)

    def _kill_commands(self) -> None:
        """SIGKILL every process of the sandbox uid in the container (setsid daemons too)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            _podman("exec", "--user", self.user, self.name, "/bin/sh", "-c", "kill -KILL -1", timeout=30)

    def _events(self) -> dict[str, int]:
        return self._cgroup.events() if self._cgroup is not None else {}

    def close(self) -> None:
        """Removes the container and releases the uid slot; the workspace is left as it is."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        elif getattr(self, "identity", None) is not None:
            self.identity.release()  # type: ignore[union-attr]


@dataclass
class _Container:
    """The running container: its name and a pidfd of its init (empty until started, and once stopped)."""

    name: str = ""
    init: list[int] = field(default_factory=list)


def _stop(box: _Container) -> None:
    """SIGKILL to the container's init: the kernel ends every process of its pid namespace at once, and podman
    (`--rm`) removes the container in the background (a second or so; the sweep catches what it misses).
    Without a pidfd, `podman rm --force` waits for it."""
    if not box.name:
        return
    try:
        if box.init:
            signal.pidfd_send_signal(box.init[0], signal.SIGKILL)
        else:
            _podman("rm", "--force", "--time", "0", box.name, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        with contextlib.suppress(subprocess.TimeoutExpired):
            _podman("rm", "--force", "--time", "0", box.name, timeout=60)
    finally:
        for fd in box.init:
            os.close(fd)
        box.init.clear()


def _remove(box: _Container, ident: identity.HostIdentity | None, closers: list[Callable[[], None]]) -> None:
    try:
        _stop(box)
    finally:
        for close in closers:
            with contextlib.suppress(Exception):
                close()
        if ident is not None:
            ident.release()


_swept = threading.Event()


def _sweep_once() -> None:
    """Removes sandbox containers whose creating process is gone (a kill -9'd run), once per process."""
    if _swept.is_set():
        return
    _swept.set()
    listed = _podman(
        "ps",
        "-a",
        "--filter",
        f"label={OWNER_LABEL}",
        "--format",
        f'{{{{.Names}}}} {{{{index .Labels "{OWNER_LABEL}"}}}}',
    )
    for line in listed.stdout.splitlines():
        name, _, tag = line.partition(" ")
        parts = tag.split(".")
        if (
            len(parts) == 3
            and all(p.isdigit() for p in parts)
            and leftovers.owner_gone((parts[0], parts[1], parts[2]))
        ):
            logger.info(
                "removing sandbox container %s, left by a harnessrl process that no longer runs", name
            )
            _podman("rm", "--force", "--time", "0", name)


def _classify(
    code: int | None,
    events: dict[str, int],
    stdout: str,
    stderr: str,
    wall: float,
    killed_for_timeout: bool,
    timeout: float,
) -> RunResult:
    if killed_for_timeout:
        return timed_out(events, stdout, stderr, wall, timeout)
    podman_failed = code == PODMAN_FAILED and (SETUP_FAILED in stderr or "\nError: " in "\n" + stderr)
    if code is None or code < 0 or podman_failed:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"podman exec exited {code}"
        return RunResult(Outcome.SANDBOX_ERROR, None, stdout, stderr, wall, f"sandbox failed: {last}", events)
    return exited(code, events, stdout, stderr, wall)
