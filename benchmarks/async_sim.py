"""Discrete-event simulation of the RL loop's schedules at cluster scale: sync, colocated async (partial
rollouts), fully-async with a fixed device split, and separate async with role switching.

One file on purpose (a benchmark script): the event loop, the engine model, the four schedules and the
report belong together and are read together; the policies themselves are the real ones from
`harnessrl.rl.admission` (`can_admit`, `keep_group`) and `harnessrl.rl.role_switch` (`RoleSwitch`).

    .venv/bin/python benchmarks/async_sim.py [--calibration FILE] [--max-staleness 1]
        [--stale-policy keep|drop] [--steps 16] [--seed 0] [--smoke] [--fixed-split K]
        [--keep-kv-on-sync] [--kv-offload] [--kv-offload-at-hand-back] [--recompute-old-logprobs]
        [--sensitivity]

Last line: one JSON object with `colocated_time_ratio_vs_sync` (reasoning workload, where Uni-Agent reports
its -35.4% wall-clock), `separate_switch_throughput_vs_sync` and `separate_switch_throughput_vs_fixed_async`
(agentic workload, where it reports >2x sync and ~1.4x the fully-async baseline), `targets_met` (issue 10's
bounds: <= 0.646, >= 2.0, >= 1.4), the mechanisms switched on, the per-workload rows and, with
`--sensitivity`, each headline with one assumption at a low and a high value (`LEVERS`; ~5 min of CPU).

Assumptions (each a parameter of `CostModel`, `Workload` or `Setup`). "The loop" is harnessrl's RL loop
(harnessrl/rl/, harnessrl/train/trainer.py); public sources are cited by URL.

Devices. 8 H100 SXM (80 GB HBM at 3.35 TB/s, ~989 dense bf16 TFLOP/s), an 8B dense model shaped like Llama
3.1 8B (32 layers, d_model 4,096, 8 KV heads x 128 dims), one inference replica per GPU (TP=1). Sync and
colocated use all devices for both roles; the split modes give `rollout_devices` to inference and the rest
to the trainer (FSDP over its devices).

Decode (continuous batching, fluid): every running sequence advances one token per engine step; a step
takes `decode_step_s` (reading 16 GB of weights at ~60% of HBM bandwidth plus launch overhead) + per
sequence `decode_token_s` (its FLOPs) + `decode_kv_s_per_ktoken` per 1,000 context tokens (reading its KV
cache: `kv_bytes_per_token` = 128 KB for this shape at ~60% of HBM bandwidth). Check: 256 sequences at
~600-token contexts decode ~10k tokens/s per GPU, the order of published vLLM figures for Llama 3.1 8B on
one H100 (~12.5k tokens/s, https://www.morphllm.com/vllm-benchmarks); at 4k contexts reading the KV
dominates (~2.7k tokens/s). KV (`kv_tokens`, the ~58 GB left after weights and activations) is allocated as
tokens are made: a request starts only while `kv_watermark` of the cache stays free and the replica runs
fewer than `max_seqs`; when the cache fills, the lowest-priority sequence (newest group) is preempted,
keeps its tokens and re-prefills its context when it resumes (recompute preemption, as vLLM does).
Requests wait in one router queue, oldest group first; a request goes to the replica holding its session's
prefix when that replica has room, else to the rollout replica with most free KV (lent replicas take only
what the rollout replicas have no room for).

Session slots: an engine takes at most `kv_tokens / mean context held` sessions in flight (generating,
queued or in a tool call; `session_slots`), so that a session's prefix can stay cached between turns; a
group is admitted only when `can_admit` allows it and its G sessions fit the slots of the engines serving
now (lent engines add theirs).

Prefill: `prefill_tokens_per_s` per replica for a token at position 0 (2N = 16 GFLOP at ~40% MFU); a token
at position t costs (1 + t / `attn_tokens`) times that, its attention (4 L d t FLOPs) beside the dense 2N,
`attn_tokens` = N / (2 L d) ~ 30,500 for this shape. Serial with decode on that replica (chunked prefill
packs both in one step; the total time is the same). A session's next turn prefills only its new tokens when
its prefix is still cached on the replica it lands on; the whole context otherwise.

Training: what the loop's trainer computes: one forward and one backward over every token of every
trajectory (prompt + all turns: one sample per rollout). With `ppo_epochs = 1` (its default) pi_old is the
same forward's log-prob, detached, and the truncated IS weight uses the engine's behaviour log-probs, so no
extra forward recomputes old log-probs; `kl_coef = 0` (default) loads no reference model. That is 6N FLOPs
per token plus attention. `train_tokens_per_s` = 6,000 per GPU on `train_ref_tokens` = 8,192-token
sequences: torchtitan measured 5,762 (eager) to 6,667 (torch.compile) tokens/s/GPU training Llama 3.1 8B
with FSDP on 8 H100s at that length, 33-39% MFU
(https://github.com/pytorch/torchtitan/blob/main/docs/performance.md). A sequence of T tokens costs
T (1 + T / (2 `attn_tokens`)) relative to that reference (attention again): 8k sequences train at the
measured rate, 32k ones ~1.35x slower per token. `--recompute-old-logprobs` adds the forward verl runs by
default to recompute old log-probs (x 4/3). Assumes `train.train.precision: bf16` (the trainer's default is
fp32). Plus `train_step_overhead_s` per optimizer step.

Weight sync. Colocated (and sync) `colocated_sync_s` = 8 s: the step's transitions in a colocated stack:
trainer states offloaded, the engine woken (vLLM sleep mode level 1 keeps the weights in host memory and
discards the KV cache, https://docs.vllm.ai/en/latest/features/sleep_mode/) with the new weights; a colocated
Megatron + vLLM stack measured 8.3-11.3 s of trainer offload/onload per step even for a 0.6B model on one GPU,
mostly process-group teardown and rebuild (https://github.com/vllm-project/vime/issues/442). Separate
`separate_sync_s` = 3 s: an NCCL broadcast of 16 GB of bf16 weights inside one NVLink node; verl measured 11.0
s for a full NCCL broadcast of Qwen3-8B across two nodes and 3.0 s with its sharded delta sync
(https://github.com/verl-project/verl/pull/7324). During it the engines pause. Then, by default, every
in-flight request re-prefills its context and every prefix cache is flushed: what the loop's vLLM client does
(pause(mode=keep), load, reset_prefix_cache(reset_running_requests=true), resume) and what AReaL's
interruptible rollouts do (https://arxiv.org/abs/2505.24298). `keep_kv_on_sync` (`--keep-kv-on-sync`): the KV
the old weights computed survives and decoding continues on it, PipelineRL's in-flight weight update, whose
paper reports the added off-policyness negligible (https://arxiv.org/abs/2509.19128); vLLM exposes it as
pause_generation(mode="keep", clear_cache=False) (https://docs.vllm.ai/en/latest/training/async_rl/). The
loop's LocalEngine already keeps it; its vLLM path would drop the reset (a GPU-path item).

Colocated step: as in the loop (gateway pause with abort), every in-flight request is aborted and kept as a
partial rollout (its tokens stay, its KV is lost: the engine sleeps so the trainer gets the memory), sessions
in a tool call finish it meanwhile, the batch trains on every device, the weights sync, and the aborted
requests resume, re-prefilling their whole context. `kv_offload` (`--kv-offload`): their KV is copied to host
memory before the step and back when each resumes, at `host_bytes_per_s` (25 GB/s, ~40% of PCIe Gen5
x16's peak) instead of recomputed (old weights' KV, as with `keep_kv_on_sync`; vLLM's KV offloading connector,
https://docs.vllm.ai/en/latest/api/vllm/v1/kv_offload/, or LMCache; up to ~58 GB of host memory per GPU). The
loop does not do it (a GPU-path item). Cached prefixes of sessions in a tool call are lost either way.
`handback_kv_offload` (`--kv-offload-at-hand-back`) does the same at a role-switch hand-back: the lent
engines' in-flight KV goes to host memory and resumes on a rollout engine from there; the copy delays the
hand-back, so it trades trainer time for rollout time (not in the loop either).

Role switch: lending the trainer's devices costs `switch_s` = 12 s out + back (offload trainer states to
host, wake an engine with the current weights; the reverse), half each way, the devices idle meanwhile; the
offload/onload measurement above (8-11 s) is the nearest public figure. The `RoleSwitch` starts from the
conservative prior `switch_prior_s` and learns the measured cost. Expected wait = groups still missing for
the next step / the group completion rate over the last `2 * batch_groups` completions. When the step's
data is ready the lent engines are handed back: their requests are aborted (partial rollouts, resumed on
the rollout pool).

Staleness: the same admission rule as the loop (`can_admit` on accepted + running vs
(max_staleness + version + 1) x batch) in every async mode, without the loop's stop at the run's last batch
(the figures are the schedules' over `--steps`, not a run's end), with the loop's default `max_staleness = 1`,
and the per-group `keep_group` check at train time with `--stale-policy`: `keep` (default, as in the loop: a
long-tail partial rollout whose oldest token is older than the bound is still trained, TIS correcting it)
or `drop` (the group is discarded and its slot regenerated). Staleness = trainer version at training - the
oldest policy version among the group's tokens. The trainer takes ready groups oldest first. Sync is
colocated with `max_staleness = 0`: it admits one batch, waits for all of it, trains, syncs.

Workloads (lengths lognormal, seeded per group; all G rollouts of a group are independent draws; the
distributions are assumptions: the seeds give none):
- reasoning: single turn, 512-token prompt, response median 3,000 tokens, sigma 0.9 (mean ~4.5k), capped at
  16,384 (a DAPO-style math/code setup); G=8, 64 groups per step. What widens sync's bubble is the longest
  response of a step against the mean: with 512 responses a step, the cap bounds the longest one, so past
  the point where the tail reaches the cap a larger sigma adds work without lengthening sync's step.
- agentic: SWE-style ReAct sessions: 2,000-token prompt (system + tools + issue), turns median 12, sigma 0.6
  (long tail to the cap of 40), each turn decodes median 250 tokens (sigma 0.8, cap 2,048), then a tool call
  of median 6 s (lognormal sigma 1.0: mean ~10 s; cap 300 s: running tests, installs) whose result adds
  median 600 tokens; a session stops at the 32k context cap. The engine is free during tool time.
  G=8, 32 groups per step.
- Both lengthen during training (`length_growth` 1.5: response length / turn count scale linearly from 1x
  for the first group generated to that factor for the last one trained), the drift the seeds give as the
  reason a fixed split becomes misaligned; its size is an assumption (published runs show growth, U shapes
  and declines: https://zoeyli.com/reinforcement%20learning/research/understanding-length-dynamics/). Group
  n is the same draw in every mode, so every mode trains the same task stream.
- Splits: each split mode runs at the split a user would pick by profiling the start of the run (its best
  throughput over the first `profile_steps` steps with growth off, every split tried; `--fixed-split K`
  fixes the baseline's instead); role switching also runs at the fixed mode's split (the mechanism alone).
  The profile of every split is printed.

Calibration: `--calibration FILE` (the JSON `benchmarks/rl_modes.py` writes, or any with these keys) replaces
the GPU cost model's numbers by measured ones: `decode_tokens_per_s` (scales every decode cost so a full
replica decodes that many tokens/s at 4,096-token contexts), `prefill_tokens_per_s`, `train_tokens_per_s`
(measured means: the attention term is dropped), `weight_sync_s` (both sync costs), `tool_s_mean` (scales
the agentic tool-time distribution to that mean). Other keys are ignored; the keys used are printed.
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
    prefill_tokens_per_s: float = 25_000.0  # dense FLOPs only (a token at position 0)
    attn_tokens: float = (
        30_500.0  # position where a token's attention FLOPs equal its dense ones: N / (2 L d)
    )
    train_tokens_per_s: float = 6_000.0  # forward + backward, measured on train_ref_tokens-long sequences
    train_ref_tokens: int = 8_192
    train_recompute_old_logprobs: bool = False  # one more forward per step (verl's default; not the loop's)
    train_step_overhead_s: float = 2.0
    colocated_sync_s: float = 8.0
    separate_sync_s: float = 3.0
    switch_s: float = 12.0
    switch_prior_s: float = 30.0
    kv_bytes_per_token: int = 131_072  # 32 layers x 8 KV heads x 128 dims x (K, V) x bf16
    host_bytes_per_s: float = 25e9  # device <-> host copy (PCIe Gen5 x16: ~40% of its 64 GB/s peak)
    keep_kv_on_sync: bool = False  # separate modes: in-flight KV survives a weight update (PipelineRL)
    kv_offload: bool = False  # colocated: the KV of requests aborted for a step waits in host memory
    handback_kv_offload: bool = False  # role switch: the lent engines' in-flight KV goes to host at hand-back

    def step_s(self, contexts: float, seqs: int) -> float:
        return self.decode_step_s + seqs * self.decode_token_s + contexts / 1000 * self.decode_kv_s_per_ktoken

    def prefill_s(self, start: float, end: float) -> float:
        """Seconds to prefill context positions [start, end): dense FLOPs plus attention, which grows with
        the position (a token at position t attends to t earlier ones)."""
        return (end - start) * (1 + (start + end) / 2 / self.attn_tokens) / self.prefill_tokens_per_s

    def train_seq_s(self, tokens: float) -> float:
        """Device-seconds to train one sequence (forward + backward, plus the forward that recomputes the
        old log-probs when `train_recompute_old_logprobs`)."""
        per_token = (1 + tokens / 2 / self.attn_tokens) / (1 + self.train_ref_tokens / 2 / self.attn_tokens)
        passes = 4 / 3 if self.train_recompute_old_logprobs else 1.0  # (2N fwd + 4N bwd + 2N fwd) / 6N
        return tokens * per_token * passes / self.train_tokens_per_s

    def host_copy_s(self, tokens: float) -> float:
        """Seconds to copy the KV of this many tokens between device and host memory (one way)."""
        return tokens * self.kv_bytes_per_token / self.host_bytes_per_s

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
    on_host: int = 0  # context tokens whose KV waits in host memory (colocated `kv_offload`)
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
        """Pause for the broadcast. Then, by default, in-flight requests re-prefill their context under the
        new weights and every cached prefix is gone (vLLM: reset_prefix_cache(reset_running_requests), as
        harnessrl's vLLM client calls it; AReaL); with `keep_kv_on_sync` both survive and decoding goes on
        from the old weights' KV (PipelineRL's in-flight update; vLLM pause(mode=keep, clear_cache=False))."""
        self.advance()
        self.paused_until = self.sim.now + pause_s
        cm = self.sim.cm
        if cm.keep_kv_on_sync:
            self.reschedule()
            return
        self.epoch += 1
        for req in self.decoding:
            kv = req.rollout.context + req.decoded
            req.prefill_left_s = cm.prefill_s(0, kv)
            self.sim.recomputed_tokens += kv
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
    recomputed_tokens: int
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
        self.recomputed_tokens = 0.0
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
            recomputed_tokens=round(self.recomputed_tokens),
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
            start = ro.context if cached else 0
            seconds = 0.0
            if ro.on_host:  # colocated KV offload: its KV comes back from host memory
                seconds, start = self.cm.host_copy_s(ro.on_host), ro.on_host
                ro.on_host = 0
            self.recomputed_tokens += ro.context - start  # KV computed before, lost, computed again
            ro.context += ro.pending_new
            seconds += self.cm.prefill_s(start, ro.context)
            ro.pending_new = 0
            target.add(Request(ro, seconds, ro.decode_left))

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
        device_s = sum(self.cm.train_seq_s(ro.context) for g in batch for ro in g.rollouts)
        return device_s / devices + self.cm.train_step_overhead_s

    def start_colocated_step(self) -> None:
        batch = self.take_batch()
        if batch is None:
            self.admit()
            return
        self.generating = False
        offload_s = 0.0
        for rep in self.replicas:
            evicted = rep.evict_all()
            if self.cm.kv_offload:  # copied out before training, back in when each resumes (dispatch)
                for ro in evicted:
                    ro.on_host = ro.context
                offload_s = max(offload_s, self.cm.host_copy_s(sum(ro.context for ro in evicted)))
            self.held.extend(evicted)
        self.held.extend(ro for _, _, ro in self.queue)
        self.queue.clear()
        for rep in self.replicas:
            rep.epoch += 1
            self.meter.set(rep.device, DeviceState.SYNC if offload_s else DeviceState.BUSY, self.now)
        self.at(self.now + offload_s, self._colocated_train, batch)

    def _colocated_train(self, batch: list[Group]) -> None:
        for rep in self.replicas:
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
        copy_s = 0.0
        for rep in self.lent:
            evicted = rep.evict_all()
            if self.cm.handback_kv_offload:  # to host first (the trainer needs the memory), then to an engine
                for ro in evicted:
                    ro.on_host = ro.context
                copy_s = max(copy_s, self.cm.host_copy_s(sum(ro.context for ro in evicted)))
            resumed.extend(evicted)
            rep.live = False
        self.lent = []
        self.set_trainer("switching_back", DeviceState.SWITCH)
        self.switch_started = self.now
        if copy_s:
            self.at(self.now + copy_s, self._resume, resumed)
        else:
            self._resume(resumed)
        self.at(self.now + copy_s + self.cm.switch_s / 2, self._handed_back)

    def _resume(self, rollouts: list[Rollout]) -> None:
        for ro in rollouts:
            self.submit(ro)
        self.dispatch()

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
    max_staleness: int = 1  # the loop's default (RLConfig.max_staleness)
    profile_steps: int = 4
    seed: int = 0
    stale_policy: StalePolicy = StalePolicy.KEEP
    fixed_split: int = 0  # rollout devices of the fixed-split baseline; 0: the best profiled split


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
    k_fixed = setup.fixed_split or best_split(profile[Mode.FIXED])
    k_switch = best_split(profile[Mode.SWITCH])
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
            "recomputed_ktokens": round(r.recomputed_tokens / 1000),
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
    ("recomputed_ktokens", "recomputed KV (k tokens)"),
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
        cm = replace(cm, prefill_tokens_per_s=v, attn_tokens=math.inf)  # a measured mean holds attention
    if (v := positive("train_tokens_per_s")) is not None:
        cm = replace(cm, train_tokens_per_s=v, attn_tokens=math.inf)
    if (v := positive("weight_sync_s")) is not None:
        cm = replace(cm, colocated_sync_s=v, separate_sync_s=v)
    if (v := positive("tool_s_mean")) is not None:
        # lognormal mean = median * exp(sigma^2 / 2)
        agentic = replace(agentic, tool_s_median=v / math.exp(agentic.tool_s_sigma**2 / 2))
    return cm, agentic, used


TARGETS = {  # issue 10's done-when, from the seeds' figures
    "colocated_time_ratio_vs_sync": ("<=", 0.646),
    "separate_switch_throughput_vs_sync": (">=", 2.0),
    "separate_switch_throughput_vs_fixed_async": (">=", 1.4),
}


def met(key: str, value: float) -> bool:
    op, bound = TARGETS[key]
    return value <= bound if op == "<=" else value >= bound


@dataclass(frozen=True)
class Inputs:
    cm: CostModel
    reasoning: Workload
    agentic: Workload
    setup: Setup


def headlines(inp: Inputs, workloads: tuple[str, ...] = ("reasoning", "agentic")) -> dict[str, float]:
    """The three headline ratios, running only the modes they need (the split modes at their profiled
    splits, as in `run_workload`)."""
    out: dict[str, float] = {}
    cm, setup = inp.cm, inp.setup
    if "reasoning" in workloads:
        sync = simulate(Mode.SYNC, inp.reasoning, cm, setup)
        coloc = simulate(Mode.COLOCATED, inp.reasoning, cm, setup)
        out["colocated_time_ratio_vs_sync"] = round(coloc.wall_s / sync.wall_s, 3)
    if "agentic" in workloads:
        profile = profile_splits(inp.agentic, cm, setup)
        sync = simulate(Mode.SYNC, inp.agentic, cm, setup)
        fixed = simulate(
            Mode.FIXED, inp.agentic, cm, setup, setup.fixed_split or best_split(profile[Mode.FIXED])
        )
        switch = simulate(Mode.SWITCH, inp.agentic, cm, setup, best_split(profile[Mode.SWITCH]))
        out["separate_switch_throughput_vs_sync"] = round(switch.groups_per_hour / sync.groups_per_hour, 3)
        out["separate_switch_throughput_vs_fixed_async"] = round(
            switch.groups_per_hour / fixed.groups_per_hour, 3
        )
    return out


def _cm(**kw: object) -> Callable[[Inputs], Inputs]:
    return lambda i: replace(i, cm=replace(i.cm, **kw))


def _wl(reasoning: dict, agentic: dict) -> Callable[[Inputs], Inputs]:
    return lambda i: replace(
        i, reasoning=replace(i.reasoning, **reasoning), agentic=replace(i.agentic, **agentic)
    )


def _tool_mean(mean_s: float) -> Callable[[Inputs], Inputs]:
    def change(i: Inputs) -> Inputs:  # lognormal mean = median * exp(sigma^2 / 2)
        return replace(
            i, agentic=replace(i.agentic, tool_s_median=mean_s / math.exp(i.agentic.tool_s_sigma**2 / 2))
        )

    return change


BOTH, AGENTIC_ONLY, REASONING_ONLY = ("reasoning", "agentic"), ("agentic",), ("reasoning",)
# (assumption, value, change from the defaults, the workloads whose headline it can move)
LEVERS: tuple[tuple[str, str, Callable[[Inputs], Inputs], tuple[str, ...]], ...] = (
    ("train cost", "9,000 tok/s/GPU (FP8 + compile)", _cm(train_tokens_per_s=9_000.0), BOTH),
    ("train cost", "+ old log-prob recompute (verl)", _cm(train_recompute_old_logprobs=True), BOTH),
    (
        "tail sigma (reasoning / agentic turns)",
        "0.6 / 0.3",
        _wl({"decode_sigma": 0.6}, {"turns_sigma": 0.3}),
        BOTH,
    ),
    (
        "tail sigma (reasoning / agentic turns)",
        "1.2 / 0.9",
        _wl({"decode_sigma": 1.2}, {"turns_sigma": 0.9}),
        BOTH,
    ),
    ("length growth over the run", "1.0x", _wl({"length_growth": 1.0}, {"length_growth": 1.0}), BOTH),
    ("length growth over the run", "2.0x", _wl({"length_growth": 2.0}, {"length_growth": 2.0}), BOTH),
    ("weight sync (colocated / separate)", "3 / 1 s", _cm(colocated_sync_s=3.0, separate_sync_s=1.0), BOTH),
    (
        "weight sync (colocated / separate)",
        "15 / 11 s",
        _cm(colocated_sync_s=15.0, separate_sync_s=11.0),
        BOTH,
    ),
    ("role switch out + back", "4 s", _cm(switch_s=4.0), AGENTIC_ONLY),
    ("role switch out + back", "30 s", _cm(switch_s=30.0), AGENTIC_ONLY),
    ("agentic tool time mean", "3 s", _tool_mean(3.0), AGENTIC_ONLY),
    ("agentic tool time mean", "30 s", _tool_mean(30.0), AGENTIC_ONLY),
    ("reasoning response cap", "8,192", _wl({"decode_max": 8192, "context_max": 8704}, {}), REASONING_ONLY),
    (
        "reasoning response cap",
        "32,768",
        _wl({"decode_max": 32768, "context_max": 33280}, {}),
        REASONING_ONLY,
    ),
    (
        "fixed-split baseline",
        "4+4 (even, not profiled)",
        lambda i: replace(i, setup=replace(i.setup, fixed_split=4)),
        AGENTIC_ONLY,
    ),
    ("max_staleness", "2", lambda i: replace(i, setup=replace(i.setup, max_staleness=2)), BOTH),
    ("max_staleness", "4", lambda i: replace(i, setup=replace(i.setup, max_staleness=4)), BOTH),
    ("mechanism", "keep_kv_on_sync on", _cm(keep_kv_on_sync=True), AGENTIC_ONLY),
    ("mechanism", "kv_offload on", _cm(kv_offload=True), REASONING_ONLY),
    ("mechanism", "handback_kv_offload on", _cm(handback_kv_offload=True), AGENTIC_ONLY),
    ("mechanism", "all three on", _cm(keep_kv_on_sync=True, kv_offload=True, handback_kv_offload=True), BOTH),
)


def sensitivity(
    inp: Inputs,
    levers: tuple[tuple[str, str, Callable[[Inputs], Inputs], tuple[str, ...]], ...] = LEVERS,
    echo: Callable[[str], None] = print,
) -> list[dict]:
    """Each lever's headlines (one assumption changed, the rest at their defaults); a headline a lever
    cannot move is the default's, marked as not rerun."""
    base = headlines(inp)
    rows = [{"assumption": "defaults", "value": "(as in the docstring)", **base, "rerun": list(BOTH)}]
    echo(f"sensitivity: defaults {base}")
    for assumption, value, change, workloads in levers:
        row = {"assumption": assumption, "value": value, **base, **headlines(change(inp), workloads)}
        row["rerun"] = list(workloads)
        rows.append(row)
        echo(f"sensitivity: {assumption} = {value}: { ({k: row[k] for k in TARGETS}) }")
    return rows


