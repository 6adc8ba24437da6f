"""How each mode collects the groups of one optimizer step, and what it does around the step.

- sync: start `batch_groups` groups, wait for all of them, replace the ones without reward variance by new
  groups (a second wave, up to the step's group budget), train, sync weights. Nothing generates while the
  trainer works, and the batch waits for its slowest rollout.
- colocated: a feeder thread keeps rollouts running (bounded by the rollout slots and the staleness
  admission rule); groups stream into a buffer as they complete. When `batch_groups` groups with signal are
  there, the gateway pauses with abort: in-flight generations stop and are parked as partial rollouts (the
  harness's call just takes longer), the trainer steps on the shared CPU, the weights sync, the gateway
  resumes and every parked generation continues from its tokens under the new policy (each token tagged with
  the version that sampled it; TIS on the behaviour log-probs corrects the older ones).
- separate: like colocated, but generation never pauses: the trainer steps while rollouts run, the weights
  load between two decode steps. Staleness is bounded by admission and the per-group stale policy. While the
  trainer would wait for data, `RoleSwitch` decides whether to lend its share to rollouts (here: extra
  rollout slots; on one CPU box no device moves, see docs/rl.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from harnessrl.gateway.enums import PauseMode
from harnessrl.harness.base import RolloutStatus
from harnessrl.rl.admission import StalePolicy, can_admit, keep_group
from harnessrl.rl.config import RLConfig
from harnessrl.rl.groups import Group, RolloutPool
from harnessrl.rl.modes import RLMode
from harnessrl.rl.role_switch import RoleSwitch, expected_wait_s

logger = logging.getLogger(__name__)


@dataclass
class StepCounts:
    groups_zero_variance: int = 0
    groups_stale_dropped: int = 0
    rewards_all: list[float] = field(default_factory=list)  # every rewarded rollout that finished
    tokens_generated: int = 0
    wait_s: float = 0.0  # trainer waiting for data
    pause_s: float = 0.0  # colocated: pause + abort round trip
    lent_s: float = 0.0
    role_switches: int = 0
    discarded: list[str] = field(default_factory=list)  # groups without signal, or too stale

    def as_dict(self) -> dict[str, float | int | list[str] | None]:
        r = self.rewards_all
        return {
            "groups_zero_variance": self.groups_zero_variance,
            "groups_stale_dropped": self.groups_stale_dropped,
            "reward_all_mean": sum(r) / len(r) if r else None,
            "rollouts_finished": len(r),
            "tokens_generated": self.tokens_generated,
            "wait_s": self.wait_s,
            "pause_s": self.pause_s,
            "lent_s": self.lent_s,
            "role_switches": self.role_switches,
            "groups_discarded": self.discarded,
        }


class Driver:
    """Collects step batches from the pool for one mode; `version` is the trainer's (steps that changed the
    weights so far), `accepted` counts groups handed to the trainer (for admission)."""

    def __init__(self, cfg: RLConfig, pool: RolloutPool, version: int, admin: object | None = None):
        self.cfg, self.pool, self.version, self.admin = cfg, pool, version, admin
        self.ok = frozenset(cfg.train.ok_statuses) | {RolloutStatus.OK}
        self.buffer: deque[Group] = deque()
        self.accepted = version * cfg.batch_groups
        self.stale_policy = StalePolicy(cfg.stale_policy)
        self.role = RoleSwitch(cfg.switch_min_gain, cfg.switch_prior_s)
        self.lend = cfg.lent_rollouts
        self.base_slots = pool.slots
        self._stop = threading.Event()
        self._hold = threading.Event()  # colocated: no new groups while the trainer has the CPU
        self._feeder: threading.Thread | None = None
        self._completions: deque[float] = deque(maxlen=8)

    # -- async feeding ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self.cfg.mode is RLMode.SYNC:
            return
        self._feeder = threading.Thread(target=self._feed, name="rl-feeder", daemon=True)
        self._feeder.start()

    def stop(self) -> None:
        self._stop.set()
        self.pool.notify()
        if self._feeder is not None:
            self._feeder.join(10)

    def _admit(self) -> bool:
        pool = self.pool
        accepted = self.accepted + len(self.buffer) + len(pool.ready)
        return can_admit(
            accepted, len(pool.running_groups), self.version, self.cfg.max_staleness, self.cfg.batch_groups
        )

    def _feed(self) -> None:
        pool = self.pool
        while not self._stop.is_set():
            with pool.cond:
                go = pool.cond.wait_for(
                    lambda: (
                        self._stop.is_set() or (not self._hold.is_set() and pool.has_room() and self._admit())
                    ),
                    0.5,
                )
            if go and not self._stop.is_set():
                pool.start_group()

    # -- classifying finished groups ------------------------------------------------------------------------
    def _classify(self, counts: StepCounts) -> None:
        for g in self.pool.take_ready():
            self._completions.append(g.finished_at)
            rewards = g.rewards(self.ok)
            counts.rewards_all += rewards
            counts.tokens_generated += g.generated_tokens()
            self.pool.pass_rates.record(g.task_id, rewards)
            if not g.has_signal(self.ok):
                counts.groups_zero_variance += 1
                counts.discarded.append(g.group_id)
                self.pool.order.consume(g.group_index)  # replaced by the next group of the stream
                continue
            if not keep_group(self.stale_policy, g.oldest_version(), self.version, self.cfg.max_staleness):
                counts.groups_stale_dropped += 1
                counts.discarded.append(g.group_id)
                self.pool.order.consume(g.group_index)
                continue
            self.buffer.append(g)

    def _tried(self, counts: StepCounts) -> int:
        return counts.groups_zero_variance + counts.groups_stale_dropped + len(self.buffer)

    # -- one step's groups ----------------------------------------------------------------------------------
    def collect(self, counts: StepCounts) -> list[Group]:
        t0 = time.perf_counter()
        if self.cfg.mode is RLMode.SYNC:
            groups = self._collect_sync(counts)
        else:
            groups = self._collect_async(counts)
        counts.wait_s = time.perf_counter() - t0
        return groups

    def _collect_sync(self, counts: StepCounts) -> list[Group]:
        batch, budget = self.cfg.batch_groups, self.cfg.group_budget
        while len(self.buffer) < batch and self._tried(counts) < budget:
            wave = min(batch - len(self.buffer), budget - self._tried(counts))
            for _ in range(wave):
                self.pool.start_group()
            self.pool.wait(lambda: not self.pool.running_groups, timeout_s=None)
            self._classify(counts)
        return self._take(batch)

    def _collect_async(self, counts: StepCounts) -> list[Group]:
        batch, budget = self.cfg.batch_groups, self.cfg.group_budget
        lent_at: float | None = None
        switch_out = 0.0
        while True:
            self._classify(counts)
            if len(self.buffer) >= batch or self._tried(counts) >= budget:
                break
            if self.cfg.mode is RLMode.SEPARATE and lent_at is None:
                wait = expected_wait_s(batch - len(self.buffer), self._groups_per_s())
                if self.role.should_lend(wait):
                    t = time.perf_counter()
                    self.pool.slots = self.base_slots + self.lend
                    self.pool.notify()
                    switch_out = time.perf_counter() - t
                    lent_at = time.perf_counter()
            self.pool.wait(lambda: bool(self.pool.ready), timeout_s=1.0)
        if lent_at is not None:  # hand back: the lent slots take no new rollouts
            t = time.perf_counter()
            self.pool.slots = self.base_slots
            counts.lent_s += t - lent_at
            self.role.observe_switch(switch_out + time.perf_counter() - t)
            counts.role_switches += 1
        return self._take(batch)

    def _groups_per_s(self) -> float:
        times = list(self._completions)
        if len(times) < 2 or times[-1] <= times[0]:
            return 0.0
        return (len(times) - 1) / (times[-1] - times[0])

    def _take(self, batch: int) -> list[Group]:
        groups = [self.buffer.popleft() for _ in range(min(batch, len(self.buffer)))]
        self.accepted += len(groups)
        return groups

    # -- around the optimizer step --------------------------------------------------------------------------
    def before_train(self, counts: StepCounts) -> None:
        if self.cfg.mode is not RLMode.COLOCATED:
            return
        from harnessrl.gateway.client import GatewayAdmin

        assert isinstance(self.admin, GatewayAdmin)
        self._hold.set()
        t = time.perf_counter()
        # hold_new: a harness between two turns that calls during the step waits instead of burning retries
        self.admin.pause(PauseMode.ABORT, timeout_s=60.0, hold_new=True)
        counts.pause_s = time.perf_counter() - t

    def after_sync(self, version: int) -> None:
        self.version = version
        if self.cfg.mode is RLMode.COLOCATED:
            from harnessrl.gateway.client import GatewayAdmin

            assert isinstance(self.admin, GatewayAdmin)
            self.admin.resume()
            self._hold.clear()
        self.pool.notify()
