"""bubblewrap sandbox: the default backend locally and in CI.

    BubblewrapSandbox(workspace: Path, env_dir: Path | None, gateway_socket: Path | None = None, ...)
        .run(cmd, timeout, limits=None, cwd="/workspace") -> RunResult

Inside: a read-only system (/usr, a whitelisted /etc with a synthetic passwd/group, the Python install), the
per-repo venv read-only, the workspace writable at /workspace (persistent across calls), a private /tmp
tmpfs, new user/pid/net/ipc/uts/cgroup namespaces (no network at all), a cleared environment (no host
secrets), uid 1000 "agent" with no capabilities outside its namespace. Optionally one Unix socket (the
gateway) is bound at /run/harnessrl/gateway.sock: the only thing inside that reaches outside.

Never host root: as root, the command chain drops to an unprivileged host uid of this sandbox's own before
bubblewrap starts (identity.py), so the user namespace maps uid 1000 to that uid; the workspace is handed to
it. /proc/sys, /proc/sysrq-trigger, /proc/irq and /proc/bus are read-only, nested user namespaces are off.
bubblewrap's options travel through a memfd (`--args`) and host-specific paths are bound from descriptors
opened here, so no workspace path appears in any argv the sandbox can read (pid 1 is bubblewrap).

Each run is its own process group; on the wall-clock timeout the group is SIGKILLed, and since the sandbox's
pid 1 dies with its parent (`--die-with-parent`) the whole pid namespace goes with it. Memory and process
limits use a per-run cgroup when the host allows (exact, and the OOM/pids events tell us a limit was hit),
else rlimits; CPU time, file size and open files always use rlimits (via util-linux `prlimit`). The
workspace may grow by `Limits.workspace_mb` / `workspace_files` over its size when the sandbox was made;
it is measured while a command runs and the command is killed when it goes over (quota.py).

Over 400 lines: the argv, the run loop and the outcome classification of one backend belong together.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from harnessrl.sandbox import cgroups, identity, leftovers, quota
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
from harnessrl.sandbox.identity import let_group_connect
from harnessrl.sandbox.outcomes import exited, read_capped, timed_out

# /etc entries a shell, git and Python need; everything else in the host's /etc (credentials, pip/apt
# configs with tokens, the host's user list) stays outside.
ETC_WHITELIST = (
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
SANDBOX_UID = 1000  # inside the user namespace; outside it is the caller's uid or identity.py's
PASSWD = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/tmp:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"
GROUP = "root:x:0:\nagent:x:1000:\nnogroup:x:65534:\n"
# Kernel knobs a process in the sandbox must never write, even if its uid somehow allowed it.
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
TOP_LEVEL_SYSTEM = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
GIT_STUB = '#!/bin/sh\necho "git: disabled in this sandbox (strict workspace: no repository history)" >&2\nexit 127\n'
ENV_MANIFEST = "harnessrl-env.json"  # written by envs.ensure_env: extra read-only paths the venv needs

_USERNS_FAILURE = re.compile(
    r"(namespace|uid map|setting up uid).*(Permission denied|Operation not permitted)", re.I
)


MIN_BWRAP_VERSION = (0, 8)  # --disable-userns, --bind-fd / --ro-bind-fd


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError("bubblewrap is not installed: `apt-get install bubblewrap` (or `make sysdeps`)")
    version = _bwrap_version(path)
    if version < MIN_BWRAP_VERSION:
        raise SandboxError(
            f"{path} is bubblewrap {'.'.join(map(str, version))}; harnessrl needs >= "
            f"{'.'.join(map(str, MIN_BWRAP_VERSION))} (--disable-userns, --bind-fd)"
        )
    return path


_versions: dict[str, tuple[int, ...]] = {}


def _bwrap_version(path: str) -> tuple[int, ...]:
    if path not in _versions:
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
        _versions[path] = tuple(int(g) for g in m.groups() if g is not None) if m else (0,)
    return _versions[path]


class BubblewrapSandbox(AgentSandbox):
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
        self.read_only_binds: list[tuple[Path, str]] = []  # (host path, path inside): bind_read_only
        self._stub_dir: Path | None = None
        self._stage_dir: Path | None = None
        self._closed = False
        leftovers.sweep_once([cgroups.factory().sweep_stale])
        self.identity = identity.acquire()
        # closes what the sandbox holds (uid slot, temp dirs, a gateway forwarder) even if the caller never
        # calls close()
        self._temp_dirs: list[Path] = []
        self._closers: list[Callable[[], None]] = []
        self._finalizer = weakref.finalize(self, _release, self._temp_dirs, self.identity, self._closers)
        try:
            if self.gateway_socket is not None and self.identity is not None:
                let_group_connect(self.gateway_socket, self.identity.gid)
            # everything in the workspace now goes to the sandbox uid; files the harness writes later are
            # handed over as it writes them (harness/runtime.py)
            self.baseline = self.last_usage = quota.measure(self.workspace, owner=self.owner)
        except BaseException:
            self.close()
            raise

    @property
    def owner(self) -> tuple[int, int] | None:
        """The host uid/gid sandboxed processes run as, when it is not ours (we are root)."""
        return (self.identity.uid, self.identity.gid) if self.identity is not None else None

    def workspace_quota(self, limits: Limits | None = None) -> quota.Quota:
        return quota.Quota.growth(self.baseline, limits or self.default_limits)

    # -- what a harness that runs inside adds -----------------------------------------------------------
    def connect_gateway(self, url: str) -> str:
        """Makes the gateway at `url` (http://host:port/...) reachable from later runs through one Unix socket
        at GATEWAY_SOCKET_MOUNT (`$HARNESSRL_GATEWAY_SOCKET`), forwarded to it by this sandbox
        (forward.UnixForwarder) until it closes; the only way out. Returns the path inside."""
        from harnessrl.sandbox.forward import forwarder_for

        if self.gateway_socket is not None:
            raise SandboxError(f"this sandbox already has a gateway socket ({self.gateway_socket})")
        gid = self.identity.gid if self.identity is not None else None
        self.gateway_socket = forwarder_for(url, self._closers, gid)
        return GATEWAY_SOCKET_MOUNT

    def bind_read_only(self, host: Path, inside: str) -> None:
        """Binds `host` (a file or directory, e.g. a CLI's prefix) read-only at `inside` for later runs."""
        self.read_only_binds.append((checked_bind(host, inside), inside))

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
            self._stub_dir = leftovers.make_tempdir("gitstub")
            self._temp_dirs.append(self._stub_dir)
            stub = self._stub_dir / "git"
            stub.write_text(GIT_STUB)
            stub.chmod(0o755)
        return self._stub_dir / "git"

    def host_binds(self) -> list[tuple[str, Path, str]]:
        """(`--bind` | `--ro-bind`, host path, path inside) for everything specific to this host and task."""
        binds = [("--ro-bind", p, str(p)) for p in self._ro_paths()]
        binds.append(("--ro-bind" if self.read_only_workspace else "--bind", self.workspace, WORKSPACE_MOUNT))
        if self.git_stub:
            stub = self._git_stub_file()
            binds += [("--ro-bind", stub, "/run/harnessrl/bin/git"), ("--ro-bind", stub, "/usr/bin/git")]
        if self.gateway_socket is not None:
            binds.append(("--bind", self.gateway_socket, GATEWAY_SOCKET_MOUNT))
        binds += [("--ro-bind", host, inside) for host, inside in self.read_only_binds]
        return binds

    def _staging(self) -> dict[Path, Path]:
        """Root only: host path -> a mount point under a dir the sandbox uid can traverse.

        bubblewrap, started as the unprivileged sandbox uid, can bind only paths that uid can reach, and
        the env, the Python install or the workspace often sit below 0700 directories (/root, mkdtemp). Each
        run first bind-mounts them onto these mount points in a private mount namespace of its own
        (`unshare --mount`, as root), so nothing changes on the host and nothing outlives the run.
        """
        if self._stage_dir is None:
            self._stage_dir = leftovers.make_tempdir("stage")
            self._temp_dirs.append(self._stage_dir)
            self._stage_dir.chmod(0o711)
        staged: dict[Path, Path] = {}
        # the kind is in a point's name: a bind added later never reuses a point made for another kind
        for _, host, _ in self.host_binds():
            if host not in staged:
                point = self._stage_dir / f"{len(staged)}{'d' if host.is_dir() else 'f'}"
                if not point.exists():
                    point.mkdir(mode=0o755) if host.is_dir() else point.touch(mode=0o644)
                staged[host] = point
        return staged

    def bwrap_options(
        self,
        limits: Limits,
        cwd: str,
        fds: dict[str, int],
        sources: dict[Path, Path],
        extra_env: dict[str, str] | None = None,
    ) -> list[str]:
        """bubblewrap's options: `fds` holds the descriptors of "status", "passwd" and "group" in the child,
        `sources` where each host bind is mounted from (itself, or its staging mount point), `extra_env` the
        variables of this run on top of the sandbox's."""
        a = [
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--json-status-fd",
            str(fds["status"]),
        ]
        # /tmp, /dev and /proc first: a bind below /tmp (an env or socket the host keeps there) must land on top
        # of the private tmpfs, not under it.
        a += ["--dev", "/dev", "--proc", "/proc"]
        for p in PROC_READ_ONLY:
            a += ["--ro-bind-try", p, p]
        a += ["--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
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
        a += ["--ro-bind-data", str(fds["passwd"]), "/etc/passwd"]
        a += ["--ro-bind-data", str(fds["group"]), "/etc/group"]
        for option, host, inside in self.host_binds():
            a += [option, str(sources[host]), inside]
        env = {"PATH": self._path_env(), **AGENT_ENV}
        if self.env_dir is not None:
            env["VIRTUAL_ENV"] = str(self.env_dir)
        if self.gateway_socket is not None:
            env["HARNESSRL_GATEWAY_SOCKET"] = GATEWAY_SOCKET_MOUNT
        env.update(self.extra_env)
        env.update(extra_env or {})
        a += ["--clearenv"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        a += ["--chdir", cwd]
        return a

    def command_chain(
        self, argv: list[str], limits: Limits, cwd: str, status_w: int, env: dict[str, str] | None = None
    ) -> tuple[list[str], list[int]]:
        """The full argv to start (after rlimits and a cgroup join) and the descriptors it must inherit; the
        caller closes the descriptors after the start. bubblewrap's own options travel in a memfd
        (`--args`), so the sandbox sees none of them in /proc/1/cmdline."""
        if self._closed:
            raise SandboxError("this sandbox is closed")
        if os.geteuid() == 0 and self.identity is None:  # never start bubblewrap as root
            raise SandboxError("running as root without a sandbox uid")
        staged = self._staging() if self.identity is not None else {}
        sources = {host: staged.get(host, host) for _, host, _ in self.host_binds()}
        opened: list[int] = []
        try:
            fds = {"status": status_w}
            for name, text in (("passwd", PASSWD), ("group", GROUP)):
                fds[name] = _memfd(name, text.encode())
                opened.append(fds[name])
            fds["args"] = _memfd(
                "args",
                b"".join(o.encode() + b"\0" for o in self.bwrap_options(limits, cwd, fds, sources, env)),
            )
            opened.append(fds["args"])
        except BaseException:
            for fd in opened:
                os.close(fd)
            raise
        bwrap = [self.bwrap, "--args", str(fds["args"]), "--", *argv]
        setpriv = _tool("setpriv")
        # --pdeathsig: bubblewrap dies with the thread that started it, even if this process is SIGKILLed
        if self.identity is None:
            return [setpriv, "--pdeathsig", "KILL", "--", *bwrap], [status_w, *opened]
        mounts = [str(p) for host, point in staged.items() for p in (host, point)]
        chain = [
            _tool("unshare"),
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            _STAGE_AND_DROP,
            "sh",
            *mounts,
            "--",
            setpriv,
            "--pdeathsig",
            "KILL",
            *self.identity.setpriv_args(),
            "--",
            *bwrap,
        ]
        return chain, [status_w, *opened]

    # -- run --------------------------------------------------------------------------------------------
    def run(
        self,
        cmd: list[str] | str,
        timeout: float,
        limits: Limits | None = None,
        cwd: str = WORKSPACE_MOUNT,
        env: dict[str, str] | None = None,
    ) -> RunResult:
        """`env`: variables for this run only, on top of the sandbox's (a harness's settings and key)."""
        limits = limits or self.default_limits
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        # A workspace already over its quota may still run commands (to delete files), but not grow.
        allowed = self.workspace_quota(limits).relaxed_to(self.last_usage)
        factory = cgroups.factory()
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
            # RLIMIT_NPROC counts every process of the uid: a sandbox uid of our own holds only this run's
            others = 0 if self.identity is not None else _user_process_count()
            prlimit.append(f"--nproc={others + limits.processes + 8}")
        prlimit.append("--")
        status_r, status_w = os.pipe()
        os.set_blocking(status_r, False)
        tmpdir = leftovers.make_tempdir("run")
        started = time.monotonic()
        stopped_for = ""  # "timeout" | a quota violation
        try:
            chain, pass_fds = self.command_chain(argv, limits, cwd, status_w, env)
            full = [*prlimit, *chain]
            if cgroup is not None:
                join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 121; shift; done; shift; exec "$@"'
                full = ["/bin/sh", "-c", join, "sh", *map(str, cgroup.procs_files), "--", *full]
            try:
                with open(tmpdir / "out", "wb") as out, open(tmpdir / "err", "wb") as err:
                    try:
                        proc = subprocess.Popen(
                            full,
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=err,
                            pass_fds=pass_fds,
                            start_new_session=True,
                            env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
                        )
                    except OSError as e:
                        return RunResult(
                            Outcome.SANDBOX_ERROR, None, "", "", 0.0, f"could not start bwrap: {e}"
                        )
            finally:
                for fd in pass_fds:
                    os.close(fd)
                status_w = -1
            stopped_for = quota.wait_watching(proc, timeout, self.workspace, allowed)
            if stopped_for:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                if cgroup is not None:
                    cgroup.kill_all()
                proc.wait()
            wall = time.monotonic() - started
            status = _read_status(status_r)
            events = cgroup.events() if cgroup is not None else {}
            stdout = read_capped(tmpdir / "out")
            stderr = read_capped(tmpdir / "err")
        except OSError as e:  # a bind source vanished, no memfd, ...: the sandbox could not be set up
            return RunResult(
                Outcome.SANDBOX_ERROR, None, "", "", time.monotonic() - started, f"sandbox setup: {e}"
            )
        finally:
            if status_w != -1:
                os.close(status_w)
            os.close(status_r)
            if cgroup is not None:
                cgroup.remove()
            shutil.rmtree(tmpdir, ignore_errors=True)
        usage = quota.measure(self.workspace, stop_at=allowed)  # growth since the last poll
        violation = allowed.violation(usage)
        self.last_usage = quota.measure(self.workspace) if violation else usage  # the next run starts here
        stopped_for = stopped_for or violation
        if stopped_for and stopped_for != "timeout":
            return RunResult(Outcome.RESOURCE_LIMIT, None, stdout, stderr, wall, stopped_for, events)
        return _classify(
            proc.returncode,
            status,
            events,
            stdout,
            stderr,
            wall,
            stopped_for == "timeout",
            timeout,
            cgroup is not None,
        )

    def close(self) -> None:
        """Releases the uid slot and temp dirs; the sandbox cannot run anything afterwards."""
        self._closed = True
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        elif getattr(self, "identity", None) is not None:  # __init__ failed before the finalizer existed
            self.identity.release()  # type: ignore[union-attr]


# As root: bind each host path onto its staging mount point (private mount namespace), then drop privileges.
_STAGE_AND_DROP = (
    'while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 122; shift 2; done; shift; exec "$@"'
)


def _tool(name: str) -> str:
    path = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxError(f"`{name}` (util-linux) is not installed: `apt-get install util-linux`")
    return path


def _release(
    temp_dirs: list[Path], ident: identity.HostIdentity | None, closers: list[Callable[[], None]]
) -> None:
    for close in closers:
        with contextlib.suppress(Exception):
            close()
    closers.clear()
    for d in temp_dirs:
        shutil.rmtree(d, ignore_errors=True)
    temp_dirs.clear()
    if ident is not None:
        ident.release()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(f"harnessrl-{name}", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def enforcement() -> dict[str, str]:
    """How limits are enforced on this host (for reports and docs)."""
    f = cgroups.factory()
    if f.available():
        return {"memory": f"cgroup v{f.version}", "processes": f"cgroup v{f.version}"}
    processes = "RLIMIT_NPROC (a host uid per sandbox)" if os.geteuid() == 0 else "RLIMIT_NPROC"
    return {"memory": "RLIMIT_AS", "processes": processes}


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


_SETUP_EXIT = {121: "could not join the run's cgroup", 122: "could not stage a bind mount (as root)"}


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
        return timed_out(events, stdout, stderr, wall, timeout)
    if returncode in _SETUP_EXIT and not status:
        return RunResult(Outcome.SANDBOX_ERROR, None, stdout, stderr, wall, _SETUP_EXIT[returncode], events)
    if not exit_codes:
        if started and "bwrap: execvp" in stderr:  # the command itself does not exist: the caller's error
            return RunResult(Outcome.NONZERO, 127, stdout, stderr, wall, "command not found", events)
        last = stderr.strip().splitlines()[-1] if stderr.strip() else f"bwrap exited {returncode}"
        return RunResult(Outcome.SANDBOX_ERROR, None, stdout, stderr, wall, f"sandbox failed: {last}", events)
    return exited(exit_codes[-1], events, stdout, stderr, wall, exact_limits)
