"""The RL loop's rollouts as Ray tasks across a Ray cluster's nodes (harnessrl.rl.runners.RayRunner), for real:
a local cluster of a head that runs nothing and two worker nodes; the pool's groups run there, and a worker node
killed while its rollouts run ends them as infra errors with the reason, never a 0, while the other node's
finish: both groups complete, none short. (The whole loop on Ray: tests/rl/test_ranks.py, with trainer nodes.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harnessrl.rl.collect import JournalTail
from harnessrl.rl.groups import RolloutPool
from harnessrl.rl.runners import RayRunner
from harnessrl.rl.workloads import Finished, GatewayAccess, RolloutPlan
from harnessrl.rollout.ray_cluster import FAST_HEALTH_CHECK, LocalRayCluster
from harnessrl.schema import RolloutStatus

REPO = Path(__file__).resolve().parents[2]


class HeldWorkload:
    """Each rollout says where it runs (a file named by its id and process), then waits for `release`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def task_ids(self) -> list[str]:
        return ["a", "b"]

    def run(self, plan: RolloutPlan, gateway: GatewayAccess) -> Finished:
        (self.directory / f"{plan.rollout_id}.{os.getpid()}").touch()
        while not (self.directory / "release").exists():
            time.sleep(0.05)
        return Finished(plan.rollout_id, plan.group_id, plan.task_id, 1.0, RolloutStatus.OK)


@pytest.mark.slow
def test_a_lost_worker_node_ends_its_rollouts_as_infra_errors_and_every_group_completes(
    tmp_path, monkeypatch
):
    env = {**FAST_HEALTH_CHECK, "PYTHONPATH": str(REPO)}  # the workers import this module's workload
    with LocalRayCluster(num_cpus=0, env=env) as cluster:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.connect()  # this process as the driver (its token read anew), as the RL stage's rank 0 is
        workload = HeldWorkload(tmp_path)
        runner = RayRunner(workload, GatewayAccess("http://127.0.0.1:9", "unused"), cpus=0.5)
        pool = RolloutPool(runner, JournalTail(tmp_path / "journal"), group_size=2, slots=4, seed=0)
        try:
            groups = [pool.start_group(k, task, 0) for k, task in enumerate(workload.task_ids()[:2])]
            deadline = time.monotonic() + 120
            while len(list(tmp_path.glob("*@g*__r*.*"))) < 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            started = {
                p.name.rsplit(".", 1)[0]: int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("*__r*.*")
            }
            assert len(started) == 4, started  # every rollout runs, on the worker nodes (the head has no CPU)
            where = {
                rid: next(i for i, n in enumerate(nodes) if pid in n.processes())
                for rid, pid in started.items()
            }
            assert set(where.values()) == {0, 1}, where  # spread over both nodes
            nodes[0].kill()
            (tmp_path / "release").touch()
            assert pool.wait(lambda: len(pool.ready) == 2, timeout_s=120), pool.counts
            done = {g.group_id: g for g in pool.take_ready()}
        finally:
            pool.close()
    assert sorted(done) == sorted(g.group_id for g in groups)
    for group in done.values():
        assert len(group.rollouts) == 2  # none silently short
        for rollout in group.rollouts:
            if where[rollout.rollout_id] == 0:
                assert rollout.status is RolloutStatus.INFRA_ERROR and rollout.reward is None
                assert rollout.detail, rollout  # the reason Ray gave
            else:
                assert rollout.status is RolloutStatus.OK and rollout.reward == 1.0
