"""Which finished rollouts count and whether a group has signal: the RL loop's driver (which replaces a group
without signal) and the learner's step plan (which trains a group with it) decide alike, row by row.

Each row is one finished group (status and reward per rollout) under one setting, and the decision a reader
can check by hand against harnessrl.schema.scored_statuses and harnessrl.train.data.has_signal."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.rl.collect import JournalTail
from harnessrl.rl.config import RLConfig
from harnessrl.rl.drivers import StepBatch, SyncDriver
from harnessrl.rl.groups import Group, LoopState, RolloutPool
from harnessrl.rl.runners import ThreadRunner
from harnessrl.rl.workloads import Finished, GatewayAccess, PromptWorkload
from harnessrl.schema import RolloutStatus, Sample
from harnessrl.train.plan import plan_round
from tests.rl.support import write_prompt_tasks

OK, TIMEOUT, INFRA = RolloutStatus.OK, RolloutStatus.TIMEOUT, RolloutStatus.INFRA_ERROR
FAILED, TOO_LARGE = RolloutStatus.FAILED, RolloutStatus.PATCH_TOO_LARGE
MASK = {"nonok": "mask"}

SIGNAL_TABLE = [
    pytest.param({}, [(OK, 1.0), (OK, 0.0), (OK, 0.0), (OK, 0.0)], True, id="ok-rewards-differ"),
    pytest.param({}, [(OK, 1.0)] * 4, False, id="ok-rewards-equal"),
    # drop (the default): a timed-out rollout leaves the group, its verdict with it
    pytest.param({}, [(OK, 0.0), (OK, 0.0), (TIMEOUT, 1.0), (TIMEOUT, 0.0)], False, id="drop-timeouts"),
    pytest.param({}, [(OK, 1.0), (OK, None), (OK, 1.0), (OK, 1.0)], False, id="no-reward-left-out"),
    # patch_too_large is the agent's doing: scored (0), never dropped as a failure
    pytest.param({}, [(OK, 1.0), (OK, 1.0), (TOO_LARGE, 0.0), (TOO_LARGE, 0.0)], True, id="too-large-scored"),
    # mask: a timeout stays in the baseline as a failed attempt, so the ok rollouts' 1s are above the mean
    pytest.param(MASK, [(OK, 1.0), (OK, 1.0), (OK, 1.0), (TIMEOUT, None)], True, id="mask-timeout-is-a-0"),
    pytest.param(MASK, [(OK, 1.0), (OK, 1.0), (FAILED, 0.0), (OK, 1.0)], True, id="mask-failed-graded-0"),
    # an infrastructure failure is never the agent's 0, not even in the baseline under mask
    pytest.param(MASK, [(OK, 1.0), (OK, 1.0), (OK, 1.0), (INFRA, None)], False, id="mask-infra-never-a-0"),
    # rewards that differ only among rollouts that do not train give no trained rollout an advantage
    pytest.param(MASK, [(TIMEOUT, 1.0), (TIMEOUT, 0.0), (INFRA, None), (INFRA, None)], False, id="mask-none-trains"),
    # ok_statuses adds statuses to the scored ones; ok itself always stays scored
    pytest.param(
        {"ok_statuses": ["timeout"]}, [(OK, 1.0), (OK, 0.0), (TIMEOUT, 0.0), (TIMEOUT, 0.0)], True, id="ok-kept-with-extra"
    ),
    pytest.param(
        {"ok_statuses": ["timeout"]}, [(OK, 0.0), (OK, 0.0), (TIMEOUT, 1.0), (INFRA, None)], True, id="timeout-scored"
    ),
    pytest.param({}, [(OK, 1.0), (INFRA, None), (INFRA, None), (INFRA, None)], False, id="singleton-left"),
]  # fmt: skip


def _group(outcomes: list[tuple[RolloutStatus, float | None]]) -> Group:
    group = Group("say-and@g0", "say-and", 0, 0, 0.0)
    for k, (status, reward) in enumerate(outcomes):
        rid = f"say-and@g0__r{k}"
        group.rollouts.append(Finished(rid, group.group_id, "say-and", reward, status))
        group.samples.append(
            Sample(f"{rid}-s", rid, group.group_id, [1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0], [-1, 0, 0])
        )
    return group


def _loop_keeps(cfg: RLConfig, group: Group, tmp_path: Path) -> bool:
    """The driver's own classification of one finished group: kept for the step, or replaced."""
    workload = PromptWorkload(write_prompt_tasks(tmp_path / "tasks.jsonl"))
    # nothing is started: the group is handed in finished
    runner = ThreadRunner(workload, GatewayAccess("http://127.0.0.1:9", "unused"), threads=1)
    pool = RolloutPool(
        runner,
        JournalTail(tmp_path / "journal"),
        group_size=cfg.group_size,
        slots=cfg.group_size,
        seed=cfg.seed,
    )
    try:
        state = LoopState.from_meta(
            workload.task_ids(), cfg.seed, cfg.history_last_k, cfg.pass_threshold, None
        )
        driver = SyncDriver(cfg, pool, state)
        pool.ready.append(group)
        driver._classify(StepBatch([]))
        return [g.group_id for g in driver.buffer] == [group.group_id]
    finally:
        pool.close()


def _learner_trains(cfg: RLConfig, group: Group) -> bool:
    """What the learner's step (Learner.train) trains of the group: its step plan's groups."""
    prepared = cfg.prepare(group.samples, group.reward_rows())
    return [g for step in plan_round(prepared, cfg).steps for g in step] == [group.group_id]


@pytest.mark.parametrize(("config", "outcomes", "signal"), SIGNAL_TABLE)
def test_the_loop_and_the_learner_agree_on_group_signal(config, outcomes, signal, tmp_path):
    cfg = RLConfig.from_dict(config)
    group = _group(outcomes)
    assert (_loop_keeps(cfg, group, tmp_path), _learner_trains(cfg, group)) == (signal, signal)
