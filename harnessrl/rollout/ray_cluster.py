"""A local Ray cluster in processes of its own: `LocalRayCluster`, a head node and any worker nodes on this
machine, each a `ray start --block` process started with a plain Popen.

    with LocalRayCluster(num_cpus=2) as cluster:   # the head node
        cluster.connect()                          # ray.init(address=cluster.address): this process's driver
        node = cluster.add_node(num_cpus=1, resources={"spare": 1})
        ...
        node.kill()                                # a lost machine: every process of that node, at once

Why not `ray.init()` without an address: it starts the cluster's processes (GCS, raylet, agents) from the
calling process with a `preexec_fn`, i.e. by fork() of a process that may hold a model and an engine, which the
kernel refuses once its private memory exceeds RAM (harnessrl/processes.py). Connecting starts no process.

What it owns and the invariants it keeps:
- Each node has its own `--temp-dir` under the cluster's directory (sessions, sockets and logs never meet
  another node's, nor those of another Ray on this host) and its own ports (GCS, agents, metrics, client
  server; free ones picked at start), so a second cluster or a system-wide Ray does not collide with it.
- Each node is a session of its own (start_new_session): every process it starts (GCS, raylet, agents,
  workers) keeps that session id, which is how `stop()` and `RayNode.kill()` find all of them and nothing
  else. `ray stop` is never used: it ends every Ray on the host.
- A node is ready when `ray start` has written `ray_current_cluster` into its temp dir, which it does once
  its node is registered with the GCS; one that exits or is not ready within `start_timeout_s` raises
  `RayClusterError` with the tail of its output.
- Token authentication, with a token of its own: a file in the cluster's directory that its nodes read
  (`RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN_PATH`), as this process does while `connect()` holds it connected
  (the variables it replaced are put back at `stop()`). Ray binds beyond loopback: without the token nothing
  can use the cluster. `~/.ray/auth_token` is neither read nor written.
- A node gets SIGTERM when the thread that started it exits (processes.die_with_parent; `ray start` then stops
  what it started, which Ray fate-shares with it): start the cluster from a thread that lives as long as it.
- `stop()` disconnects the driver if `connect()` connected it, stops the worker nodes, then the head (SIGTERM
  to `ray start`, SIGKILL to whatever is left of its session after `stop_timeout_s`), waits until no process
  of any node is left, and removes the cluster's directory.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from harnessrl.processes import die_with_parent, free_ports

logger = logging.getLogger(__name__)

ADDRESS_FILE = "ray_current_cluster"  # what `ray start` writes into its temp dir once its node is registered
DEFAULT_START_TIMEOUT_S = 180.0
DEFAULT_STOP_TIMEOUT_S = 30.0
OUTPUT_TAIL_LINES = 30
SWEEP_TIMEOUT_S = 10.0
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")  # where Ray reads its token from
# every port a node listens on that Ray would otherwise take from a fixed default (52365, ...) or pick itself
NODE_PORT_FLAGS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


# A killed node is marked dead in about a second instead of ~30 s (the `env` of a cluster whose node losses are
# staged: tests, benchmarks/multinode.py); a real cluster keeps Ray's defaults.
FAST_HEALTH_CHECK = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "2",
}


class RayClusterError(RuntimeError):
    """A node did not start (exited, or not ready in time); the message ends with the tail of its output."""


def session_processes(session: int) -> list[int]:
    """The live (not zombie) processes whose session id is `session`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != b"Z":  # fields after the name: state ppid pgrp session
            pids.append(int(entry))
    return pids


