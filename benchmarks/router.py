"""Discrete-event simulation of agentic rollouts over engine replicas: routing strategies side by side.

Workload (seeded): sessions of several turns; each turn sends the whole history plus a new tool result
(long-tailed size), decodes a long-tailed number of tokens, then waits for a long-tailed tool call.
Replicas: continuous batching; one engine step costs `step_s + prefill_tokens * prefill_s_per_token +
decoding_rows * decode_s_per_row`; a replica admits a request only while the KV of its running requests fits
its capacity; its prefix cache keeps finished sessions' tokens (LRU, the same capacity) and is flushed at
every weight sync. A request that lands on a replica without the session's prefix prefills the whole
history again. The strategies are the real ones from `harnessrl.engine.router`, fed the state the
Router would see.

    .venv/bin/python benchmarks/router.py [--replicas 4] [--sessions 96] [--turns 12] [--seed 0] [--smoke]

Last line: JSON with makespan and prefill ratios of `cache_aware_token_load` vs `least_inflight`.
`--smoke`: 2 replicas, 8 sessions of ~3 turns (with `--real`: 2 sessions x 2 turns x 8 tokens), seconds.

`--real` runs real engines instead of the simulation: `--replicas` (2) `harnessrl engine serve` processes of
the tiny model (prefix cache on, 1 thread each), the same seeded multi-turn agentic workload (shared system
prompt, long-tailed turns, tool results and tool latencies; greedy, so every strategy sees the same
histories) through a `Router` with each strategy in turn; caches are flushed between strategies (a weight
sync). Reported per strategy: makespan, mean/p90 turn latency, prompt tokens computed vs served from the
engines' prefix caches (their `GET /stats`).

    .venv/bin/python benchmarks/router.py --real [--replicas 2] [--sessions 12] [--turns 3]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.engine.base import Engine
from harnessrl.engine.router import (
    ReplicaState,
    RouteRequest,
    RoutingStrategyName,
    make_strategy,
    prefix_hash,
)
from tests.engine.agentic import RoutedWorkload

STEP_S, PREFILL_S_PER_TOKEN, DECODE_S_PER_ROW = 0.01, 2e-5, 4e-4
PREFILL_CHUNK = 8192  # prefill tokens per engine step


@dataclass
class Turn:
    new_tokens: int
    decode_tokens: int
    tool_s: float


@dataclass
class Session:
    id: str
    turns: list[Turn]
    history: list[int] = field(default_factory=list)
    next_turn: int = 0
    cost: int = 0  # token load its request in flight added to its replica


@dataclass
class Running:
    session: Session
    prompt_len: int
    prefill_left: int
    decode_left: int
    started: float


@dataclass(frozen=True)
class TurnStart:
    session: Session


@dataclass(frozen=True)
class EngineStep:
    replica: int


@dataclass(frozen=True)
class WeightSync:
    pass


Event = TurnStart | EngineStep | WeightSync


@dataclass
class Replica:
    capacity: int
    queue: list[Running] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)
    cache: OrderedDict[str, int] = field(default_factory=OrderedDict)  # session -> cached prefix tokens
    busy: bool = False


def workload(rng: random.Random, sessions: int, turns: int) -> list[Session]:
    out = []
    for s in range(sessions):
        n = max(2, int(rng.expovariate(1 / turns)))
        out.append(
            Session(
                f"s{s}",
                [
                    Turn(
                        new_tokens=min(6000, int(rng.paretovariate(1.5) * 300)),
                        decode_tokens=min(2000, int(rng.paretovariate(1.8) * 80)),
                        tool_s=min(120.0, rng.paretovariate(1.6) * 1.5),
                    )
                    for _ in range(n)
                ],
            )
        )
    return out


def simulate(
    strategy_name: RoutingStrategyName,
    sessions: list[Session],
    replicas: int,
    capacity: int,
    threshold: float,
    sync_every_s: float,
    seed: int,
) -> dict[str, float]:
    rng = random.Random(seed)
    strategy = make_strategy(
        strategy_name,
        **({"threshold": threshold} if strategy_name == RoutingStrategyName.CACHE_AWARE_TOKEN_LOAD else {}),
    )
    states = [ReplicaState(capacity_tokens=capacity) for _ in range(replicas)]
    reps = [Replica(capacity) for _ in range(replicas)]
    events: list[tuple[float, int, Event]] = []
    counter = 0

    def push(t: float, event: Event) -> None:
        nonlocal counter
        counter += 1
        heapq.heappush(events, (t, counter, event))

    for s in sessions:
        s.history, s.next_turn = [], 0
        push(rng.uniform(0, 5), TurnStart(s))
    if sync_every_s > 0:
        push(sync_every_s, WeightSync())
    prefill_total = cached_total = 0
    latencies: list[float] = []
    finished = 0
    now = 0.0

    def kick(i: int) -> None:
        if not reps[i].busy and (reps[i].queue or reps[i].running):
            reps[i].busy = True
            push(now, EngineStep(i))

    while events and finished < len(sessions):
        now, _, event = heapq.heappop(events)
        if isinstance(event, WeightSync):
            for rep in reps:
                rep.cache.clear()
            for st in states:
                st.forget_all()
            push(now + sync_every_s, WeightSync())
        elif isinstance(event, TurnStart):
            s = event.session
            turn = s.turns[s.next_turn]
            s.history.extend(rng.randrange(50_000) for _ in range(turn.new_tokens))
            request = RouteRequest(s.history, turn.decode_tokens, s.id)
            i = strategy.choose(states, request)
            cost = len(s.history) - states[i].cached_prefix(s.id, s.history) + turn.decode_tokens
            states[i].inflight += 1
            states[i].token_load += cost
            cached = reps[i].cache.pop(s.id, 0)
            prefill = len(s.history) - cached
            prefill_total += prefill
            cached_total += cached
            reps[i].queue.append(Running(s, len(s.history), prefill, turn.decode_tokens, now))
            s.cost = cost
            kick(i)
        else:
            i = event.replica
            rep = reps[i]
            in_use = sum(r.prompt_len + r.decode_left for r in rep.running)
            while rep.queue and (not rep.running or in_use + rep.queue[0].prompt_len <= rep.capacity):
                r = rep.queue.pop(0)
                rep.running.append(r)
                in_use += r.prompt_len + r.decode_left
            budget, prefilled, decoding = PREFILL_CHUNK, 0, 0
            for r in rep.running:
                if r.prefill_left > 0 and budget > 0:
                    take = min(budget, r.prefill_left)
                    r.prefill_left -= take
                    budget -= take
                    prefilled += take
                elif r.prefill_left == 0:
                    r.decode_left -= 1
                    decoding += 1
            end = now + STEP_S + prefilled * PREFILL_S_PER_TOKEN + decoding * DECODE_S_PER_ROW
            done = [r for r in rep.running if r.prefill_left == 0 and r.decode_left <= 0]
            rep.running = [r for r in rep.running if r not in done]
            for r in done:
                s = r.session
                turn = s.turns[s.next_turn]
                s.history.extend(rng.randrange(50_000) for _ in range(turn.decode_tokens))
                latencies.append(end - r.started)
                states[i].inflight -= 1
                states[i].token_load -= s.cost
                states[i].remember(s.id, [(len(s.history), prefix_hash(s.history, len(s.history)))])
                rep.cache[s.id] = len(s.history)
                while sum(rep.cache.values()) > rep.capacity and len(rep.cache) > 1:
                    rep.cache.popitem(last=False)
                s.next_turn += 1
                if s.next_turn < len(s.turns):
                    push(end + turn.tool_s, TurnStart(s))
                else:
                    finished += 1
            rep.busy = False
            if rep.queue or rep.running:
                rep.busy = True
                push(end, EngineStep(i))
    latencies.sort()
    return {
        "makespan_s": round(now, 2),
        "prefill_tokens": prefill_total,
        "cache_hit_rate": round(cached_total / max(1, cached_total + prefill_total), 4),
        "p50_turn_s": round(latencies[len(latencies) // 2], 3),
        "p99_turn_s": round(latencies[int(len(latencies) * 0.99)], 3),
    }


def _start_engine(log: Path) -> tuple[subprocess.Popen, str]:
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harnessrl.cli", "engine", "serve", "--port", "0", "--threads", "1"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"engine did not start: {line!r}; see {log}")
    return proc, line.split()[-1]


async def _figures(engine: Engine) -> dict[str, Any]:
    """Every counter an engine server reports (`GET /stats`); empty when it reports none."""
    reported = await engine.stats()
    return dict(reported.figures) if reported is not None else {}


async def _real_strategy(
    name: RoutingStrategyName, urls: list[str], workload: RoutedWorkload, capacity: int, version: int
) -> tuple[dict[str, Any], list[list[list[int]]]]:
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.engine.router import Router
    from harnessrl.tinymodel import tiny_model_dir

    engines = [HTTPEngine(u) for u in urls]
    router = Router(engines, name, capacity_tokens=capacity)
    try:
        await router.load_weights(str(tiny_model_dir()), version)  # flushes the engines' prefix caches
        before = [await _figures(e) for e in engines]
        start = time.perf_counter()
        traces = await workload.run(router)
        makespan = time.perf_counter() - start
        after = [await _figures(e) for e in engines]
    finally:
        for e in engines:
            await e.release()
    latencies = sorted(x for t in traces for x in t.latencies)
    computed = sum(
        a["prefill_forward_tokens"] - b["prefill_forward_tokens"] for a, b in zip(after, before, strict=True)
    )
    served = sum(
        a["prefix_cache"]["hit_tokens"] - b["prefix_cache"]["hit_tokens"]
        for a, b in zip(after, before, strict=True)
    )
    return {
        "makespan_s": round(makespan, 2),
        "mean_turn_s": round(statistics.mean(latencies), 3),
        "p90_turn_s": round(latencies[int(len(latencies) * 0.9)], 3),
        "prefill_tokens": computed,
        "cache_hit_rate": round(served / max(1, served + computed), 4),
        "dispatched": router.dispatched,
        "turns": len(latencies),
    }, [t.outputs for t in traces]


def real_engines(args: argparse.Namespace) -> dict[str, Any]:
    from harnessrl.tinymodel import load_tokenizer

    workload = RoutedWorkload(load_tokenizer(), args.sessions, args.turns, args.turn_tokens, args.seed)
    procs: list[subprocess.Popen] = []
    results: dict[str, dict[str, Any]] = {}
    outputs: dict[str, list[list[list[int]]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        try:
            urls = []
            for i in range(args.replicas):
                proc, url = _start_engine(Path(tmp) / f"engine{i}.log")
                procs.append(proc)
                urls.append(url)
            for version, name in enumerate(RoutingStrategyName, start=1):
                results[name], outputs[name] = asyncio.run(
                    _real_strategy(name, urls, workload, args.capacity, version)
                )
                print(f"{name:24s} {results[name]}", file=sys.stderr)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    base, ours = results["least_inflight"], results["cache_aware_token_load"]
    return {
        "makespan_ratio_cache_aware_vs_least_inflight": round(ours["makespan_s"] / base["makespan_s"], 3),
        "mean_turn_ratio_cache_aware_vs_least_inflight": round(ours["mean_turn_s"] / base["mean_turn_s"], 3),
        "p90_turn_ratio_cache_aware_vs_least_inflight": round(ours["p90_turn_s"] / base["p90_turn_s"], 3),
        "prefill_ratio_cache_aware_vs_least_inflight": round(
            ours["prefill_tokens"] / max(1, base["prefill_tokens"]), 3
        ),
        "identical_outputs_across_strategies": len({json.dumps(o) for o in outputs.values()}) == 1,
        "strategies": results,
        "replicas": args.replicas,
        "sessions": args.sessions,
        "turns": args.turns,
        "capacity_tokens": args.capacity,
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=96)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--capacity", type=int, default=200_000, help="KV tokens per replica")
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--sync-every", type=float, default=300.0, help="weight sync period (s); 0 = never")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", action="store_true", help="real engine processes instead of the simulation")
    parser.add_argument("--turn-tokens", type=int, default=24, help="--real: max tokens per turn")
    parser.add_argument(
        "--smoke", action="store_true", help="every strategy on the smallest workload (seconds)"
    )
    args = parser.parse_args()
    if args.real:
        defaults = parser.parse_args([])
        for name, real_default in (("replicas", 2), ("sessions", 12), ("turns", 3), ("capacity", 4096)):
            if getattr(args, name) == getattr(defaults, name):
                setattr(args, name, real_default)
        if args.smoke:
            args.replicas, args.sessions, args.turns, args.turn_tokens = 2, 2, 2, 8
        print(json.dumps(real_engines(args)))
        return 0
    if args.smoke:
        args.replicas, args.sessions, args.turns = 2, 8, 3

    results = {}
    for name in RoutingStrategyName:
        sessions = workload(random.Random(args.seed), args.sessions, args.turns)
        results[name] = simulate(
            name, sessions, args.replicas, args.capacity, args.threshold, args.sync_every, args.seed
        )
        print(f"{name:24s} {results[name]}", file=sys.stderr)
    base, ours = results["least_inflight"], results["cache_aware_token_load"]
    print(
        json.dumps(
            {
                "makespan_ratio_cache_aware_vs_least_inflight": round(
                    ours["makespan_s"] / base["makespan_s"], 3
                ),
                "prefill_ratio_cache_aware_vs_least_inflight": round(
                    ours["prefill_tokens"] / base["prefill_tokens"], 3
                ),
                "p99_turn_ratio_cache_aware_vs_least_inflight": round(
                    ours["p99_turn_s"] / base["p99_turn_s"], 3
                ),
                "cache_hit_rate": {k: v["cache_hit_rate"] for k, v in results.items()},
                "makespan_s": {k: v["makespan_s"] for k, v in results.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
