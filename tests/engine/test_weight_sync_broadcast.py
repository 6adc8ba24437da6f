"""Weights by broadcast, end to end over gloo on this CPU: the trainer side is the loop's own
`BroadcastPublisher` (the same code that runs nccl on GPUs), the receivers are real `harnessrl engine serve`
processes behind the Router (a real vLLM receives in test_vllm_real.py). Also the one-line refusal of engines
that cannot take a broadcast."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from aiohttp import web

from harnessrl.engine.base import EngineError, WeightSyncMode
from harnessrl.engine.broadcast import BroadcastError, WeightGroup, buckets, receive_weights, send_weights
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.engine.router import ReplicaHealth, Router
from harnessrl.engine.weight_sync import WeightSyncUnsupported, ensure_weight_sync
from harnessrl.rl.publish import BroadcastPublisher
from harnessrl.tinymodel import load_model
from tests.engine.support import GREEDY
from tests.support.fake_vllm import miniature_model
from tests.support.weight_sync import close, serve_process, teacher_forced

BROADCAST = WeightSyncMode.BROADCAST


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> tuple[Path, torch.nn.Module, torch.nn.Module]:
    """(model dir, its model, a differently seeded model of the same shape: the "trained" weights)."""
    model_dir = miniature_model(tmp_path_factory.mktemp("mini"), seed=0)
    other = miniature_model(tmp_path_factory.mktemp("mini-trained"), seed=1)
    return model_dir, load_model(model_dir).eval(), load_model(other).eval()


@pytest.fixture
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop the engine clients live on (the RL loop's gateway loop plays this part)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def on(loop: asyncio.AbstractEventLoop, coro):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=120)


def stop(publisher: BroadcastPublisher, clients: list[HTTPEngine], procs: list, loop) -> None:
    """Closes the publisher's group, the clients' connections, and kills the engine processes."""
    publisher.close()
    for c in clients:
        on(loop, c.release())
    for proc, _ in procs:
        proc.kill()
        proc.wait()


def test_two_engine_serve_processes_behind_the_router_take_weights_by_gloo_broadcast(
    mini, prompt, background_loop
):
    model_dir, base, trained = mini
    procs = [serve_process(model_dir) for _ in range(2)]
    clients = [HTTPEngine(url) for _, url in procs]
    router = Router(clients, "round_robin")
    publisher = BroadcastPublisher(router, background_loop, name="engines", bucket_bytes=64 * 1024)
    try:
        before = [on(background_loop, c.generate(prompt, GREEDY, 6)) for c in clients]
        publisher.publish(1, trained.named_parameters())
        after = [on(background_loop, c.generate(prompt, GREEDY, 6)) for c in clients]
        publisher.publish(2, base.named_parameters())  # the same group, a second update
        back = [on(background_loop, c.generate(prompt, GREEDY, 6)) for c in clients]
        versions = [on(background_loop, c._call("GET", "/health")) for c in clients]
        procs[1][0].kill()  # an engine dies between two syncs: the next one fails at once, naming it
        procs[1][0].wait()
        t0 = time.monotonic()
        with pytest.raises(BroadcastError, match=f"receiver failed before update 3 started: {procs[1][1]}"):
            publisher.publish(3, trained.named_parameters())
        failed_after_s = time.monotonic() - t0
        health = router.replica_health()
        publisher.publish(4, trained.named_parameters())  # the group formed again of the live replica
        survivor = on(background_loop, clients[0].generate(prompt, GREEDY, 6))
    finally:
        stop(publisher, clients, procs, background_loop)
    assert health == [ReplicaHealth.LIVE, ReplicaHealth.DOWN] and router.workers == 1
    assert publisher.group is None  # closed
    assert survivor.token_policy_versions == [4] * len(survivor.token_ids)
    assert close(survivor.logprobs, teacher_forced(trained, prompt, survivor.token_ids))
    for gen in before + back:
        assert close(gen.logprobs, teacher_forced(base, prompt, gen.token_ids))
    for gen, old in zip(after, before, strict=True):
        assert gen.token_policy_versions == [1] * len(gen.token_ids)
        assert close(gen.logprobs, teacher_forced(trained, prompt, gen.token_ids))
        assert not close(gen.logprobs, teacher_forced(base, prompt, gen.token_ids))
        assert gen.token_ids != old.token_ids or not close(gen.logprobs, old.logprobs)
    assert [h["policy_version"] for h in versions] == [2, 2]
    assert failed_after_s < 30  # not the group's 600 s timeout


def test_a_lora_adapter_alone_goes_by_broadcast_and_each_replica_merges_it_onto_its_base(
    mini, prompt, background_loop
):
    """LoRA by broadcast: only the adapter's tensors travel; each replica merges them onto its own base, so its
    logprobs are the adapted trainer model's; a second adapter replaces the first (merged onto the base, not
    onto the first); an adapter of another rank than announced is refused and the replicas keep version 2."""
    from harnessrl.train.lora import LoraSettings, adapter_of, add_adapters, is_adapter_tensor

    model_dir, base, _ = mini
    settings = LoraSettings(rank=4, alpha=8)
    adapted = load_model(model_dir).eval()
    add_adapters(adapted, settings)
    procs = [serve_process(model_dir) for _ in range(2)]
    clients = [HTTPEngine(url) for _, url in procs]
    publisher = BroadcastPublisher(Router(clients, "round_robin"), background_loop, name="engines")
    served = []
    try:
        for version in (1, 2):
            torch.manual_seed(version)
            with torch.no_grad():  # what optimizer steps do to the adapter
                for name, p in adapted.named_parameters():
                    if is_adapter_tensor(name):
                        p.copy_(torch.randn_like(p) * 0.3)
            adapter = adapter_of(adapted.state_dict().items(), settings)
            publisher.publish_adapter(version, adapter)
            gens = [on(background_loop, c.generate(prompt, GREEDY, 6)) for c in clients]
            served.append((gens, [teacher_forced(adapted, prompt, g.token_ids) for g in gens], adapter))
        wrong_rank = served[-1][2]
        wrong_rank.settings = LoraSettings(rank=2, alpha=8)
        with pytest.raises(EngineError, match="HTTP 400.*adapters not of rank 2"):
            publisher.publish_adapter(3, wrong_rank)
        health = [on(background_loop, c._call("GET", "/health")) for c in clients]
    finally:
        stop(publisher, clients, procs, background_loop)
    full_bytes = sum(t.nbytes for t in base.state_dict().values())
    assert served[0][2].nbytes < 0.1 * full_bytes  # what went over the wire
    for version, (gens, trainer_lps, _) in enumerate(served, 1):
        for gen, trainer_lp in zip(gens, trainer_lps, strict=True):
            assert gen.token_policy_versions == [version] * len(gen.token_ids)
            assert close(gen.logprobs, trainer_lp)
            assert not close(gen.logprobs, teacher_forced(base, prompt, gen.token_ids))
    assert not close(served[0][0][0].logprobs, served[1][1][0])  # the second adapter changed the policy
    assert [h["policy_version"] for h in health] == [2, 2]


def test_a_replica_that_dies_is_routed_around_and_rejoins_at_the_current_weights_when_it_answers(
    mini, prompt, tmp_path
):
    """Failover with real `harnessrl engine serve` processes: one replica killed is found down by the health
    check alone (no request needed), requests go to the live one, a weight update reaches the live one only;
    restarted on its port, the replica is brought to the current weights (the last update replayed) before it
    gets requests."""
    from urllib.parse import urlparse

    model_dir, base, trained = mini
    trained.save_pretrained(tmp_path / "trained")
    procs = [serve_process(model_dir) for _ in range(2)]
    clients = [HTTPEngine(url) for _, url in procs]
    router = Router(clients, "round_robin", probe_s=0.2)

    async def until(predicate, what: str) -> None:
        for _ in range(600):
            if predicate():
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"not within 60 s: {what} ({router.replica_health()})")

    async def go():
        await router.load_weights(str(tmp_path / "trained"), 1)
        await router.generate(prompt, GREEDY, 2)  # the health checks start with the first request
        procs[1][0].kill()
        procs[1][0].wait()
        await until(lambda: router.replica_health()[1] is ReplicaHealth.DOWN, "replica 1 down")
        routed = [await router.generate(prompt, GREEDY, 4) for _ in range(4)]
        unaware = Router(clients, "round_robin", probe_s=0)  # no health check: the request finds it gone
        routed += [await unaware.generate(prompt, GREEDY, 4) for _ in range(2)]
        failover = (unaware.dispatched, unaware.replica_health())
        await router.load_weights(str(tmp_path / "trained"), 2)  # the live replica only
        procs[1] = serve_process(model_dir, port=int(urlparse(procs[1][1]).port or 0))  # version 0, base
        await until(lambda: router.replica_health()[1] is ReplicaHealth.LIVE, "replica 1 back")
        back = await clients[1].generate(prompt, GREEDY, 4)
        return routed, back, failover

    try:
        routed, back, failover = asyncio.run(go())
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
    assert router.dispatched == [5, 0]  # nothing went to the dead replica
    # the second request went to the dead replica, found it gone and was answered by the live one
    assert failover == ([2, 1], [ReplicaHealth.LIVE, ReplicaHealth.DOWN])
    for gen in routed:
        assert gen.token_policy_versions == [1] * 4
        assert close(gen.logprobs, teacher_forced(trained, prompt, gen.token_ids))
    assert back.token_policy_versions == [2] * 4  # caught up: the last update replayed into it
    assert close(back.logprobs, teacher_forced(trained, prompt, back.token_ids))
    assert not close(back.logprobs, teacher_forced(base, prompt, back.token_ids))


def test_buckets_pack_mixed_dtypes_and_a_receiver_gets_every_tensor_back():
    named = [
        ("a", torch.arange(5, dtype=torch.float32)),
        ("b", torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)),
        ("c", torch.arange(3, dtype=torch.int64)),
        ("big", torch.ones(100, dtype=torch.float32)),
    ]
    packed = [[(s.name, s.offset) for s, _ in b] for b in buckets(named, bucket_bytes=64)]
    assert packed == [[("a", 0), ("b", 32)], [("c", 0)], [("big", 0)]]  # 16-byte aligned; big alone
    store = WeightGroup.host_store("127.0.0.1", timeout_s=30)
    got: dict[str, torch.Tensor] = {}

    def receiver() -> None:
        group = WeightGroup("127.0.0.1", store.port, 1, 2, "gloo", timeout_s=30)
        got.update({n: t.clone() for n, t in receive_weights(group)})

    thread = threading.Thread(target=receiver)
    thread.start()
    sender = WeightGroup("127.0.0.1", store.port, 0, 2, "gloo", timeout_s=30, store=store)
    assert send_weights(sender, iter(named), bucket_bytes=64) == 4
    thread.join(timeout=30)
    assert list(got) == ["a", "b", "c", "big"]
    for name, tensor in named:
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor)
    with pytest.raises(BroadcastError, match="rank 2 outside a group of 2"):
        WeightGroup("127.0.0.1", store.port, 2, 2, "gloo", timeout_s=5)


# ---- engines that cannot take a broadcast ---------------------------------------------------------------


class OlderServer:
    """`harnessrl engine serve` as it answered before the broadcast path: GET /load_weights lists no modes."""

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "policy", "owned_by": "harnessrl"}]})

    async def weight_sync_info(self, request: web.Request) -> web.Response:
        return web.json_response({"policy_version": 0})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/load_weights", self.weight_sync_info)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()


def test_engines_that_cannot_take_a_broadcast_are_refused_in_one_line(engine, url):
    older = OlderServer()

    async def go():
        old_url = await older.start()
        ours, old = HTTPEngine(url), HTTPEngine(old_url)
        try:
            await ensure_weight_sync(old, "rl stage engine")  # by checkpoint it can
            with pytest.raises(WeightSyncUnsupported) as by_http:
                await ensure_weight_sync(Router([ours, old]), "rl stage engine", BROADCAST)
            with pytest.raises(WeightSyncUnsupported) as in_process:
                await ensure_weight_sync(Router([ours, engine]), "rl stage engine", BROADCAST)
            await ensure_weight_sync(ours, "rl stage engine", BROADCAST)
            with pytest.raises(EngineError, match="409.*POST /init_broadcast first"):
                await ours.receive_weights_broadcast(1)
            return old_url, str(by_http.value), str(in_process.value)
        finally:
            await ours.release()
            await old.release()
            await older.stop()

    old_url, by_http, in_process = asyncio.run(go())
    assert by_http == (
        f"rl stage engine: router replica {old_url} cannot take weights by broadcast (GET /load_weights lists "
        "['checkpoint']: a harnessrl engine server older than this client): serve it with this harnessrl "
        "version, or use --weight-sync checkpoint"
    )
    assert "\n" not in in_process and in_process.startswith(
        "rl stage engine: router replica the in-process LocalEngine cannot join a weight broadcast"
    )
    assert "--weight-sync checkpoint" in in_process and "--engine-url" in in_process
