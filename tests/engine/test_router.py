"""Routing decisions (deterministic, on replica state) and the Router over real loopback engine servers."""

import asyncio

import pytest

from harnessrl.engine.base import FinishReason, SamplingParams
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.engine.router import (
    CacheAwareTokenLoad,
    LeastInflight,
    ReplicaState,
    RoundRobin,
    Router,
    RouteRequest,
    make_strategy,
    prefix_hash,
)
from tests.engine.support import RecordedServer, recorded


def replicas(n=3, capacity=10_000):
    return [ReplicaState(capacity_tokens=capacity) for _ in range(n)]


def resident(replica: ReplicaState, session: str, tokens: list[int]) -> None:
    replica.remember(session, [(len(tokens), prefix_hash(tokens, len(tokens)))])


def test_round_robin_cycles():
    strategy, reps = RoundRobin(), replicas()
    assert [strategy.choose(reps, RouteRequest([1], 8)) for _ in range(4)] == [0, 1, 2, 0]


def test_least_inflight_picks_idlest_and_sticks_forever():
    strategy, reps = LeastInflight(), replicas()
    reps[0].inflight, reps[1].inflight, reps[2].inflight = 2, 0, 1
    assert strategy.choose(reps, RouteRequest([1], 8, "s")) == 1
    reps[1].inflight = 50  # the baseline's flaw: a long-tail session stays pinned to a busy replica
    assert strategy.choose(reps, RouteRequest([1], 8, "s")) == 1
    assert strategy.choose(reps, RouteRequest([1], 8, "t")) == 2


def test_cache_aware_prefers_replica_holding_the_prefix_under_threshold():
    strategy, reps = CacheAwareTokenLoad(threshold=0.8), replicas()
    history = list(range(2000))
    resident(reps[2], "s", history)
    reps[2].token_load = 3000  # busier than the others, but under the threshold with this request
    request = RouteRequest(history + [7, 8, 9], 100, "s")
    assert strategy.cost(reps[2], request) == 3 + 100
    assert strategy.choose(reps, request) == 2 and strategy.sticky_hits == 1


def test_cache_aware_breaks_stickiness_over_threshold():
    strategy, reps = CacheAwareTokenLoad(threshold=0.8), replicas()
    history = list(range(2000))
    resident(reps[0], "s", history)
    reps[0].token_load = 7950  # (7950 + 3 + 100) / 10000 > 0.8
    reps[1].token_load = 500
    assert strategy.choose(reps, RouteRequest(history + [1, 2, 3], 100, "s")) == 2  # idlest in tokens
    assert strategy.sticky_breaks == 1


def test_cache_aware_counts_tokens_not_requests():
    strategy, reps = CacheAwareTokenLoad(), replicas(2)
    reps[0].inflight, reps[0].token_load = 1, 6000  # one huge prefill
    reps[1].inflight, reps[1].token_load = 3, 300  # three short decodes
    assert strategy.choose(reps, RouteRequest(list(range(100)), 50, "new")) == 1
    assert LeastInflight().choose(reps, RouteRequest(list(range(100)), 50, "new")) == 0


def test_cache_aware_residency_follows_rollback_and_mismatch():
    strategy, reps = CacheAwareTokenLoad(), replicas(2)
    prompt, sampled = list(range(500)), [9001, 9002, 9003]
    full = prompt + sampled
    reps[1].remember(
        "s", [(len(prompt), prefix_hash(full, len(prompt))), (len(full), prefix_hash(full, len(full)))]
    )
    reps[0].token_load = 0
    reps[1].token_load = 100
    # extends prompt + sampled tokens: full prefix cached on replica 1
    assert reps[1].cached_prefix("s", full + [5]) == len(full)
    # rolls back the last assistant turn: the prompt part is still cached
    assert reps[1].cached_prefix("s", prompt + [42, 43]) == len(prompt)
    assert strategy.choose(reps, RouteRequest(prompt + [42, 43], 10, "s")) == 1
    # a rewritten history (compaction): nothing cached, goes to the least loaded replica
    assert reps[1].cached_prefix("s", [7] + prompt) == 0
    assert strategy.choose(reps, RouteRequest([7] + prompt, 10, "s")) == 0


