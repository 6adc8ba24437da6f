"""Discrete-event simulation of the RL loop's schedules at cluster scale: sync, colocated async (partial
rollouts), fully-async with a fixed device split, and separate async with role switching.

One file on purpose (a benchmark script): the event loop, the engine model, the four schedules and the
report belong together and are read together; the policies themselves are the real ones from
`harnessrl.rl.admission` (`can_admit`, `keep_group`) and `harnessrl.rl.role_switch` (`RoleSwitch`).

    .venv/bin/python benchmarks/async_sim.py [--calibration FILE] [--max-staleness 2]
        [--stale-policy keep|drop] [--steps 16] [--seed 0] [--small]

Last line: one JSON object with `colocated_time_ratio_vs_sync` (reasoning workload, where Uni-Agent reports
its -35.4% wall-clock), `separate_switch_throughput_vs_sync` and `separate_switch_throughput_vs_fixed_async`
(agentic workload, where it reports >2x sync and ~1.4x the fully-async baseline), and the per-workload rows.

Assumptions (each one a parameter of `CostModel` or `Workload` below):

Devices. `devices` H100-class GPUs (80 GB HBM at 3.35 TB/s, ~989 dense bf16 TFLOP/s) serve an 8B-class dense
model, one inference replica per GPU (TP=1). Sync and colocated use all of them for both roles; the split
modes give `rollout_devices` to inference and the rest to the trainer (FSDP over its devices).

Decode (continuous batching, fluid): every running sequence advances one token per engine step; a step
takes `decode_step_s` (reading 16 GB of weights at ~60% of HBM bandwidth plus launch overhead) +
per sequence `decode_token_s` (its FLOPs) + `decode_kv_s_per_ktoken` per 1,000 context tokens (reading its KV
cache: 128 KB/token for an 8B GQA model at ~60% of HBM bandwidth). KV (`kv_tokens`, the ~58 GB left after
weights and activations) is allocated as tokens are made: a request starts only while `kv_watermark` of
the cache stays free and the replica runs fewer than `max_seqs`; when the cache fills, the lowest-priority
sequence (newest group) is preempted, keeps its tokens and re-prefills its context when it resumes
(recompute preemption, as vLLM does). Requests wait in one router queue, oldest group first (priority
scheduling, so a stale-prone old group is not starved); a request goes to the replica holding its
session's prefix when that replica has room, else to the rollout replica with most free KV (lent replicas
take only what the rollout replicas have no room for).

Session slots: an engine takes at most `kv_tokens / mean context held` sessions in flight (generating,
queued or in a tool call; `session_slots`), as a tuned deployment caps rollout concurrency so that a
session's prefix can stay cached between turns; a group is admitted only when `can_admit` allows it and
its G sessions fit the slots of the engines serving now (lent engines add theirs).

Prefill: `prefill_tokens_per_s` per replica (~16 GFLOP/token at ~40% MFU), serial with decode on that replica
(chunked prefill packs both in one step; the total time is the same). A session's next turn prefills only
its new tokens when its prefix is still cached on the replica it lands on; the whole context otherwise.
Every weight sync flushes every prefix cache; an aborted request's KV is lost (it prefills its whole
context, its sampled tokens kept, when it resumes: a partial rollout).

Training: `train_tokens_per_s` per device over every token of every trajectory (prompt + all turns: one
sample per rollout), ~64 GFLOP/token (fwd+bwd+old-logprob forward) at ~40% MFU; plus `train_step_overhead_s`
per optimizer step. Weight sync: `colocated_sync_s` where training and inference share devices (offload the
trainer, wake the engine, reshard); `separate_sync_s` for a broadcast into separate engines, during which
they pause and every in-flight request re-prefills its context under the new weights.

Role switch: lending the trainer's devices costs `switch_s` out + back (offload trainer states to host,
wake an engine with the current weights; the reverse), half each way, the devices idle meanwhile. The
`RoleSwitch` starts from the conservative prior `switch_prior_s` and learns the measured cost. Expected wait
= groups still missing for the next step / the group completion rate over the last `2 * batch_groups`
completions. When the step's data is ready the lent engines are handed back: their requests are aborted
(partial rollouts, resumed on the rollout pool).

Staleness: the same admission rule as the loop (`can_admit` on accepted + running vs
(max_staleness + version + 1) x batch) in every async mode, and the per-group `keep_group` check at train
time with `--stale-policy`: `keep` (default, as in the loop: a long-tail partial rollout whose oldest token
is older than the bound is still trained, TIS correcting it; admission alone bounds how far generation runs
ahead) or `drop` (the group is discarded and its slot regenerated: the bound is exact, the work is lost).
Staleness = trainer version at training - the oldest policy version among the group's tokens. The trainer
takes ready groups oldest first. Sync is colocated with `max_staleness = 0`: it admits one batch, waits for
all of it, trains, syncs.

Workloads (lengths lognormal, seeded per group; all G rollouts of a group are independent draws):
- reasoning: single turn, 512-token prompt, response median 3,000 tokens, sigma 0.9 (mean ~4.5k), capped at
  16,384 (a DAPO-style math/code setup); G=8, 64 groups per step.
- agentic: SWE-style ReAct sessions: 2,000-token prompt (system + tools + issue), turns median 12, sigma 0.6
  (long tail to the cap of 40), each turn decodes median 250 tokens (sigma 0.8, cap 2,048), then a tool call
  of median 6 s (lognormal sigma 1.0: mean ~10 s; cap 300 s: running tests, installs) whose
  result adds median 600 tokens; a session stops at the 32k context cap. The engine is free during tool time.
  G=8, 32 groups per step.
- Both lengthen during training (`length_growth`: response length / turn count scale linearly from 1x for
  the first group generated to that factor for the last one trained), the drift the seeds give as the
  reason a fixed split becomes misaligned. Group n is the same draw in every mode, so every mode trains
  the same task stream.
- Splits: each split mode runs at the split a user would pick by profiling the start of the run (its best
  throughput over the first `profile_steps` steps with growth off, every split tried); role switching also
  runs at the fixed mode's split (the mechanism alone). The profile of every split is printed.

Calibration: `--calibration FILE` (the JSON `benchmarks/rl_modes.py` writes, or any with these keys) replaces
the GPU cost model's numbers by measured ones: `decode_tokens_per_s` (scales every decode cost so a full
replica decodes that many tokens/s at 4,096-token contexts), `prefill_tokens_per_s`, `train_tokens_per_s`, `weight_sync_s` (both
sync costs), `tool_s_mean` (scales the agentic tool-time distribution to that mean). Other keys are ignored;
the keys used are printed.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harnessrl.rl.admission import StalePolicy, can_admit, keep_group, staleness
from harnessrl.rl.role_switch import RoleSwitch, expected_wait_s

EPS = 1e-9


class Mode(StrEnum):
    SYNC = "sync"
    COLOCATED = "colocated_async"
    FIXED = "fixed_split_async"
    SWITCH = "separate_async_switching"


class DeviceState(StrEnum):
    BUSY = "busy"  # generating (prefill or decode) or training
    IDLE = "idle"
    SYNC = "sync"  # weight sync
    SWITCH = "switch"  # role switch out or back


@dataclass(frozen=True)
class CostModel:
    decode_step_s: float = 0.008
    decode_token_s: float = 3e-5
    decode_kv_s_per_ktoken: float = 6.5e-5
    kv_tokens: int = 450_000
    kv_watermark: float = 0.05  # start a request only while this fraction of the KV cache stays free
    max_seqs: int = 256
    prefill_tokens_per_s: float = 25_000.0
    train_tokens_per_s: float = 6_000.0
    train_step_overhead_s: float = 2.0
    colocated_sync_s: float = 8.0
    separate_sync_s: float = 3.0
    switch_s: float = 12.0
    switch_prior_s: float = 30.0

    def step_s(self, contexts: float, seqs: int) -> float:
        return self.decode_step_s + seqs * self.decode_token_s + contexts / 1000 * self.decode_kv_s_per_ktoken

    def full_replica_tokens_per_s(self, context: int = 4096) -> float:
        seqs = min(self.max_seqs, self.kv_tokens // context)
        return seqs / self.step_s(seqs * context, seqs)


@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int
    turns_median: float
    turns_sigma: float
    turns_max: int
    decode_median: float
    decode_sigma: float
    decode_max: int
    tool_s_median: float = 0.0
    tool_s_sigma: float = 1.0
    tool_s_max: float = 300.0
    result_median: float = 0.0
    result_sigma: float = 0.8
    context_max: int = 32_768
    group_size: int = 8
    batch_groups: int = 64
    length_growth: float = 1.5


REASONING = Workload(
    "reasoning", 512, 1, 0, 1, 3000, 0.9, 16_384, context_max=16_896, batch_groups=64, length_growth=1.5
)
AGENTIC = Workload(
    "agentic", 2000, 12, 0.6, 40, 250, 0.8, 2048, tool_s_median=6.0, tool_s_sigma=1.0, result_median=600,
    batch_groups=32, length_growth=1.5,
)  # fmt: skip


def lognormal(rng: random.Random, median: float, sigma: float, cap: float) -> float:
    return min(cap, median * math.exp(rng.gauss(0.0, sigma)))


@dataclass
class Turn:
    new_tokens: int  # prompt (first turn) or tool result
    decode_tokens: int
    tool_s: float  # after this turn's decode (0 for the last)


def draw_rollout(rng: random.Random, wl: Workload, scale: float) -> list[Turn]:
    n_turns = (
        wl.turns_max
        if wl.turns_max == 1
        else max(1, round(lognormal(rng, wl.turns_median * scale, wl.turns_sigma, wl.turns_max)))
    )
    turns, context = [], 0
    for i in range(n_turns):
        new = (
            wl.prompt_tokens
            if i == 0
            else max(1, round(lognormal(rng, wl.result_median, wl.result_sigma, 8192)))
        )
        median = wl.decode_median * (scale if wl.turns_max == 1 else 1.0)
        decode = max(1, round(lognormal(rng, median, wl.decode_sigma, wl.decode_max)))
        if context + new >= wl.context_max:
            break
        decode = min(decode, wl.context_max - context - new)
        context += new + decode
        tool = lognormal(rng, wl.tool_s_median, wl.tool_s_sigma, wl.tool_s_max) if wl.tool_s_median else 0.0
        turns.append(Turn(new, decode, tool))
    turns[-1].tool_s = 0.0
    return turns


def session_slots(wl: Workload, cm: CostModel) -> int:
    """Sessions (rollouts in flight, tool time included) per engine: as many as its KV cache holds at the
    mean context a session has over its turns, so prefixes can stay cached between turns."""
    rng = random.Random(12345)
    held = []
    for _ in range(2000):
        context, contexts = 0, []
        for t in draw_rollout(rng, wl, 1.0):
            context += t.new_tokens + t.decode_tokens
            contexts.append(context)
        held.append(statistics.fmean(contexts))
    return max(wl.group_size, min(cm.max_seqs, int(cm.kv_tokens // statistics.fmean(held))))


@dataclass
class Group:
    gid: int
    version: int  # trainer version when admitted
    rollouts: list[Rollout] = field(default_factory=list)
    done: int = 0

    @property
    def oldest_version(self) -> int:
        return min(r.oldest_version for r in self.rollouts if r.oldest_version is not None)

    @property
    def tokens(self) -> int:
        return sum(r.context for r in self.rollouts)


@dataclass
class Rollout:
    group: Group
    index: int
    turns: list[Turn]
    turn: int = 0
    context: int = 0
    decode_left: int = 0  # of the current turn (a partial rollout resumes with this)
    pending_new: int = 0  # prompt / tool-result tokens not yet sent to an engine
    oldest_version: int | None = None
    cache: tuple[Replica, int] | None = None  # (replica, its cache epoch) holding this session's prefix


@dataclass
class Request:
    rollout: Rollout
    prefill_left_s: float
    decode_left: float
    decoded: float = 0.0

    @property
    def kv(self) -> float:
        return self.rollout.context + self.decoded


class Meter:
    """Per-device time in each DeviceState; every device is in exactly one state at any time."""

    def __init__(self, devices: int):
        self.state = [DeviceState.IDLE] * devices
        self.since = [0.0] * devices
        self.total = {s: 0.0 for s in DeviceState}

    def set(self, device: int, state: DeviceState, now: float) -> None:
        self.total[self.state[device]] += now - self.since[device]
        self.state[device], self.since[device] = state, now

    def close(self, now: float) -> None:
        for d, s in enumerate(self.state):
            self.set(d, s, now)


class Replica:
    """One inference engine on one device: fluid continuous batching (see the module docstring)."""

    def __init__(self, sim: Sim, device: int):
        self.sim, self.device = sim, device
        self.prefilling: list[Request] = []
        self.decoding: list[Request] = []
        self.kv_pre = self.kv_dec = 0.0  # KV tokens held by the prefilling / decoding requests (running sums)
        self.epoch = 0
        self.last = sim.now
        self.paused_until = 0.0
        self.token = 0
        self.live = True

    def kv_used(self) -> float:
        return self.kv_pre + self.kv_dec

    def has_room(self, prompt_tokens: int) -> bool:
        """Room to start a request with this many context tokens (KV is allocated as tokens are made)."""
        cm = self.sim.cm
        seqs = len(self.prefilling) + len(self.decoding)
        free = (1 - cm.kv_watermark) * cm.kv_tokens - self.kv_used()
        return self.live and seqs < cm.max_seqs and prompt_tokens <= free

    def _rate(self) -> float:
        return 1.0 / self.sim.cm.step_s(self.kv_dec, len(self.decoding))

    def advance(self) -> None:
        now = self.sim.now
        start = max(self.last, self.paused_until)
        if now > start:
            dt = now - start
            if self.prefilling:
                self.prefilling[0].prefill_left_s -= dt
            elif self.decoding:
                tokens = dt * self._rate()
                for r in self.decoding:
                    r.decoded += tokens
                    r.decode_left -= tokens
                self.kv_dec += tokens * len(self.decoding)
        self.last = now

    def add(self, req: Request) -> None:
        self.advance()
        self.prefilling.append(req)
        self.kv_pre += req.kv
        self.reschedule()

    def reschedule(self) -> None:
        now = self.sim.now
        state = DeviceState.IDLE
        if now < self.paused_until:
            state, t = DeviceState.SYNC, self.paused_until
        elif self.prefilling:
            state, t = DeviceState.BUSY, now + max(0.0, self.prefilling[0].prefill_left_s)
        elif self.decoding:
            rate = self._rate()
            full_in = (self.sim.cm.kv_tokens - self.kv_used()) / (rate * len(self.decoding))
            next_done = min(r.decode_left for r in self.decoding) / rate
            state, t = DeviceState.BUSY, now + max(0.0, min(10.0, next_done, full_in))
        else:
            t = math.inf
        if self.live:
            self.sim.meter.set(self.device, state, now)
        self.token += 1
        if t < math.inf:
            self.sim.at(t, self._event, self.token)

    def _event(self, token: int) -> None:
        if token != self.token or not self.live:
            return
        self.advance()
        while self.prefilling and self.prefilling[0].prefill_left_s <= EPS:
            req = self.prefilling.pop(0)
            self.kv_pre -= req.kv
            self.kv_dec += req.kv
            ro = req.rollout
            ro.oldest_version = self.sim.engine_version if ro.oldest_version is None else ro.oldest_version
            self.decoding.append(req)
        finished = [r for r in self.decoding if r.decode_left <= 1e-6]
        self.decoding = [r for r in self.decoding if r.decode_left > 1e-6]
        for req in finished:
            self.kv_dec -= req.kv
            req.rollout.cache = (self, self.epoch)
        preempted = []
        while self.decoding and self.kv_used() >= self.sim.cm.kv_tokens - 1e-6:
            # out of KV: preempt the lowest-priority sequence (newest group); it resumes from its tokens
            victim = max(self.decoding, key=lambda r: (r.rollout.group.gid, r.rollout.index))
            self.decoding.remove(victim)
            self.kv_dec -= victim.kv
            preempted.append(self._abort(victim))
        if not self.decoding:
            self.kv_dec = 0.0  # no float drift across idle periods
        if not self.prefilling:
            self.kv_pre = 0.0
        self.reschedule()
        for req in finished:
            self.sim.turn_done(req)
        for ro in preempted:
            self.sim.preemptions += 1
            self.sim.submit(ro)
        if finished or preempted:
            self.sim.dispatch()

    @staticmethod
    def _abort(req: Request) -> Rollout:
        ro = req.rollout
        done = min(int(req.decoded), ro.decode_left - 1)  # whole tokens; at least one left to finish
        ro.context += done
        ro.decode_left -= done
        ro.cache = None
        return ro

    def evict_all(self) -> list[Rollout]:
        """Abort every request (KV lost; sampled tokens kept): the rollouts to resume elsewhere or later."""
        self.advance()
        out = [self._abort(req) for req in self.prefilling + self.decoding]
        self.prefilling, self.decoding = [], []
        self.kv_pre = self.kv_dec = 0.0
        self.reschedule()
        return out

    def weight_sync(self, pause_s: float) -> None:
        """Pause for the broadcast; in-flight requests then re-prefill their context under the new weights."""
        self.advance()
        self.epoch += 1
        self.paused_until = self.sim.now + pause_s
        pf = self.sim.cm.prefill_tokens_per_s
        for req in self.decoding:
            req.prefill_left_s = (req.rollout.context + req.decoded) / pf
        self.prefilling = self.decoding + self.prefilling
        self.decoding = []
        self.kv_pre, self.kv_dec = self.kv_pre + self.kv_dec, 0.0
        self.reschedule()


@dataclass
class Result:
    mode: Mode
    wall_s: float
    steps: int
    groups_trained: int
    groups_per_hour: float
    idle_fraction: float
    state_s: dict[str, float]
    device_s: float
    mean_staleness: float
    max_staleness: int
    dropped: int
    lends: int
    preemptions: int
    trained_ids: list[int]
    trained_groups: list[Group]
    admitted: int
    staleness_list: list[int]


class Sim:
    def __init__(
        self,
        mode: Mode,
        wl: Workload,
        cm: CostModel,
        *,
        devices: int,
        rollout_devices: int,
        steps: int,
        max_staleness: int,
        seed: int,
        growth: bool = True,
        stale_policy: StalePolicy = StalePolicy.KEEP,
    ):
        self.mode, self.wl, self.cm, self.steps, self.seed = mode, wl, cm, steps, seed
        self.devices = devices
        self.max_staleness = 0 if mode is Mode.SYNC else max_staleness
        self.growth = growth
        self.stale_policy = stale_policy
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self.seq = 0
        self.meter = Meter(devices)
        self.colocated = mode in (Mode.SYNC, Mode.COLOCATED)
        n_rollout = devices if self.colocated else rollout_devices
        if not 0 < n_rollout <= devices or (not self.colocated and n_rollout == devices):
            raise ValueError(f"rollout_devices must be in 1..{devices - 1} for the split modes")
        self.replicas = [Replica(self, d) for d in range(n_rollout)]
        self.trainer_devices = list(range(devices)) if self.colocated else list(range(n_rollout, devices))
        self.lent: list[Replica] = []
        self.queue: list[tuple[int, int, Rollout]] = []  # (group id: oldest first, tie-break, rollout)
        self.held: list[Rollout] = []  # turns waiting out a colocated training phase
        self.version = 0  # trainer
        self.engine_version = 0
        self.accepted = 0
        self.running = 0
        self.next_gid = 0
        self.ready: list[Group] = []
        self.trained: list[int] = []
        self.trained_groups: list[Group] = []
        self.dropped_ids: list[int] = []
        self.stale: list[int] = []
        self.dropped = 0
        self.completions: list[float] = []
        self.trainer_state = "idle"  # idle | training | syncing | switching_out | lent | switching_back
        self.generating = True  # colocated: False while training
        self.switch = RoleSwitch(prior_switch_s=cm.switch_prior_s)
        self.switch_started = 0.0
        self.switch_out_s = 0.0
        self.lends = 0
        self.sessions = 0  # rollouts admitted and not finished (generating, queued or in a tool call)
        self.slots_per_replica = session_slots(wl, cm)
        self.preemptions = 0
        self.done = False

    # event loop
    def at(self, t: float, fn: Callable[..., None], *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def run(self) -> Result:
        self.admit()
        self.maybe_train()
        while self.heap and not self.done:
            t, _, fn, args = heapq.heappop(self.heap)
            self.now = t
            fn(*args)
        if not self.done:
            raise RuntimeError(f"{self.mode}: the simulation stalled at version {self.version}")
        self.meter.close(self.now)
        total = self.now * self.devices
        return Result(
            mode=self.mode,
            wall_s=self.now,
            steps=self.version,
            groups_trained=len(self.trained),
            groups_per_hour=len(self.trained) / self.now * 3600,
            idle_fraction=self.meter.total[DeviceState.IDLE] / total,
            state_s={str(k): v for k, v in self.meter.total.items()},
            device_s=total,
            mean_staleness=statistics.fmean(self.stale),
            max_staleness=max(self.stale),
            dropped=self.dropped,
            lends=self.lends,
            preemptions=self.preemptions,
            trained_ids=self.trained,
            trained_groups=self.trained_groups,
            admitted=self.next_gid,
            staleness_list=self.stale,
        )

    # rollouts
    def scale(self, gid: int) -> float:
        """Length scale of the gid-th group: the same task stream in every mode (seeded per gid)."""
        last = self.steps * self.wl.batch_groups - 1
        if not self.growth or last <= 0:
            return 1.0
        return 1.0 + (self.wl.length_growth - 1.0) * min(1.0, gid / last)

    def admit(self) -> None:
        if self.colocated and not self.generating:
            return
        b = self.wl.batch_groups
        g = self.wl.group_size
        while can_admit(self.accepted, self.running, self.version, self.max_staleness, b) and (
            self.sessions + g <= self.slots_per_replica * len(self.replicas + self.lent)
        ):
            group = Group(self.next_gid, self.version)
            rng = random.Random(self.seed * 1_000_003 + self.next_gid)
            self.next_gid += 1
            self.running += 1
            self.sessions += g
            for i in range(self.wl.group_size):
                group.rollouts.append(Rollout(group, i, draw_rollout(rng, self.wl, self.scale(group.gid))))
            for ro in group.rollouts:
                ro.decode_left = ro.turns[0].decode_tokens
                ro.pending_new = ro.turns[0].new_tokens
                self.submit(ro)
        self.dispatch()

    def submit(self, ro: Rollout) -> None:
        if self.colocated and not self.generating:
            self.held.append(ro)
            return
        self.seq += 1
        heapq.heappush(self.queue, (ro.group.gid, self.seq, ro))

    def dispatch(self) -> None:
        pf = self.cm.prefill_tokens_per_s
        while self.queue:
            ro = self.queue[0][2]
            need = ro.context + ro.pending_new
            target = None
            if ro.cache is not None and ro.cache[0].live and ro.cache[0].has_room(need):
                target = ro.cache[0]
            if target is None:
                # lent engines take only what the rollout engines cannot: less work aborted at hand-back
                fits = [r for r in self.replicas if r.has_room(need)] or [
                    r for r in self.lent if r.has_room(need)
                ]
                if not fits:
                    return
                target = min(fits, key=lambda r: r.kv_used())
            heapq.heappop(self.queue)
            cached = ro.cache is not None and ro.cache[0] is target and ro.cache[1] == target.epoch
            ro.context += ro.pending_new
            prefill = ro.pending_new if cached else ro.context
            ro.pending_new = 0
            target.add(Request(ro, prefill / pf, ro.decode_left))

    def turn_done(self, req: Request) -> None:
        ro = req.rollout
        ro.context += ro.decode_left
        tool = ro.turns[ro.turn].tool_s
        ro.turn += 1
        if ro.turn < len(ro.turns):
            ro.decode_left = ro.turns[ro.turn].decode_tokens
            ro.pending_new = ro.turns[ro.turn].new_tokens
            self.at(self.now + tool, self._tool_done, ro)
            return
        ro.decode_left = 0
        self.sessions -= 1
        group = ro.group
        group.done += 1
        if group.done == len(group.rollouts):
            self.running -= 1
            self.accepted += 1
            self.ready.append(group)
            self.completions.append(self.now)
            self.on_ready()
        else:
            self.admit()

    def _tool_done(self, ro: Rollout) -> None:
        self.submit(ro)
        self.dispatch()

    # training
    def on_ready(self) -> None:
        if self.colocated:
            if self.generating and len(self.ready) >= self.wl.batch_groups:
                self.start_colocated_step()
            else:
                self.admit()
            return
        if self.trainer_state == "lent" and len(self.ready) >= self.wl.batch_groups:
            self.hand_back()
        elif self.trainer_state == "idle":
            self.maybe_train()
        self.admit()

    def take_batch(self) -> list[Group] | None:
        """The next batch of fresh groups (oldest first); stale ones are dropped and their slot reopened."""
        self.ready.sort(key=lambda g: g.oldest_version)
        kept = []
        for g in self.ready:
            if keep_group(self.stale_policy, g.oldest_version, self.version, self.max_staleness):
                kept.append(g)
            else:
                self.dropped += 1
                self.dropped_ids.append(g.gid)
                self.accepted -= 1
        self.ready = kept
        if len(self.ready) < self.wl.batch_groups:
            return None
        batch, self.ready = self.ready[: self.wl.batch_groups], self.ready[self.wl.batch_groups :]
        for g in batch:
            self.stale.append(staleness(g.oldest_version, self.version))
            self.trained.append(g.gid)
            self.trained_groups.append(g)
        return batch

    def train_s(self, batch: list[Group], devices: int) -> float:
        tokens = sum(g.tokens for g in batch)
        return tokens / (self.cm.train_tokens_per_s * devices) + self.cm.train_step_overhead_s

    def start_colocated_step(self) -> None:
        batch = self.take_batch()
        if batch is None:
            self.admit()
            return
        self.generating = False
        for rep in self.replicas:
            self.held.extend(rep.evict_all())
        self.held.extend(ro for _, _, ro in self.queue)
        self.queue.clear()
        for rep in self.replicas:
            rep.epoch += 1
            self.meter.set(rep.device, DeviceState.BUSY, self.now)
        self.at(self.now + self.train_s(batch, self.devices), self._colocated_trained)

    def _colocated_trained(self) -> None:
        self.version += 1
        for rep in self.replicas:
            self.meter.set(rep.device, DeviceState.SYNC, self.now)
        self.at(self.now + self.cm.colocated_sync_s, self._colocated_synced)

    def _colocated_synced(self) -> None:
        self.engine_version = self.version
        if self.version >= self.steps:
            self.done = True
            return
        self.generating = True
        for rep in self.replicas:
            rep.last = self.now
            rep.reschedule()
        held, self.held = self.held, []
        for ro in held:
            self.submit(ro)
        if len(self.ready) >= self.wl.batch_groups:
            self.start_colocated_step()
        else:
            self.admit()

    def set_trainer(self, state: str, device_state: DeviceState) -> None:
        self.trainer_state = state
        for d in self.trainer_devices:
            self.meter.set(d, device_state, self.now)

    def maybe_train(self) -> None:
        if self.colocated or self.trainer_state != "idle":
            return
        batch = self.take_batch()
        if batch is not None:
            self.set_trainer("training", DeviceState.BUSY)
            self.at(self.now + self.train_s(batch, len(self.trainer_devices)), self._trained)
            return
        self.set_trainer("idle", DeviceState.IDLE)
        if self.mode is Mode.SWITCH:
            missing = self.wl.batch_groups - len(self.ready)
            recent = self.completions[-2 * self.wl.batch_groups :]
            rate = (
                (len(recent) - 1) / (recent[-1] - recent[0])
                if len(recent) >= 2 and recent[-1] > recent[0]
                else 0.0
            )
            if self.switch.should_lend(expected_wait_s(missing, rate)):
                self.lends += 1
                self.switch_started = self.now
                self.set_trainer("switching_out", DeviceState.SWITCH)
                self.at(self.now + self.cm.switch_s / 2, self._lent)

    def _lent(self) -> None:
        self.trainer_state = "lent"
        self.switch_out_s = self.now - self.switch_started
        self.lent = [Replica(self, d) for d in self.trainer_devices]
        for rep in self.lent:
            rep.reschedule()
        if len(self.ready) >= self.wl.batch_groups:
            self.hand_back()
            return
        self.admit()  # the lent engines bring their session slots

    def hand_back(self) -> None:
        resumed = []
        for rep in self.lent:
            resumed.extend(rep.evict_all())
            rep.live = False
        self.lent = []
        self.set_trainer("switching_back", DeviceState.SWITCH)
        self.switch_started = self.now
        for ro in resumed:
            self.submit(ro)
        self.dispatch()
        self.at(self.now + self.cm.switch_s / 2, self._handed_back)

    def _handed_back(self) -> None:
        self.switch.observe_switch(self.switch_out_s + self.now - self.switch_started)  # out + back
        self.set_trainer("idle", DeviceState.IDLE)
        self.maybe_train()

    def _trained(self) -> None:
        self.version += 1
        self.set_trainer("syncing", DeviceState.SYNC)
        for rep in self.replicas:
            rep.weight_sync(self.cm.separate_sync_s)
        self.at(self.now + self.cm.separate_sync_s, self._synced)

    def _synced(self) -> None:
        self.engine_version = self.version
        if self.version >= self.steps:
            self.done = True
            return
        self.set_trainer("idle", DeviceState.IDLE)
        self.admit()
        self.maybe_train()


@dataclass(frozen=True)
class Setup:
    devices: int = 8
    steps: int = 16
    max_staleness: int = 2
    profile_steps: int = 4
    seed: int = 0
    stale_policy: StalePolicy = StalePolicy.KEEP


def simulate(
    mode: Mode,
    wl: Workload,
    cm: CostModel,
    setup: Setup,
    rollout_devices: int = 0,
    steps: int | None = None,
    growth: bool = True,
) -> Result:
    return Sim(
        mode,
        wl,
        cm,
        devices=setup.devices,
        rollout_devices=rollout_devices,
        steps=steps or setup.steps,
        max_staleness=setup.max_staleness,
        seed=setup.seed,
        growth=growth,
        stale_policy=setup.stale_policy,
    ).run()


def profile_splits(wl: Workload, cm: CostModel, setup: Setup) -> dict[Mode, list[tuple[int, Result]]]:
    """Each split mode at every split over the first steps' workload (growth off): what a user would
    measure before committing to a split."""
    out: dict[Mode, list[tuple[int, Result]]] = {Mode.FIXED: [], Mode.SWITCH: []}
    for k in range(1, setup.devices):
        for mode in out:
            out[mode].append((k, simulate(mode, wl, cm, setup, k, steps=setup.profile_steps, growth=False)))
    return out


def best_split(rows: list[tuple[int, Result]]) -> int:
    return max(rows, key=lambda kr: (kr[1].groups_per_hour, -kr[0]))[0]


def run_workload(wl: Workload, cm: CostModel, setup: Setup) -> dict:
    profile = profile_splits(wl, cm, setup)
    k_fixed, k_switch = best_split(profile[Mode.FIXED]), best_split(profile[Mode.SWITCH])
    runs: dict[str, tuple[Result, int]] = {
        "sync": (simulate(Mode.SYNC, wl, cm, setup), 0),
        "colocated_async": (simulate(Mode.COLOCATED, wl, cm, setup), 0),
        "fixed_split_async": (simulate(Mode.FIXED, wl, cm, setup, k_fixed), k_fixed),
        "separate_switching_same_split": (simulate(Mode.SWITCH, wl, cm, setup, k_fixed), k_fixed),
        "separate_switching": (simulate(Mode.SWITCH, wl, cm, setup, k_switch), k_switch),
    }
    sync = runs["sync"][0]
    rows = {}
    for name, (r, k) in runs.items():
        rows[name] = {
            "split": f"{k}+{setup.devices - k}" if k else f"{setup.devices} shared",
            "wall_s": round(r.wall_s, 1),
            "s_per_step": round(r.wall_s / r.steps, 1),
            "groups_per_hour": round(r.groups_per_hour, 1),
            "throughput_vs_sync": round(r.groups_per_hour / sync.groups_per_hour, 3),
            "time_ratio_vs_sync": round(r.wall_s / sync.wall_s, 3),
            "idle_fraction": round(r.idle_fraction, 3),
            "switch_fraction": round(r.state_s[DeviceState.SWITCH] / r.device_s, 3),
            "mean_staleness": round(r.mean_staleness, 2),
            "max_staleness": r.max_staleness,
            "dropped_groups": r.dropped,
            "preemptions": r.preemptions,
            "lends": r.lends,
            "trained_decode_tok_s_per_device": round(
                sum(t.decode_tokens for g in r.trained_groups for ro in g.rollouts for t in ro.turns)
                / r.device_s
            ),
        }
    sweep = {str(mode): {k: round(r.groups_per_hour, 1) for k, r in rows_} for mode, rows_ in profile.items()}
    return {"rows": rows, "profile_groups_per_hour": sweep, "split_fixed": k_fixed, "split_switch": k_switch}


COLUMNS = (
    ("split", "split"),
    ("wall_s", "wall s"),
    ("s_per_step", "s/step"),
    ("groups_per_hour", "groups/h"),
    ("throughput_vs_sync", "x sync"),
    ("idle_fraction", "idle"),
    ("switch_fraction", "switch"),
    ("mean_staleness", "stale mean"),
    ("max_staleness", "max"),
    ("dropped_groups", "dropped"),
    ("preemptions", "preempt"),
    ("lends", "lends"),
    ("trained_decode_tok_s_per_device", "trained decode tok/s/dev"),
)


def print_table(name: str, report: dict, setup: Setup) -> None:
    print(
        f"\n## {name} ({setup.devices} devices, {setup.steps} steps, max_staleness {setup.max_staleness}, "
        f"stale policy {setup.stale_policy})"
    )
    print("| mode | " + " | ".join(h for _, h in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for mode, row in report["rows"].items():
        print(f"| {mode} | " + " | ".join(str(row[k]) for k, _ in COLUMNS) + " |")
    prof = report["profile_groups_per_hour"]
    print(f"profile (first {setup.profile_steps} steps, no growth), groups/h by rollout devices:")
    for mode, by_k in prof.items():
        print(f"  {mode}: " + ", ".join(f"{k}: {v}" for k, v in by_k.items()))


def calibrate(cm: CostModel, agentic: Workload, path: Path) -> tuple[CostModel, Workload, list[str]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(
            f"{path}: cannot read calibration JSON ({e}); give the file benchmarks/rl_modes.py wrote"
        ) from e
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: calibration must be one JSON object with keys like decode_tokens_per_s")
    used = []

    def positive(key: str) -> float | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, int | float) or not value > 0:
            raise SystemExit(f"{path}: {key} must be a number > 0, got {value!r}")
        used.append(key)
        return float(value)

    if (v := positive("decode_tokens_per_s")) is not None:
        f = cm.full_replica_tokens_per_s() / v  # every decode cost scaled by the same factor
        cm = replace(cm, decode_step_s=cm.decode_step_s * f, decode_token_s=cm.decode_token_s * f,
                     decode_kv_s_per_ktoken=cm.decode_kv_s_per_ktoken * f)  # fmt: skip
    if (v := positive("prefill_tokens_per_s")) is not None:
        cm = replace(cm, prefill_tokens_per_s=v)
    if (v := positive("train_tokens_per_s")) is not None:
        cm = replace(cm, train_tokens_per_s=v)
    if (v := positive("weight_sync_s")) is not None:
        cm = replace(cm, colocated_sync_s=v, separate_sync_s=v)
    if (v := positive("tool_s_mean")) is not None:
        # lognormal mean = median * exp(sigma^2 / 2)
        agentic = replace(agentic, tool_s_median=v / math.exp(agentic.tool_s_sigma**2 / 2))
    return cm, agentic, used


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--calibration", type=Path, help="JSON with measured timings (benchmarks/rl_modes.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=Setup.steps)
    ap.add_argument("--max-staleness", type=int, default=Setup.max_staleness)
    ap.add_argument("--stale-policy", choices=list(StalePolicy), default=str(StalePolicy.KEEP))
    ap.add_argument("--small", action="store_true", help="a quick run: 4 devices, 4 steps, small batches")
    args = ap.parse_args(argv)
    cm, reasoning, agentic = CostModel(), REASONING, AGENTIC
    setup = Setup(steps=args.steps, max_staleness=args.max_staleness, seed=args.seed,
                  stale_policy=StalePolicy(args.stale_policy))  # fmt: skip
    if args.small:
        setup = replace(setup, devices=4, steps=4, profile_steps=2)
        reasoning, agentic = replace(reasoning, batch_groups=16), replace(agentic, batch_groups=8)
    used: list[str] = []
    if args.calibration:
        cm, agentic, used = calibrate(cm, agentic, args.calibration)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"calibration: {args.calibration} (keys used: {', '.join(used) or 'none'})" if args.calibration
          else "calibration: none (the GPU cost model in the docstring)")  # fmt: skip
    reports = {}
    for wl in (reasoning, agentic):
        reports[wl.name] = run_workload(wl, cm, setup)
        print_table(wl.name, reports[wl.name], setup)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    r, a = reports["reasoning"]["rows"], reports["agentic"]["rows"]
    summary = {
        "colocated_time_ratio_vs_sync": r["colocated_async"]["time_ratio_vs_sync"],
        "colocated_workload": "reasoning",
        "separate_switch_throughput_vs_sync": a["separate_switching"]["throughput_vs_sync"],
        "separate_switch_throughput_vs_fixed_async": round(
            a["separate_switching"]["groups_per_hour"] / a["fixed_split_async"]["groups_per_hour"], 3
        ),
        "separate_switch_same_split_throughput_vs_fixed_async": round(
            a["separate_switching_same_split"]["groups_per_hour"] / a["fixed_split_async"]["groups_per_hour"],
            3,
        ),
        "separate_workload": "agentic",
        "calibration_keys": used,
        "workloads": {name: rep["rows"] for name, rep in reports.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
