"""Weight sync reaches every engine, or the stage refuses to start: `ensure_weight_sync` against real loopback
servers (ours, one without a weight endpoint, the vLLM stand-in with and without dev mode / the extension), and
the vLLM protocol's error paths and timing against tests/support/fake_vllm.py, whose workers run the real
`WeightSyncExtension` on the real tiny model. The same protocol against a real vLLM: test_vllm_real.py. The
broadcast path: test_weight_sync_broadcast.py."""

import asyncio
import json

import pytest
import torch
from safetensors.torch import save_file

from harnessrl.engine.base import EngineError, SamplingParams
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.engine.router import Router
from harnessrl.engine.vllm_worker import (
    INFO,
    BroadcastInit,
    LoadRequest,
    ReceiveRequest,
    WeightSyncRequestError,
    sync_in_process,
)
from harnessrl.engine.weight_sync import WeightSyncUnsupported, ensure_weight_sync
from harnessrl.tinymodel import load_model, tiny_model_dir
from tests.engine.support import GREEDY, GenerateOnly, RecordedServer, recorded, run
from tests.support.fake_vllm import FakeVLLM, FakeWorker, miniature_model
from tests.support.weight_sync import close, teacher_forced

FIX = "--worker-extension-cls harnessrl.engine.vllm_worker.WeightSyncExtension"


@pytest.fixture(scope="module")
def base_model():
    return load_model().eval()


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory, base_model):
    """(checkpoint dir, model holding its weights): the final norm negated, which flips every logit."""
    state = {k: v.detach().clone() for k, v in base_model.state_dict().items() if k != "lm_head.weight"}
    state["model.norm.weight"] = -state["model.norm.weight"]
    directory = tmp_path_factory.mktemp("perturbed")
    save_file(state, str(directory / "model.safetensors"))
    model = load_model().eval()
    model.load_state_dict(state, strict=False)
    return directory, model


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """(model dir, checkpoint dir, model holding the checkpoint) of a 2-layer Llama: for the tests whose point
    is the protocol, not the model (the tiny model's 540 MB costs seconds per copy on a busy machine)."""
    model_dir = miniature_model(tmp_path_factory.mktemp("mini"), seed=0)
    ckpt = miniature_model(tmp_path_factory.mktemp("mini-trained"), seed=1)
    return model_dir, ckpt, load_model(ckpt).eval()


async def with_fake(go, model_dir=None, **fake_options):
    fake = FakeVLLM(model_dir or tiny_model_dir(), **fake_options)
    url = await fake.start()
    client = HTTPEngine(url)
    try:
        return await go(fake, client)
    finally:
        await client.release()
        await fake.stop()


# ---- the stage-level check ----------------------------------------------------------------------------


def test_stage_refuses_a_server_without_a_weight_endpoint():
    server = RecordedServer(recorded("vllm_0_11_completion_token_ids.json"))

    async def go():
        url = await server.start()
        client = HTTPEngine(url)
        try:
            with pytest.raises(WeightSyncUnsupported) as caught:
                await ensure_weight_sync(client, "rl stage engine")
            return url, str(caught.value)
        finally:
            await client.release()
            await server.stop()

    url, message = run(go())
    assert "\n" not in message and message.startswith(f"rl stage engine: {url} cannot take new weights")
    assert "GET /load_weights answered HTTP 405" in message and FIX in message


def test_a_router_names_its_first_replica_that_cannot_and_counts_the_others(url):
    servers = [RecordedServer(recorded("vllm_0_11_completion_token_ids.json")) for _ in range(2)]

    async def go():
        urls = [await s.start() for s in servers]
        clients = [HTTPEngine(u) for u in [url, *urls]]  # ours can, the two others cannot
        try:
            with pytest.raises(WeightSyncUnsupported) as caught:
                await ensure_weight_sync(Router(clients), "generate")
            return urls, str(caught.value)
        finally:
            for c in clients:
                await c.release()
            for s in servers:
                await s.stop()

    urls, message = run(go())
    assert message.startswith(f"generate: router replica {urls[0]} cannot take new weights")
    assert message.endswith("(and 1 more of 3 replicas)") and "\n" not in message