def test_residency_is_evicted_lru_beyond_capacity():
    rep = ReplicaState(capacity_tokens=1000)
    resident(rep, "a", list(range(600)))
    resident(rep, "b", list(range(300)))
    resident(rep, "a", list(range(600)))  # a used again: b is now least recent
    resident(rep, "c", list(range(300)))
    assert set(rep.residency) == {"a", "c"} and rep.resident_tokens == 900


def test_unknown_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown routing strategy 'fastest'.*round_robin"):
        make_strategy("fastest")


def test_router_over_real_servers_sticks_then_resets_at_weight_sync():
    body = recorded("vllm_0_11_completion_token_ids.json")
    servers = [RecordedServer(body), RecordedServer(body)]

    async def go():
        urls = [await s.start() for s in servers]
        engines = [HTTPEngine(u, model="m") for u in urls]
        router = Router(engines, "cache_aware_token_load", capacity_tokens=10_000, threshold=0.8)
        sampling = SamplingParams(temperature=1.0, seed=1)
        try:
            first_prompt = list(range(1000, 1400))
            gen = await router.generate(first_prompt, sampling, 16, session_id="s")
            home = [len(s.requests) for s in servers].index(1)
            assert router.replicas[home].residency["s"].tokens == 400 + len(gen.token_ids)
            # other sessions land elsewhere, the session's next turn goes home
            await router.generate(list(range(50)), sampling, 16, session_id="t")
            next_prompt = first_prompt + gen.token_ids + [198, 151644]
            await router.generate(next_prompt, sampling, 16, session_id="s")
            assert servers[home].requests[-1]["prompt"] == next_prompt
            assert all(r.inflight == 0 and r.token_load == 0 for r in router.replicas)
            await router.load_weights("/ckpt/step-1", 1)
            assert all(s.requests[-1] == {"path": "/ckpt/step-1", "version": 1} for s in servers)
            assert all(not r.residency for r in router.replicas)
            assert all(e.policy_version == 1 for e in engines)
            await router.load_adapter("/ckpt/adapter-2", 2)  # a LoRA run's sync: every replica, like weights
            assert all(s.requests[-1] == {"path": "/ckpt/adapter-2", "version": 2} for s in servers)
            assert all(e.policy_version == 2 for e in engines)
            return router.dispatched
        finally:
            for e in engines:
                await e.release()
            for s in servers:
                await s.stop()

    dispatched = asyncio.run(go())
    assert sorted(dispatched) == [1, 2]


def test_round_robin_router_spreads_concurrent_requests():
    body = recorded("vllm_0_11_completion_token_ids.json")
    servers = [RecordedServer(body) for _ in range(3)]

    async def go():
        engines = [HTTPEngine(await s.start(), model="m") for s in servers]
        router = Router(engines, "round_robin")
        try:
            await asyncio.gather(*(router.generate([1, 2, 3], SamplingParams(), 4) for _ in range(6)))
        finally:
            for e in engines:
                await e.release()
            for s in servers:
                await s.stop()

    asyncio.run(go())
    assert [len(s.requests) for s in servers] == [2, 2, 2]


def test_router_abort_reaches_local_engine_replicas(engine, chat):
    """LocalEngine.abort is a plain method (HTTPEngine's is async): the router calls both kinds."""

    async def go():
        router = Router([engine], "round_robin")
        prompt = chat("Write a very long story about a lighthouse keeper.")
        task = asyncio.ensure_future(router.generate(prompt, SamplingParams(temperature=1.0, seed=3), 4000))
        while engine.inflight() == 0:
            await asyncio.sleep(0.01)
        await router.abort()
        return await task

    generation = asyncio.run(go())
    assert generation.finish_reason == FinishReason.ABORT and len(generation.token_ids) < 4000
