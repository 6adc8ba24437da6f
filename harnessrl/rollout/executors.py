"""Where rollouts run: a bounded thread pool in this process (`threads`, the default) or Ray tasks (`ray`).

Both take the same jobs and yield `RolloutOutcome`s; the caller writes them into the same output files.
A job that dies without returning (a crashed Ray worker, an exception escaping the rollout function) becomes
an `infra_error` row with `finish_reason` `worker_crashed` and the reason — never a silent reward 0.

Ray: `ray.init(address=RAY_ADDRESS)`: the KubeRay cluster (`ray://harnessrl-ray-head-svc.harnessrl:10001`,
manifests/base/raycluster.yaml) when set; when unset, a local Ray cluster this executor starts in processes
of its own (ray_cluster.LocalRayCluster: `ray.init()` would fork it from this big process) and stops at
close. At most `concurrency` rollouts are in flight (submission window), each asking Ray for `ray_cpus`
CPUs; tasks are never retried (a retried rollout would reuse its gateway session id). Workers reach the
engine only through the gateway's URL, which the driver keeps serving.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from harnessrl.harness.base import EpisodeEnd
from harnessrl.rollout.episode import RolloutContext, RolloutOutcome, RolloutRow
from harnessrl.rollout.ray_cluster import LocalRayCluster
from harnessrl.schema import RolloutStatus

if TYPE_CHECKING:
    from harnessrl.rollout.specs import NamedSpec

    RolloutFn = Callable[[RolloutContext, RolloutRow, NamedSpec, dict, int], RolloutOutcome]

logger = logging.getLogger(__name__)


class ExecutorName(StrEnum):
    THREADS = "threads"
    RAY = "ray"


@dataclass
class RolloutJob:
    row: RolloutRow  # the plan's row, returned with the reason if the worker dies
    spec: NamedSpec
    task: dict
    seed: int


def crashed_outcome(job: RolloutJob, reason: str) -> RolloutOutcome:
    row = job.row
    row.rollout_status, row.finish_reason, row.error = (
        RolloutStatus.INFRA_ERROR,
        EpisodeEnd.WORKER_CRASHED,
        reason[:2000],
    )
    logger.warning("rollout %s: worker crashed: %s", row.rollout_id, reason.splitlines()[0] if reason else "")
    return RolloutOutcome(row, {f"{row.rollout_id}.traceback.txt": reason})


class ThreadExecutor:
    """`concurrency` rollouts at once in threads of this process (the local engine batches their calls)."""

    name = ExecutorName.THREADS

    def __init__(self, concurrency: int):
        self.concurrency = concurrency

    def gateway_host(self) -> str:
        return "127.0.0.1"

    def run(self, jobs: list[RolloutJob], fn: RolloutFn, ctx: RolloutContext) -> Iterator[RolloutOutcome]:
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="rollout") as pool:
            futures = {pool.submit(fn, ctx, j.row, j.spec, j.task, j.seed): j for j in jobs}
            for fut in as_completed(futures):
                try:
                    yield fut.result()
                except Exception as e:  # run_rollout catches its own errors; this is a bug, kept per rollout
                    yield crashed_outcome(futures[fut], f"{type(e).__name__}: {e}")

    def close(self) -> None:
        pass


class RayConnection:
    """This process as a Ray driver: of the cluster at `RAY_ADDRESS`, or of a local cluster it starts (and
    stops at `close`); nothing when Ray is already initialized here."""

    def __init__(self) -> None:
        import ray

        self.ray = ray
        self.address = os.environ.get("RAY_ADDRESS") or None
        self._owns_ray = not ray.is_initialized()
        self.cluster: LocalRayCluster | None = None  # the local cluster it started, stopped at close
        if not self._owns_ray:
            return
        try:
            if self.address is None:
                self.cluster = LocalRayCluster()
                self.cluster.start()
                self.cluster.connect()
            else:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.cluster is not None:  # disconnects this process, then stops the cluster
            self.cluster.stop()
            self.cluster = None
        elif self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False


class RayExecutor:
    """Rollouts as Ray tasks, at most `concurrency` in flight, `ray_cpus` CPUs each."""

    name = ExecutorName.RAY

    def __init__(self, concurrency: int, ray_cpus: float = 0.5):
        self.connection = RayConnection()
        self.ray = self.connection.ray
        self.address = self.connection.address
        self.concurrency = concurrency
        self.ray_cpus = ray_cpus

    def gateway_host(self) -> str:
        return ray_gateway_host()

    def run(self, jobs: list[RolloutJob], fn: RolloutFn, ctx: RolloutContext) -> Iterator[RolloutOutcome]:
        from ray.exceptions import RayError

        ray = self.ray
        remote = ray.remote(fn).options(num_cpus=self.ray_cpus, max_retries=0, name="rollout")
        pending = list(reversed(jobs))
        in_flight: dict[Any, RolloutJob] = {}
        while pending or in_flight:
            while pending and len(in_flight) < self.concurrency:
                job = pending.pop()
                in_flight[remote.remote(ctx, job.row, job.spec, job.task, job.seed)] = job
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                job = in_flight.pop(ref)
                try:
                    yield ray.get(ref)
                except RayError as e:  # worker died (OOM kill, segfault, node lost, ...)
                    yield crashed_outcome(job, f"{type(e).__name__}: {_first_lines(str(e))}")

    def close(self) -> None:
        self.connection.close()


def make_executor(name: str, concurrency: int, ray_cpus: float = 0.5) -> ThreadExecutor | RayExecutor:
    if name not in set(ExecutorName):
        raise ValueError(f"executor must be one of {[e.value for e in ExecutorName]}, got {name!r}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if name == ExecutorName.RAY:
        if ray_cpus < 0:
            raise ValueError(f"ray_cpus must be >= 0, got {ray_cpus}")
        return RayExecutor(concurrency, ray_cpus)
    return ThreadExecutor(concurrency)


def ray_gateway_host() -> str:
    """Where a gateway listens for Ray workers: loopback for a local Ray (no `RAY_ADDRESS`); on a cluster an
    address the worker pods reach (`HARNESSRL_GATEWAY_HOST`, or this pod's IP towards the Ray cluster)."""
    if not os.environ.get("RAY_ADDRESS"):
        return "127.0.0.1"
    return os.environ.get("HARNESSRL_GATEWAY_HOST") or routable_ip()


def _first_lines(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[:n])


def routable_ip() -> str:
    import ray

    try:
        return ray.util.get_node_ip_address()
    except Exception:
        return socket.gethostbyname(socket.gethostname())
