"""How each mode collects the groups of one optimizer step, and what it does around the step: one class per mode.

- `SyncDriver`: start `batch_groups` groups, wait for all of them, replace the ones without signal by
  new groups (a second wave, up to the step's group budget), train, sync weights. Nothing generates while
  the trainer works, and the batch waits for its slowest rollout.
- `ColocatedDriver`: a feeder thread keeps rollouts running (bounded by the rollout slots and the staleness
  admission rule); groups stream into a buffer as they complete. When `batch_groups` groups with signal are
  there, the gateway pauses with abort: in-flight generations stop and are parked as partial rollouts (the
  harness's call just takes longer), the trainer steps on the shared CPU, the weights sync, the gateway
  resumes and every parked generation continues from its tokens under the new policy (each token tagged with
  the version that sampled it; TIS on the behaviour log-probs corrects the older ones).
- `SeparateDriver`: like colocated, but generation never pauses: the trainer steps while rollouts run, the
  weights load between two decode steps. Staleness is bounded by admission and the per-group stale policy.
  While the trainer would wait for data, `RoleSwitch` decides whether to lend its share to rollouts (here:
  extra rollout slots; on one CPU box no device moves, see docs/rl.md).

The driver owns the loop's state (`LoopState`: data order, pass rates, policy version) and alone changes it: it
picks each group's task, consumes the positions it trains or discards, records pass rates and takes the
version a sync published; `collect` returns the step's batch as one `StepBatch`.

Dynamic sampling happens here, before any compute: a task whose recent pass rate says it is solved or
hopeless (`worth_sampling`) is skipped and its position counted as consumed. If every task would be
skipped the stream samples anyway (counted as `dynamic_sampling_exhausted`), so a run never stalls.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from harnessrl.gateway.client import GatewayAdmin
from harnessrl.gateway.enums import PauseMode
from harnessrl.rl.admission import StalePolicy, can_admit, keep_group
from harnessrl.rl.config import RLConfig
from harnessrl.rl.dynamic_sampling import worth_sampling
from harnessrl.rl.groups import Group, LoopState, RolloutPool
from harnessrl.rl.modes import GroupFate, RLMode
from harnessrl.rl.records import Collected
from harnessrl.rl.role_switch import RoleSwitch, expected_wait_s
from harnessrl.train.data import has_signal

logger = logging.getLogger(__name__)


@dataclass
class StepBatch:
    """One step's collection: the groups it trains, the finished groups it will not train (and why), and
    what collecting them took."""

    groups: list[Group]
    discarded: list[tuple[Group, GroupFate]] = field(default_factory=list)
    collected: Collected = field(default_factory=Collected)


class Driver:
    """Collects step batches from the pool and owns the loop's `state` (the module docstring); `accepted`
    counts groups handed to the trainer (for admission). The base class is the part every mode shares: picking
    tasks, classifying finished groups and handing out a batch. A group has signal as the learner's step plan
    decides it (train.data.has_signal on the group's rollouts placed as the learner places them), so a group
    kept here is a group the step trains."""

    def __init__(self, cfg: RLConfig, pool: RolloutPool, state: LoopState):
        self.cfg, self.pool, self.state = cfg, pool, state
        self.buffer: deque[Group] = deque()
        self.accepted = state.version * cfg.batch_groups
        self.stale_policy = StalePolicy(cfg.stale_policy)
        self._lock = threading.Lock()  # the state: groups start on the feeder thread, finish on the loop's
        self._skipped: list[str] = []  # group ids (positions) dynamic sampling skipped since the last batch
        self.dynamic_sampling_exhausted = 0

    @property
    def version(self) -> int:
        return self.state.version

    def start(self) -> None:
        """Starts generating ahead of the first `collect` (the async modes)."""

    def stop(self) -> None:
        self.pool.notify()

    def collect(self) -> StepBatch:
        """Up to `batch_groups` finished groups with signal for the next optimizer step (fewer when the step's
        group budget ran out); the positions of every group it holds are consumed."""
        t0 = time.perf_counter()
        batch = StepBatch([])
        batch.groups = self._collect(batch)
        with self._lock:
            for g in batch.groups:
                self.state.order.consume(g.group_index)
            batch.collected.groups_skipped, self._skipped = self._skipped, []
        batch.collected.wait_s = time.perf_counter() - t0
        batch.collected.dynamic_sampling_exhausted = self.dynamic_sampling_exhausted
        return batch

    def _collect(self, batch: StepBatch) -> list[Group]:
        raise NotImplementedError

    def before_train(self) -> float:
        """Right before the optimizer step; the seconds it took to stop generating (colocated)."""
        return 0.0

    def after_sync(self, version: int) -> None:
        """Right after the new weights reached the engines (or after a step that trained nothing)."""
        with self._lock:
            self.state.version = version
        self.pool.notify()

    def _start_group(self) -> Group:
        with self._lock:
            position, task = self._next_task()
            version = self.state.version
        return self.pool.start_group(position, task, version)

    def _next_task(self) -> tuple[int, str]:
        order = self.state.order
        worth = set(worth_sampling(self.state.pass_rates.rates(), order.task_ids, self.cfg.dynamic_low,
                                   self.cfg.dynamic_high))  # fmt: skip
        if not worth:
            self.dynamic_sampling_exhausted += 1
            return order.take()
        while True:
            position, task = order.take()
            if task in worth:
                return position, task
            self._skipped.append(f"{task}@g{position}")
            order.consume(position)

    def _classify(self, batch: StepBatch) -> None:
        collected = batch.collected
        for g in self.pool.take_ready():
            members = g.members(self.cfg)  # as the learner's step will place them
            rewards = [m.reward for m in members if m.trainable]  # the scored ones: the agent's own
            collected.add_rewards(rewards)
            collected.add_samples([s.rollout_id for s in g.samples])
            collected.tokens_generated += g.generated_tokens()
            self._finished(g)
            fate = None
            if not has_signal(members):
                collected.groups_zero_variance += 1
                fate = GroupFate.ZERO_VARIANCE
            elif not keep_group(self.stale_policy, g.oldest_version(), self.version, self.cfg.max_staleness):
                collected.groups_stale_dropped += 1
                fate = GroupFate.STALE
            with self._lock:
                self.state.pass_rates.record(g.task_id, rewards)
                if fate is not None:  # replaced by the next group of the stream
                    self.state.order.consume(g.group_index)
            if fate is None:
                self.buffer.append(g)
            else:
                collected.groups_discarded.append(g.group_id)
                batch.discarded.append((g, fate))

    def _finished(self, group: Group) -> None:
        """A group completed (whatever its signal)."""

    def _tried(self, batch: StepBatch) -> int:
        return len(batch.discarded) + len(self.buffer)

    def _take(self, size: int) -> list[Group]:
        groups = [self.buffer.popleft() for _ in range(min(size, len(self.buffer)))]
        self.accepted += len(groups)
        return groups


class SyncDriver(Driver):
    def _collect(self, batch: StepBatch) -> list[Group]:
        size, budget = self.cfg.batch_groups, self.cfg.group_budget
        while len(self.buffer) < size and self._tried(batch) < budget:
            wave = min(size - len(self.buffer), budget - self._tried(batch))
            for _ in range(wave):
                self._start_group()
            self.pool.wait(lambda: not self.pool.running_groups, timeout_s=None)
            self._classify(batch)
        return self._take(size)


class AsyncDriver(Driver):
    """A feeder thread keeps the pool full (slots and staleness admission permitting); `collect` takes groups
    as they complete."""

    def __init__(self, cfg: RLConfig, pool: RolloutPool, state: LoopState):
        super().__init__(cfg, pool, state)
        self._stop = threading.Event()
        self._hold = threading.Event()  # no new groups (colocated: while the trainer has the CPU)
        self._feeder: threading.Thread | None = None

    def start(self) -> None:
        self._feeder = threading.Thread(target=self._feed, name="rl-feeder", daemon=True)
        self._feeder.start()

    def stop(self) -> None:
        self._stop.set()
        super().stop()
        if self._feeder is not None:
            self._feeder.join(10)

    def _admit(self) -> bool:
        pool = self.pool
        accepted = self.accepted + len(self.buffer) + len(pool.ready)
        cfg = self.cfg
        running = len(pool.running_groups)
        return can_admit(accepted, running, self.version, cfg.max_staleness, cfg.batch_groups, cfg.steps)

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
                self._start_group()

    def _collect(self, batch: StepBatch) -> list[Group]:
        size, budget = self.cfg.batch_groups, self.cfg.group_budget
        while True:
            self._classify(batch)
            if len(self.buffer) >= size or self._tried(batch) >= budget:
                return self._take(size)
            self._waiting(batch.collected)
            self.pool.wait(lambda: bool(self.pool.ready), timeout_s=1.0)

    def _waiting(self, collected: Collected) -> None:
        """Called while the step still waits for groups."""


class ColocatedDriver(AsyncDriver):
    """Generation pauses (aborting in-flight calls into partial rollouts) while the trainer steps."""

    def __init__(self, cfg: RLConfig, pool: RolloutPool, state: LoopState, admin: GatewayAdmin):
        super().__init__(cfg, pool, state)
        self.admin = admin

    def before_train(self) -> float:
        self._hold.set()
        t = time.perf_counter()
        # hold_new: a harness between two turns that calls during the step waits instead of burning retries
        self.admin.pause(PauseMode.ABORT, timeout_s=60.0, hold_new=True)
        return time.perf_counter() - t

    def after_sync(self, version: int) -> None:
        self.admin.resume()
        self._hold.clear()
        super().after_sync(version)


class SeparateDriver(AsyncDriver):
    """Generation never pauses; while the trainer would wait, it may lend its share to rollouts."""

    def __init__(self, cfg: RLConfig, pool: RolloutPool, state: LoopState):
        super().__init__(cfg, pool, state)
        self.role = RoleSwitch(cfg.switch_min_gain, cfg.switch_prior_s)
        self.base_slots = pool.slots
        self._completions: deque[float] = deque(maxlen=8)
        self._lent_at: float | None = None
        self._switch_out_s = 0.0

    def _finished(self, group: Group) -> None:
        self._completions.append(group.finished_at)

    def _waiting(self, collected: Collected) -> None:
        if self._lent_at is not None:
            return
        wait = expected_wait_s(self.cfg.batch_groups - len(self.buffer), self._groups_per_s())
        if self.role.should_lend(wait):
            t = time.perf_counter()
            self.pool.slots = self.base_slots + self.cfg.lent_rollouts
            self.pool.notify()
            self._switch_out_s = time.perf_counter() - t
            self._lent_at = time.perf_counter()

    def _collect(self, batch: StepBatch) -> list[Group]:
        groups = super()._collect(batch)
        collected = batch.collected
        if self._lent_at is not None:  # hand back: the lent slots take no new rollouts
            t = time.perf_counter()
            self.pool.slots = self.base_slots
            collected.lent_s += t - self._lent_at
            self.role.observe_switch(self._switch_out_s + time.perf_counter() - t)
            collected.role_switches += 1
            self._lent_at = None
        return groups

    def _groups_per_s(self) -> float:
        times = list(self._completions)
        if len(times) < 2 or times[-1] <= times[0]:
            return 0.0
        return (len(times) - 1) / (times[-1] - times[0])


def make_driver(cfg: RLConfig, pool: RolloutPool, state: LoopState, admin: GatewayAdmin) -> Driver:
    if cfg.mode is RLMode.SYNC:
        return SyncDriver(cfg, pool, state)
    if cfg.mode is RLMode.COLOCATED:
        return ColocatedDriver(cfg, pool, state, admin)
    return SeparateDriver(cfg, pool, state)
