"""The run's data order and the pool of rollout workers that turns it into finished groups.

Data order: epoch e visits every task once, in a seeded shuffle of the task list; position g of the stream is
group g (its rollouts get seeds derived from the run's seed and g). A resumed run continues the same stream
from its checkpoint's cursor, skipping the positions already consumed, so kill + rerun keeps the data order.

`LoopState` is where the loop is — the data order, the pass-rate history dynamic sampling reads, the policy
version — as a checkpoint keeps it; the mode's driver (drivers.py) owns it and alone changes it.

The pool runs the groups the driver starts on its runner (threads, or Ray tasks across nodes: harnessrl.rl.runners); a group is
complete when all its rollouts finished, then its samples are read from the gateway journal and it is handed to
the trainer's queue at once (groups stream; nobody waits for the batch's slowest).
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harnessrl.gateway.replies import ReplyCounts
from harnessrl.rl.collect import JournalTail
from harnessrl.rl.runners import RolloutRunner
from harnessrl.rl.workloads import Finished, RolloutPlan
from harnessrl.schema import RolloutStatus, Sample
from harnessrl.train.data import RewardRow, Rollout

if TYPE_CHECKING:
    from harnessrl.train.config import UpdateConfig

logger = logging.getLogger(__name__)


@dataclass
class Group:
    group_id: str
    task_id: str
    group_index: int
    started_version: int
    started_at: float
    rollouts: list[Finished] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    replies: ReplyCounts = field(default_factory=ReplyCounts)  # its model calls' sampled replies
    finished_at: float = 0.0

    def reward_rows(self) -> dict[str, RewardRow]:
        """Each rollout's reward and status, as the learner's data assembly reads them."""
        return {r.rollout_id: RewardRow(r.reward, r.status) for r in self.rollouts}

    def members(self, cfg: UpdateConfig) -> list[Rollout]:
        """The group's rollouts as the learner's step places them (`cfg.prepare`: scored and trained, in the
        baseline only, or left out), so whether the group has signal (train.data.has_signal) is decided on
        what the learner will see."""
        return cfg.prepare(self.samples, self.reward_rows()).rollouts

    def oldest_version(self) -> int:
        """The policy version of the group's oldest sampled token (its start version when it sampled none)."""
        versions = [v for s in self.samples for v, m in zip(s.policy_version, s.loss_mask, strict=False) if m]
        return min(versions, default=self.started_version)

    def partial_rollouts(self) -> int:
        """Rollouts whose tokens were sampled by more than one policy version (continued after a sync)."""
        by_rollout: dict[str, set[int]] = defaultdict(set)
        for s in self.samples:
            by_rollout[s.rollout_id].update(
                v for v, m in zip(s.policy_version, s.loss_mask, strict=False) if m
            )
        return sum(len(vs) > 1 for vs in by_rollout.values())

    def generated_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.samples)


class DataOrder:
    def __init__(self, task_ids: list[str], seed: int, cursor: int = 0, done: list[int] | None = None):
        if not task_ids:
            raise ValueError("no tasks to sample from")
        self.task_ids = sorted(task_ids)
        self.seed = seed
        self.next = cursor  # the next position to hand out
        self.low = cursor  # every position below it is consumed (trained, discarded or skipped)
        self.consumed_above: set[int] = set(done or ())  # consumed positions above `low`
        self._epochs: dict[int, list[str]] = {}

    def task_at(self, position: int) -> str:
        n = len(self.task_ids)
        epoch = position // n
        if epoch not in self._epochs:
            order = list(self.task_ids)
            random.Random(self.seed * 1000003 + epoch).shuffle(order)
            self._epochs[epoch] = order
        return self._epochs[epoch][position % n]

    def take(self) -> tuple[int, str]:
        while self.next in self.consumed_above:  # consumed before a resume
            self.next += 1
        position = self.next
        self.next += 1
        return position, self.task_at(position)

    def consume(self, position: int) -> None:
        self.consumed_above.add(position)
        while self.low in self.consumed_above:
            self.consumed_above.discard(self.low)
            self.low += 1

    def state(self) -> dict[str, object]:
        """What a checkpoint keeps: positions in flight or waiting then are sampled again after a resume."""
        return {"cursor": self.low, "done": sorted(self.consumed_above)}