class RayNode:
    """One `ray start --block` process and everything it started (its session); made by LocalRayCluster."""

    def __init__(self, name: str, args: list[str], directory: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.directory = directory  # the node's --temp-dir; `output.log` holds what `ray start` prints
        directory.mkdir(parents=True)
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
        command += ["--temp-dir", str(directory), *args]
        with open(self.output_path, "ab") as out:
            self.process = subprocess.Popen(
                die_with_parent(command, env),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the session: every process of this node, found by its id
            )
        self.pid = self.process.pid

    @property
    def output_path(self) -> Path:
        return self.directory / "output.log"

    def wait_ready(self, timeout_s: float) -> str:
        """The GCS address `ray start` wrote once the node was registered; raises RayClusterError."""
        deadline = time.monotonic() + timeout_s
        address_file = self.directory / ADDRESS_FILE
        while True:
            if address_file.is_file():
                address = address_file.read_text().strip()
                if address:
                    return address
            code = self.process.poll()
            if code is not None:
                raise RayClusterError(
                    f"Ray {self.name} exited with code {code} before it was ready:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise RayClusterError(
                    f"Ray {self.name} was not ready within {timeout_s:.0f} s:\n{self.tail()}"
                )
            time.sleep(0.2)

    def tail(self, lines: int = OUTPUT_TAIL_LINES) -> str:
        try:
            text = self.output_path.read_text(errors="replace")
        except OSError as e:
            return f"(no output: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def processes(self) -> list[int]:
        """This node's live processes (`ray start`, and the GCS, raylet, agents and workers it started)."""
        return session_processes(self.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to all its processes at once, as when its machine is lost; waits until they are gone."""
        self._sweep()

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """SIGTERM to `ray start` (it stops what it started), then SIGKILL to whatever of the node is left."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "Ray %s did not stop within %.0f s of SIGTERM: killing it", self.name, timeout_s
                )
        self._sweep()

    def _sweep(self) -> None:
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        while True:
            left = self.processes()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if self.process.poll() is None:  # our child: reaped here, so it is no zombie of ours
                self.process.wait()
            if not left:
                return
            if time.monotonic() > deadline:
                raise RayClusterError(f"Ray {self.name}: processes {left} outlived SIGKILL")
            time.sleep(0.05)


class LocalRayCluster:
    """A head node (`num_cpus`, `resources`; None: Ray's defaults) started by `start()` or `with`, worker nodes
    by `add_node`. `env`: more environment for every node (e.g. Ray's `RAY_<setting>` variables). The
    cluster's directory is made under `root` (default: the system temp dir, kept short: Ray's socket paths
    live under it)."""

    def __init__(
        self,
        num_cpus: float | None = None,
        *,
        resources: Mapping[str, float] | None = None,
        object_store_bytes: int | None = None,
        env: Mapping[str, str] | None = None,
        root: str | Path | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        self.num_cpus = num_cpus
        self.resources = dict(resources or {})
        self.object_store_bytes = object_store_bytes
        self.env = dict(env or {})
        self.root = root
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.directory: Path | None = None
        self.nodes: list[RayNode] = []  # the head first
        self.address = ""  # the GCS address (host:port), once started
        # this process's auth variables before connect() set the cluster's (None: not connected)
        self._driver_auth: dict[str, str | None] | None = None

    @property
    def head(self) -> RayNode | None:
        return self.nodes[0] if self.nodes else None

    @property
    def token_path(self) -> Path:
        assert self.directory is not None, "the cluster is not started"
        return self.directory / "auth_token"

    def auth_env(self) -> dict[str, str]:
        """The variables a Ray process needs to use this cluster (its token)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def start(self) -> str:
        """Starts the head node and waits until it is ready; returns the address to `ray.init` with."""
        if self.nodes:
            return self.address
        self.directory = Path(tempfile.mkdtemp(prefix="hrl-ray-", dir=self.root))
        descriptor = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as token:
            token.write(secrets.token_hex(32))
        # all of the head's ports in one pick: ports of two picks can repeat (each pick's sockets close at its end)
        port, client_port, *node_ports = free_ports(2 + len(NODE_PORT_FLAGS))
        args = ["--head", "--port", str(port), "--ray-client-server-port", str(client_port)]
        args += ["--include-dashboard", "false"]
        try:
            head = self._start_node(args, node_ports, self.num_cpus, self.resources, self.object_store_bytes)
            self.address = head.wait_ready(self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        logger.info("local Ray cluster at %s (%s)", self.address, self.directory)
        return self.address

    def add_node(
        self,
        num_cpus: float | None = None,
        *,
        resources: Mapping[str, float] | None = None,
        object_store_bytes: int | None = None,
    ) -> RayNode:
        """Starts a worker node joined to the head and waits until it is registered."""
        if not self.address:
            raise RayClusterError("start the cluster before adding nodes to it")
        node_ports = free_ports(len(NODE_PORT_FLAGS))
        node = self._start_node(
            ["--address", self.address], node_ports, num_cpus, resources or {}, object_store_bytes
        )
        try:
            node.wait_ready(self.start_timeout_s)
        except BaseException:
            node.kill()
            self.nodes.remove(node)
            raise
        return node

    def _start_node(
        self,
        args: list[str],
        node_ports: list[int],
        num_cpus: float | None,
        resources: Mapping[str, float],
        object_store_bytes: int | None,
    ) -> RayNode:
        assert self.directory is not None
        args = [*args, "--disable-usage-stats", "--log-color", "false"]
        for flag, port in zip(NODE_PORT_FLAGS, node_ports, strict=True):
            args += [flag, str(port)]
        if num_cpus is not None:
            args += ["--num-cpus", str(num_cpus)]
        if resources:
            args += ["--resources", json.dumps(dict(resources))]
        if object_store_bytes is not None:
            args += ["--object-store-memory", str(object_store_bytes)]
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", *AUTH_ENV)}
        env.update(self.auth_env())
        env.update(self.env)
        name = "head" if not self.nodes else f"node {len(self.nodes)}"
        node = RayNode(name, args, self.directory / f"n{len(self.nodes)}", env)
        self.nodes.append(node)
        return node

    def connect(self, **init_kwargs: Any) -> None:
        """`ray.init(address=self.address, ...)` in this process, with the cluster's token (no Ray log lines
        copied to this one unless asked); `stop()` shuts that driver down first."""
        import ray

        if self._driver_auth is not None:
            raise RayClusterError("this process is already connected to the cluster")
        self._driver_auth = {k: os.environ.get(k) for k in AUTH_ENV}
        for k in AUTH_ENV:
            os.environ.pop(k, None)
        os.environ.update(self.auth_env())
        _reload_ray_auth()
        options: dict[str, Any] = {"log_to_driver": False, "configure_logging": False, **init_kwargs}
        try:
            ray.init(address=self.address, **options)
        except BaseException:
            self._disconnect()
            raise

    def _disconnect(self) -> None:
        """Shuts down connect()'s driver and puts this process's auth variables back."""
        if self._driver_auth is None:
            return
        import ray

        ray.shutdown()
        for k, v in self._driver_auth.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._driver_auth = None
        _reload_ray_auth()

    def processes(self) -> list[int]:
        """Every live process of every node."""
        return [pid for node in self.nodes for pid in node.processes()]

    def stop(self) -> None:
        """Disconnects `connect()`'s driver, stops every node (workers first) and removes the directory."""
        self._disconnect()
        errors: list[RayClusterError] = []
        for node in reversed(self.nodes):
            try:
                node.stop(self.stop_timeout_s)
            except RayClusterError as e:
                errors.append(e)
        self.nodes.clear()
        self.address = ""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        if errors:
            raise errors[0]

    def __enter__(self) -> LocalRayCluster:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def _reload_ray_auth() -> None:
    """Makes this process's Ray read its auth variables again (its config, then its token cache: the order
    Ray's own tests use, so a draining gRPC thread never meets token mode without a token)."""
    # (compiled; its type stub leaves these out)
    from ray._raylet import AuthenticationTokenLoader, Config  # pyright: ignore[reportAttributeAccessIssue]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