def print_sensitivity(rows: list[dict]) -> None:
    print("\n## sensitivity (one assumption changed at a time; * = meets the target; - = cannot move it)")
    print("| assumption | value | colocated time / sync (reasoning) | switching / sync (agentic) "
          "| switching / fixed (agentic) |")  # fmt: skip
    print("|---|---|---|---|---|")
    owner = {"colocated_time_ratio_vs_sync": "reasoning"}
    for row in rows:
        cells = []
        for key in TARGETS:
            moved = owner.get(key, "agentic") in row["rerun"]
            cells.append(f"{row[key]}{'*' if met(key, row[key]) else ''}" if moved else "-")
        print(f"| {row['assumption']} | {row['value']} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--calibration", type=Path, help="JSON with measured timings (benchmarks/rl_modes.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=Setup.steps)
    ap.add_argument("--max-staleness", type=int, default=Setup.max_staleness)
    ap.add_argument("--stale-policy", choices=list(StalePolicy), default=str(StalePolicy.KEEP))
    ap.add_argument("--smoke", "--small", action="store_true",
                    help="a quick run (seconds): 4 devices, 4 steps, small batches")  # fmt: skip
    ap.add_argument("--fixed-split", type=int, default=0, help="rollout devices of the fixed-split baseline "
                    "(default 0: the best profiled split)")  # fmt: skip
    ap.add_argument(
        "--keep-kv-on-sync",
        action="store_true",
        help="separate modes: in-flight KV and cached prefixes survive a weight update (PipelineRL)",
    )
    ap.add_argument(
        "--kv-offload",
        action="store_true",
        help="colocated: the KV of requests aborted for a step waits in host memory instead of recompute",
    )
    ap.add_argument(
        "--kv-offload-at-hand-back",
        action="store_true",
        help="role switch: the lent engines' in-flight KV goes to host memory at hand-back, not recomputed",
    )
    ap.add_argument(
        "--recompute-old-logprobs",
        action="store_true",
        help="the trainer recomputes the old log-probs (one more forward; verl's default)",
    )
    ap.add_argument(
        "--sensitivity",
        action="store_true",
        help="also print each headline with one assumption at a low and a high value (minutes)",
    )
    args = ap.parse_args(argv)
    cm = CostModel(keep_kv_on_sync=args.keep_kv_on_sync, kv_offload=args.kv_offload,
                   handback_kv_offload=args.kv_offload_at_hand_back,
                   train_recompute_old_logprobs=args.recompute_old_logprobs)  # fmt: skip
    reasoning, agentic = REASONING, AGENTIC
    setup = Setup(steps=args.steps, max_staleness=args.max_staleness, seed=args.seed,
                  stale_policy=StalePolicy(args.stale_policy), fixed_split=args.fixed_split)  # fmt: skip
    if args.smoke:
        setup = replace(setup, devices=4, steps=4, profile_steps=2)
        reasoning, agentic = replace(reasoning, batch_groups=16), replace(agentic, batch_groups=8)
    if not 0 <= args.fixed_split < setup.devices:
        raise SystemExit(f"--fixed-split must be in 1..{setup.devices - 1} (0: the best profiled split)")
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
        "targets_met": {k: met(k, v) for k, v in summary_headlines(reports).items()},
        "mechanisms": {
            "keep_kv_on_sync": cm.keep_kv_on_sync,
            "kv_offload": cm.kv_offload,
            "handback_kv_offload": cm.handback_kv_offload,
            "train_recompute_old_logprobs": cm.train_recompute_old_logprobs,
        },  # fmt: skip
        "max_staleness": setup.max_staleness,
        "calibration_keys": used,
        "workloads": {name: rep["rows"] for name, rep in reports.items()},
    }
    if args.sensitivity:
        rows = sensitivity(Inputs(cm, reasoning, agentic, setup), echo=lambda line: print(line, flush=True))
        print_sensitivity(rows)
        summary["sensitivity"] = rows
    print(json.dumps(summary))


def summary_headlines(reports: dict) -> dict[str, float]:
    r, a = reports["reasoning"]["rows"], reports["agentic"]["rows"]
    return {
        "colocated_time_ratio_vs_sync": r["colocated_async"]["time_ratio_vs_sync"],
        "separate_switch_throughput_vs_sync": a["separate_switching"]["throughput_vs_sync"],
        "separate_switch_throughput_vs_fixed_async": round(
            a["separate_switching"]["groups_per_hour"] / a["fixed_split_async"]["groups_per_hour"], 3
        ),
    }


if __name__ == "__main__":
    main()
