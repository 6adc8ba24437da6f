"""Where the RL loop's rollouts run (`rollout_workers`): threads of the stage's process, or Ray tasks across a
Ray cluster's nodes. Either way a rollout is `workload.run(plan, gateway)`, started by the pool and handed back
as a future; the driver keeps the gateway, and a worker reaches the engines only through its URL.

Ray (`RayRunner`): the cluster of `RAY_ADDRESS`, or a local one it starts (rollout.executors.RayConnection);
the workload goes into Ray's object store once; each rollout is a task of `cpus` CPUs, never retried (a retried
rollout would reuse its gateway session). A task whose worker or node dies ends as the pool's `infra_error`
for that rollout (its reason kept), never a 0, and its group completes with it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from harnessrl.rl.modes import RolloutWorkers
from harnessrl.rl.workloads import Finished, GatewayAccess, RolloutPlan, Workload


class RolloutRunner(Protocol):
    def start(self, plan: RolloutPlan) -> Future[Finished]: ...

    def close(self) -> None: ...


class ThreadRunner:
    """Rollouts on threads of this process (the local engine batches their calls)."""

    def __init__(self, workload: Workload, gateway: GatewayAccess, threads: int) -> None:
        self.workload, self.gateway = workload, gateway
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rollout")

    def start(self, plan: RolloutPlan) -> Future[Finished]:
        return self._executor.submit(self.workload.run, plan, self.gateway)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _run(workload: Workload, plan: RolloutPlan, gateway: GatewayAccess) -> Finished:
    return workload.run(plan, gateway)


class RayRunner:
    """Rollouts as Ray tasks of `cpus` CPUs each, anywhere in the cluster."""

    def __init__(self, workload: Workload, gateway: GatewayAccess, cpus: float = 0.5) -> None:
        from harnessrl.rollout.executors import RayConnection

        self.connection = RayConnection()
        ray = self.connection.ray
        try:
            self._workload = ray.put(workload)
            self._task = ray.remote(_run).options(num_cpus=cpus, max_retries=0, name="rl-rollout")
        except BaseException:
            self.connection.close()
            raise
        self.gateway = gateway

    def start(self, plan: RolloutPlan) -> Future[Finished]:
        return self._task.remote(self._workload, plan, self.gateway).future()

    def close(self) -> None:
        self.connection.close()


def gateway_host(workers: RolloutWorkers) -> str:
    """Where the gateway listens so that the rollout workers reach it."""
    if workers is RolloutWorkers.THREADS:
        return "127.0.0.1"
    from harnessrl.rollout.executors import ray_gateway_host

    return ray_gateway_host()


def make_runner(
    workers: RolloutWorkers, workload: Workload, gateway: GatewayAccess, threads: int
) -> RolloutRunner:
    if workers is RolloutWorkers.RAY:
        return RayRunner(workload, gateway)
    return ThreadRunner(workload, gateway, threads)