def test_local_engine_our_server_and_a_router_of_them_pass(engine, url):
    async def go():
        client = HTTPEngine(url)
        try:
            await ensure_weight_sync(engine, "local")
            await ensure_weight_sync(Router([client, engine]), "router")
        finally:
            await client.release()
        with pytest.raises(WeightSyncUnsupported, match="^plain: .*cannot take new weights"):
            await ensure_weight_sync(GenerateOnly(engine), "plain")

    run(go())


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"dev_mode": False}, "no /collective_rpc endpoint"),
        ({"extension": False}, f"{INFO} failed with HTTP 500 \\(.*object has no attribute '{INFO}'"),
    ],
)
def test_vllm_without_dev_mode_or_extension_is_refused_in_one_line(options, reason):
    async def go(fake, client):
        with pytest.raises(WeightSyncUnsupported, match=reason) as caught:
            await ensure_weight_sync(Router([client]), "generate")
        with pytest.raises(WeightSyncUnsupported):  # load_weights asks first: it never pauses such a server
            await client.load_weights(str(tiny_model_dir()), 1)
        return fake, str(caught.value)

    fake, message = run(with_fake(go, **options))
    assert "\n" not in message and message.startswith(f"generate: router replica {fake.url} (vLLM)")
    assert FIX in message and "VLLM_SERVER_DEV_MODE=1" in message
    assert not any(c.startswith("/pause") for c in fake.calls)


# ---- the vLLM protocol against the stand-in ---------------------------------------------------------


def test_sync_mid_request_tags_tokens_before_and_after(prompt, mini):
    model_dir, ckpt, new_model = mini
    base_model = load_model(model_dir).eval()
    sampling = SamplingParams(temperature=1.0, seed=7)

    async def go(fake, client):
        await ensure_weight_sync(client, "generate")
        pending = asyncio.ensure_future(client.generate(prompt, sampling, 30))
        while fake.sampled < 4:
            await asyncio.sleep(0.01)
        await client.load_weights(str(ckpt), 1)
        return await pending

    gen = run(with_fake(go, model_dir, token_delay_s=0.05))
    split = gen.token_policy_versions.index(1)
    assert 4 <= split < len(gen.token_ids) and gen.token_policy_versions == [0] * split + [1] * (
        len(gen.token_ids) - split
    )
    old, new = gen.token_ids[:split], gen.token_ids[split:]
    assert close(gen.logprobs[:split], teacher_forced(base_model, prompt, old))
    # after the sync the request continues on the new weights (its keys/values recomputed)
    assert close(gen.logprobs[split:], teacher_forced(new_model, prompt + old, new))
    assert gen.policy_version == 1


def test_requests_before_the_first_sync_are_plain_and_tagged_with_the_version_at_their_start(prompt, mini):
    model_dir, ckpt, new_model = mini

    async def go(fake, client):
        plain = await client.generate(prompt, GREEDY, 3)  # the protocol is not known yet: one plain reply
        await client.load_weights(str(ckpt), 1)
        return plain, await client.generate(prompt, GREEDY, 3)  # streamed from now on

    plain, streamed = run(with_fake(go, model_dir))
    assert plain.token_policy_versions == [0] * 3
    assert close(plain.logprobs, teacher_forced(load_model(model_dir).eval(), prompt, plain.token_ids))
    assert streamed.token_policy_versions == [1] * 3
    assert close(streamed.logprobs, teacher_forced(new_model, prompt, streamed.token_ids))


def test_a_refused_update_resumes_and_a_half_applied_one_stays_paused(prompt, mini):
    async def go(fake, client):
        with pytest.raises(EngineError, match="version 3 refused .*no \\*.safetensors.*generates again"):
            await client.load_weights("/nonexistent/ckpt", 3)
        refused = await client._call("GET", "/is_paused"), client.policy_version
        fake.worker.break_reload = True  # the next update fails after weights started changing
        with pytest.raises(EngineError, match="version 4 failed .*broke off half-way.*stays paused"):
            await client.load_weights(str(mini[1]), 4)
        info = await client._call("POST", "/collective_rpc", {"method": INFO})
        broken = await client._call("GET", "/is_paused"), info["results"][0]
        await client.load_weights(str(mini[1]), 5)  # a complete update resumes it
        return (
            refused,
            broken,
            await client.generate(prompt, GREEDY, 2),
            await client._call("GET", "/is_paused"),
            await client._call("POST", "/collective_rpc", {"method": INFO}),
        )

    refused, broken, gen, resumed, info = run(with_fake(go, mini[0]))
    assert refused == ({"is_paused": False}, 0)
    assert broken[0] == {"is_paused": True} and broken[1]["policy_version"] == 0
    assert broken[1]["failed_update"]["version"] == 4 and "half-way" in broken[1]["failed_update"]["error"]
    assert resumed == {"is_paused": False} and gen.token_policy_versions == [5, 5]
    assert "failed_update" not in info["results"][0]


