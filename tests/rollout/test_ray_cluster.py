"""LocalRayCluster (harnessrl/rollout/ray_cluster.py) for real: Ray nodes in processes of their own that this
process only connects to. A worker node takes the tasks that ask for its resource and, killed, is lost alone
(Ray marks it dead, the head keeps running tasks); two clusters on one host do not meet (stopping one leaves
the other whole); the Ray executor starts one when RAY_ADDRESS is unset; stopping leaves no process and no
directory behind; each cluster has a token of its own. Ray's node health check is shortened
(RAY_health_check_* in the nodes' environment) so a killed node is marked dead in about a second instead of
~30 s."""

from __future__ import annotations

import os
import time
from itertools import pairwise
from pathlib import Path

import pytest

from harnessrl.rollout.ray_cluster import (
    AUTH_ENV,
    FAST_HEALTH_CHECK,
    NODE_PORT_FLAGS,
    LocalRayCluster,
    RayClusterError,
)

ray = pytest.importorskip("ray")

DEAD_WITHIN_S = 60.0


def _pid() -> int:
    return os.getpid()


def _processes_naming(directory: Path) -> list[int]:
    """Live processes whose command line names `directory` (every Ray process of a node names its temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(directory).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _ports_given(pid: int) -> list[str]:
    """The port numbers of the `--...-port` flags on a `ray start` command line."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return [value for flag, value in pairwise(args) if flag.startswith("--") and flag.endswith("port")]


def _wait_dead_nodes(count: int) -> None:
    deadline = time.monotonic() + DEAD_WITHIN_S
    while sum(not n["Alive"] for n in ray.nodes()) < count:
        assert time.monotonic() < deadline, f"Ray did not mark {count} node(s) dead within {DEAD_WITHIN_S} s"
        time.sleep(0.2)


def test_a_worker_node_takes_its_tasks_and_killed_is_lost_alone(monkeypatch):
    for name in AUTH_ENV:
        monkeypatch.delenv(name, raising=False)
    pid = ray.remote(_pid)
    with LocalRayCluster(num_cpus=1, env=FAST_HEALTH_CHECK) as cluster:
        assert cluster.head is not None
        # its own token, given to its nodes (and to this process while connected)
        assert cluster.token_path.stat().st_mode & 0o777 == 0o600
        head_env = Path(f"/proc/{cluster.head.pid}/environ").read_bytes().split(b"\0")
        assert f"RAY_AUTH_TOKEN_PATH={cluster.token_path}".encode() in head_env
        assert b"RAY_AUTH_MODE=token" in head_env
        cluster.connect()
        assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(cluster.token_path)
        node = cluster.add_node(num_cpus=1, resources={"spare": 1})
        directory = cluster.directory
        assert directory is not None and len(ray.nodes()) == 2
        # every port given to a node is its own (two picks of free ports once handed the head one port twice)
        ports = _ports_given(cluster.head.pid) + _ports_given(node.pid)
        assert len(ports) == 2 + 2 * len(NODE_PORT_FLAGS) and len(set(ports)) == len(ports), ports
        assert ray.get(pid.options(num_cpus=0.5).remote()) in cluster.head.processes()
        assert ray.get(pid.options(num_cpus=0.5, resources={"spare": 1}).remote()) in node.processes()

        node.kill()
        assert not node.alive() and node.processes() == []
        _wait_dead_nodes(1)
        assert (
            cluster.head.alive() and ray.get(pid.options(num_cpus=0.5).remote()) in cluster.head.processes()
        )
        head = cluster.head
    assert (
        not ray.is_initialized()
    )  # stop() disconnected the driver connect() made and put the variables back
    assert not any(name in os.environ for name in AUTH_ENV)
    assert head.processes() == [] and _processes_naming(directory) == [] and not directory.exists()
    with pytest.raises(RayClusterError, match="start the cluster"):
        cluster.add_node()


def test_two_clusters_do_not_meet_and_the_executor_starts_and_stops_its_own(monkeypatch):
    from harnessrl.rollout.executors import RayExecutor

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pid = ray.remote(_pid)
    with LocalRayCluster(num_cpus=1) as other:
        assert other.head is not None and other.directory is not None
        executor = RayExecutor(concurrency=1)
        try:
            mine = executor.connection.cluster
            assert mine is not None and mine.directory is not None and mine.address != other.address
            assert ray.is_initialized() and executor.gateway_host() == "127.0.0.1"
            worker = ray.get(pid.options(num_cpus=0.5).remote())
            assert worker in mine.processes() and worker not in other.processes()
            directory = mine.directory
        finally:
            executor.close()
        assert executor.connection.cluster is None and not ray.is_initialized()
        assert _processes_naming(directory) == [] and not directory.exists()
        assert other.head.alive()  # stopping one cluster left the other running: it still runs a task
        other.connect()
        assert ray.get(pid.options(num_cpus=0.5).remote()) in other.processes()
        other_directory = other.directory
    assert _processes_naming(other_directory) == [] and not other_directory.exists()