def group_seed(seed: int, group_index: int, k: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{group_index}:{k}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") * 1000


class PassRates:
    """Per task, passes / n over its last `last_k` finished groups (the history dynamic sampling reads)."""

    def __init__(self, last_k: int, pass_threshold: float, rows: list[tuple[str, int, int]] | None = None):
        self.last_k = last_k
        self.pass_threshold = pass_threshold
        self.rows: dict[str, deque[tuple[int, int]]] = defaultdict(lambda: deque(maxlen=last_k))
        for task, n, passes in rows or ():
            self.rows[task].append((n, passes))

    def record(self, task_id: str, rewards: list[float]) -> None:
        if rewards:
            self.rows[task_id].append((len(rewards), sum(r >= self.pass_threshold for r in rewards)))

    def rates(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for task, rows in self.rows.items():
            n = sum(r[0] for r in rows)
            out[task] = sum(r[1] for r in rows) / n if n else None
        return out

    def to_rows(self) -> list[tuple[str, int, int]]:
        return [(t, n, p) for t, rows in sorted(self.rows.items()) for n, p in rows]


@dataclass
class LoopState:
    """Where the loop is: the data order, each task's recent pass rates and the policy version (weight versions
    published so far). A checkpoint keeps it (`to_meta`); a resume continues from it (`from_meta`)."""

    order: DataOrder
    pass_rates: PassRates
    version: int = 0

    @classmethod
    def from_meta(
        cls, task_ids: list[str], seed: int, last_k: int, pass_threshold: float, meta: dict[str, Any] | None
    ) -> LoopState:
        """A fresh run's state (`meta` None) or a checkpoint's (its `loop` entry)."""
        meta = meta or {}
        order = meta.get("order", {})
        return cls(
            DataOrder(task_ids, seed, order.get("cursor", 0), order.get("done")),
            PassRates(last_k, pass_threshold, [tuple(r) for r in meta.get("pass_rates", [])]),
            int(meta.get("version", 0)),
        )

    def to_meta(self) -> dict[str, Any]:
        return {"version": self.version, "order": self.order.state(), "pass_rates": self.pass_rates.to_rows()}


@dataclass
class PoolCounts:
    groups_started: int = 0
    rollouts_finished: int = 0


class RolloutPool:
    """Runs the groups it is given (all rollouts of one task) on the runner and queues them as they complete."""

    def __init__(
        self, runner: RolloutRunner, journal: JournalTail, *, group_size: int, slots: int, seed: int
    ):
        self.runner, self.journal = runner, journal
        self.group_size, self.seed = group_size, seed
        self.slots = slots  # rollouts allowed in flight now (role switching raises it while lent)
        self.counts = PoolCounts()
        self.cond = threading.Condition()
        self.ready: deque[Group] = deque()
        self.running_rollouts = 0
        self.running_groups: dict[int, Group] = {}
        self._pending: dict[int, int] = {}
        self._errors: list[BaseException] = []
        self._closing = False  # rollouts still running at the end fail against the stopped gateway: no noise

    # -- starting -----------------------------------------------------------------------------------------
    def has_room(self) -> bool:
        return self.running_rollouts + self.group_size <= max(self.slots, self.group_size)

    def start_group(self, position: int, task: str, version: int) -> Group:
        """Group `position` of the data order (task `task`), sampled from policy `version` on."""
        with self.cond:
            group = Group(f"{task}@g{position}", task, position, version, time.monotonic())
            self.running_groups[position] = group
            self._pending[position] = self.group_size
            self.running_rollouts += self.group_size
            self.counts.groups_started += 1
        for k in range(self.group_size):
            plan = RolloutPlan(
                f"{group.group_id}__r{k}",
                group.group_id,
                task,
                k,
                position,
                group_seed(self.seed, position, k),
            )
            fut = self.runner.start(plan)
            fut.add_done_callback(lambda f, p=plan: self._finished(p, f))
        return group

    def _finished(self, plan: RolloutPlan, fut: Future[Finished]) -> None:
        if self._closing:
            return
        try:
            done = fut.result()
        except BaseException as e:  # a workload bug, a lost Ray worker: an infra error of this rollout
            logger.exception("rollout %s crashed", plan.rollout_id)
            done = Finished(
                plan.rollout_id, plan.group_id, plan.task_id, None, RolloutStatus.INFRA_ERROR, repr(e)[:500]
            )
        complete: Group | None = None
        with self.cond:
            group = self.running_groups[plan.group_index]
            group.rollouts.append(done)
            self.running_rollouts -= 1
            self.counts.rollouts_finished += 1
            self._pending[plan.group_index] -= 1
            if self._pending[plan.group_index] == 0:
                complete = group
                del self._pending[plan.group_index]
            self.cond.notify_all()
        if complete is None:
            return
        try:  # still "running" until it is ready: a waiter never sees it in neither place
            taken = self.journal.take([r.rollout_id for r in complete.rollouts])
        except BaseException as e:
            with self.cond:
                self._errors.append(e)
                self.cond.notify_all()
            return
        complete.samples, complete.replies = taken.samples, taken.replies
        complete.rollouts.sort(key=lambda r: r.rollout_id)
        complete.finished_at = time.monotonic()
        with self.cond:
            del self.running_groups[complete.group_index]
            self.ready.append(complete)
            self.cond.notify_all()

    # -- taking -------------------------------------------------------------------------------------------
    def raise_errors(self) -> None:
        if self._errors:
            raise RuntimeError(f"reading finished rollouts failed: {self._errors[0]!r}") from self._errors[0]

    def take_ready(self) -> list[Group]:
        with self.cond:
            out = list(self.ready)
            self.ready.clear()
            return out

    def wait(self, predicate: Callable[[], bool], timeout_s: float | None = 1.0) -> bool:
        with self.cond:
            ok = self.cond.wait_for(lambda: predicate() or bool(self._errors), timeout_s)
        self.raise_errors()
        return ok

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def close(self) -> None:
        self._closing = True
        self.runner.close()