def test_an_update_that_does_not_match_the_served_model_is_refused_before_anything_changes(
    prompt, mini, tmp_path
):
    model_dir, ckpt, new_model = mini
    state = {k: v for k, v in new_model.state_dict().items() if k != "lm_head.weight"}
    wrong = {"missing": {k: v for k, v in state.items() if k != "model.norm.weight"},
             "unknown": {**state, "model.extra.weight": torch.zeros(2)},
             "shape": {**state, "model.norm.weight": torch.zeros(3)}}  # fmt: skip
    for name, tensors in wrong.items():
        (tmp_path / name).mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / name / "model.safetensors"))

    async def go(fake, client):
        before = await client.generate(prompt, GREEDY, 4)
        messages = {}
        for name in wrong:
            with pytest.raises(EngineError) as caught:
                await client.load_weights(str(tmp_path / name), 1)
            messages[name] = str(caught.value)
        return before, messages, await client.generate(prompt, GREEDY, 4)

    before, messages, after = run(with_fake(go, model_dir))
    assert "1 of the served model's tensors missing (model.norm.weight)" in messages["missing"]
    assert "1 tensors the served model does not have (model.extra.weight)" in messages["unknown"]
    assert "1 shapes differ (model.norm.weight float32[3] for float32[64])" in messages["shape"]
    assert all("refused before any weight changed" in m and "generates again" in m for m in messages.values())
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs
    assert after.token_policy_versions == [0] * 4


def test_every_replica_pulls_an_s3_checkpoint(s3_env, prompt, mini):
    from harnessrl.store import ObjectStore

    model_dir, ckpt, trained = mini
    store = ObjectStore.from_env()
    store.ensure_bucket("ckpts")
    store.upload_dir(ckpt, "s3://ckpts/run/step-2")

    async def go():
        fakes = [FakeVLLM(model_dir) for _ in range(2)]
        clients = [HTTPEngine(await f.start()) for f in fakes]
        router = Router(clients, "round_robin")
        try:
            await ensure_weight_sync(router, "generate")
            before = await clients[0].generate(prompt, GREEDY, 4)
            await router.load_weights("s3://ckpts/run/step-2", 2)
            return before, [await c.generate(prompt, GREEDY, 4) for c in clients]
        finally:
            for c in clients:
                await c.release()
            for f in fakes:
                await f.stop()

    before, after = run(go())
    assert not close(before.logprobs, teacher_forced(trained, prompt, before.token_ids))
    for gen in after:
        assert gen.token_policy_versions == [2] * 4
        assert close(gen.logprobs, teacher_forced(trained, prompt, gen.token_ids))


# ---- the extension's requests and in-process use -----------------------------------------------------


def test_extension_requests_round_trip_and_name_bad_fields():
    assert ReceiveRequest.from_json(ReceiveRequest(2).to_json()) == ReceiveRequest(2)
    assert ReceiveRequest.from_json('{"version": 2}') == ReceiveRequest(2, 0, 0)  # before adapters
    lora = ReceiveRequest(5, 8, 16)
    assert ReceiveRequest.from_json(lora.to_json()) == lora and lora.adapter
    with pytest.raises(
        WeightSyncRequestError, match="lora_rank and lora_alpha must both be > 0.*got 8 and 0"
    ):
        ReceiveRequest.from_json(json.dumps({"version": 5, "lora_rank": 8}))
    init = BroadcastInit("10.0.0.1", 29500, 1, 3, "gloo")
    assert BroadcastInit.from_json(init.to_json()) == init
    with pytest.raises(WeightSyncRequestError, match="backend must be nccl or gloo, got 'mpi'"):
        BroadcastInit.from_json(json.dumps({**json.loads(init.to_json()), "backend": "mpi"}))
    assert LoadRequest.from_json(LoadRequest("s3://b/k", 3).to_json()) == LoadRequest("s3://b/k", 3)
    for bad, message in [
        ("not json", "not a JSON string"),
        (json.dumps({"path": "/x"}), "lacks version"),
        (json.dumps({"path": "/x", "version": "3"}), "version must be an integer"),
        (json.dumps({"path": "", "version": 3}), "path must be a non-empty string"),
    ]:
        with pytest.raises(WeightSyncRequestError, match=message):
            LoadRequest.from_json(bad)


def test_in_process_engine_syncs_through_the_same_call(mini):
    """`sync_in_process` against an object with vLLM's LLM methods (collective_rpc, reset_prefix_cache)."""
    model_dir, ckpt, new_model = mini
    worker = FakeWorker(load_model(model_dir).eval(), model_dir)

    class LLMLike:
        resets = 0

        def collective_rpc(self, method, args=()):
            return [getattr(worker, method)(*args)]

        def reset_prefix_cache(self):
            self.resets += 1

    llm = LLMLike()
    answers = run(sync_in_process(llm, str(ckpt), 9))
    assert answers == [
        {"policy_version": 9, "tensors": len(list(new_model.state_dict())) - 1}
    ]  # lm_head tied
    assert llm.resets == 1 and worker.harnessrl_weight_sync_info()["policy_version"] == 9
    assert torch.equal(worker.model_runner.model.hf.model.norm.weight, new_model.model.norm.weight)
