"""The local engine with the real tiny model: batching invariance, sampling, stops, abort, weight sync."""

import asyncio
import threading
import time

import pytest
import torch

from harnessrl.engine.base import EngineError, EngineRequestError, SamplingParams
from tests.engine.support import GREEDY, nucleus_logprobs, run

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about rain.",
    "hi",
    "Name three colors.",
    "Explain recursion briefly.",
    "What is 2+2?",
    "Tell me a joke.",
    "Say something about Rust.",
]


def test_greedy_output_alone_equals_output_in_batch_of_8(engine, chat):
    prompts = [chat(q) for q in QUESTIONS]

    # alone: the shortest, the longest and two more prompts (rows with the most and least left padding)
    by_length = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    checked = sorted({by_length[0], by_length[-1], 1, 3})

    async def go():
        alone = {i: await engine.generate(prompts[i], GREEDY, 8) for i in checked}
        steps_before = engine.steps
        together = await asyncio.gather(*(engine.generate(p, GREEDY, 8) for p in prompts))
        return alone, together, engine.steps - steps_before

    alone, together, steps = run(go())
    for i in checked:
        assert alone[i].token_ids == together[i].token_ids
        assert max(abs(x - y) for x, y in zip(alone[i].logprobs, together[i].logprobs, strict=True)) < 1e-3
    # the 8 requests were decoded together: far fewer steps than tokens
    assert steps < sum(len(g.token_ids) for g in together) / 2
    assert all(g.finish_reason in ("stop", "length") for g in together)


def test_request_joining_mid_decode_gets_the_same_tokens(engine, chat):
    long_prompt, short_prompt = (
        chat("Tell me a long story about a cat."),
        chat("What is the capital of Italy?"),
    )

    async def go():
        alone = await engine.generate(short_prompt, GREEDY, 6)
        first = asyncio.ensure_future(engine.generate(long_prompt, GREEDY, 16))
        start = engine.steps
        while engine.steps < start + 3:
            await asyncio.sleep(0.01)
        joined = await engine.generate(short_prompt, GREEDY, 6)
        return alone, joined, await first

    alone, joined, first = run(go())
    assert joined.token_ids == alone.token_ids
    assert len(first.token_ids) > 0


def test_seeded_sampling_is_reproducible_regardless_of_batch(engine, chat):
    prompt = chat("Write a sentence about the sea.")
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)

    async def go():
        alone = await engine.generate(prompt, seeded, 8)
        others = [engine.generate(chat(q), SamplingParams(temperature=1.0), 8) for q in QUESTIONS[:3]]
        batch = await asyncio.gather(engine.generate(prompt, seeded, 8), *others)
        other_seed = await engine.generate(prompt, SamplingParams(temperature=1.0, top_p=0.95, seed=99), 8)
        return alone, batch[0], other_seed

    alone, in_batch, other_seed = run(go())
    assert alone.token_ids == in_batch.token_ids
    assert other_seed.token_ids != alone.token_ids


def test_logprobs_are_under_the_distribution_sampled_from(engine, chat, hf_model):
    """Recompute each sampled token's logprob with a full forward pass: log_softmax(logits / T) restricted to
    the top-p nucleus and renormalized."""
    prompt = chat("Describe a forest.")
    temperature, top_p = 0.7, 0.9
    gen = run(engine.generate(prompt, SamplingParams(temperature=temperature, top_p=top_p, seed=7), 6))
    expected = nucleus_logprobs(hf_model, prompt, gen.token_ids, temperature, top_p)
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=2e-3)
    assert all(lp <= 0 for lp in gen.logprobs)
    # greedy: the model's plain log_softmax
    greedy = run(engine.generate(prompt, GREEDY, 3))
    with torch.inference_mode():
        first = torch.log_softmax(hf_model(input_ids=torch.tensor([prompt])).logits[0, -1], -1)
    assert greedy.token_ids[0] == int(first.argmax())
    assert abs(greedy.logprobs[0] - float(first.max())) < 1e-3


def test_stop_tokens_and_length(engine, chat):
    prompt = chat("What is the capital of France?")
    full = run(engine.generate(prompt, GREEDY, 40))
    assert full.finish_reason == "stop" and full.token_ids[-1] in engine.default_stop
    # an explicit stop token: stop at the 3rd sampled token, which is included in the output
    third = full.token_ids[2]
    stopped = run(engine.generate(prompt, GREEDY, 40, stop_token_ids=[third]))
    assert stopped.token_ids == full.token_ids[: full.token_ids.index(third) + 1]
    assert stopped.finish_reason == "stop"
    short = run(engine.generate(prompt, GREEDY, 2))
    assert short.token_ids == full.token_ids[:2] and short.finish_reason == "length"
    assert short.policy_version == engine.policy_version
    assert short.token_policy_versions == [engine.policy_version] * 2


def test_abort_returns_partial_tokens_and_spares_others(engine, chat):
    async def go():
        victim = engine.submit(chat("Tell me a very long story."), GREEDY, 400, request_id="victim")
        bystander = asyncio.ensure_future(engine.generate(chat("What is 2+2?"), GREEDY, 6))
        start = engine.steps
        while engine.steps < start + 3:
            await asyncio.sleep(0.01)
        engine.abort_requests(["victim"])
        return await asyncio.wrap_future(victim.result), await bystander

    victim, bystander = run(go())
    assert victim.finish_reason == "abort"
    assert 0 < len(victim.token_ids) < 400 and len(victim.logprobs) == len(victim.token_ids)
    assert bystander.finish_reason in ("stop", "length")


def test_decode_bytes_count_every_weight_and_the_window_each_step_reads(chat):
    """A lone request without drafts: decode step i feeds token i against the prompt plus i columns."""
    from harnessrl.engine.local import LocalEngine

    eng = LocalEngine(max_batch=2, speculative_tokens=0, prefix_cache_mb=0)
    try:
        prompt = chat("Name three colors.")
        out = run(eng.generate(prompt, GREEDY, 6))
        stats = eng.snapshot().figures
        shape = eng._shape
        assert shape.weight_bytes == 4 * sum(p.numel() for p in eng.model.parameters() if p.dim() == 2)
        windows = [len(prompt) + i for i in range(1, len(out.token_ids))]
        assert stats["decode_forward_steps"] == len(windows)
        assert stats["decode_bytes"] == pytest.approx(sum(shape.decode_bytes(1, w) for w in windows))
        recorded = eng._stats
        assert stats["decode_bytes_per_s"] == pytest.approx(recorded.decode_bytes / recorded.decode_forward_s)
    finally:
        eng.close()


def test_bad_requests_raise_clear_errors(engine):
    with pytest.raises(EngineRequestError, match="empty"):
        run(engine.generate([], GREEDY, 4))
    with pytest.raises(EngineRequestError, match="outside the vocabulary"):
        run(engine.generate([1, 10**9], GREEDY, 4))
    with pytest.raises(EngineRequestError, match="context"):
        run(engine.generate([1] * engine.max_context, GREEDY, 4))
    with pytest.raises(EngineRequestError, match="max_tokens"):
        run(engine.generate([1, 2], GREEDY, 0))


def test_weights_from_memory_and_what_is_freed_until_the_sync(engine, chat, tmp_path):
    """The RL loop's path into an engine of its own process: the trainer's tensors, no file
    (rl/publish.InProcessPublisher). Before it, `release_until_sync` frees the prefix cache and the packed
    weight copies; a request that comes anyway gets the same answer."""
    from harnessrl.engine import layout
    from harnessrl.engine.base import WeightSyncMode
    from harnessrl.rl.publish import InProcessPublisher, make_publisher

    def packed_copies() -> int:
        return sum(
            1 for m in engine.model.modules() if isinstance(m, layout.LayoutLinear) and m.packed is not None
        )

    def released() -> bool:
        deadline = time.monotonic() + 60
        while packed_copies() or engine.prefix_cache.blocks:
            assert time.monotonic() < deadline, "release_until_sync freed nothing within 60 s"
            time.sleep(0.01)
        return True

    prompt = chat("Name a fruit.")
    before = run(engine.generate(prompt, GREEDY, 5))
    packed = packed_copies()  # 0 where this host multiplies no shape faster packed (engine/layout.py)
    engine.release_until_sync()
    assert released()
    assert run(engine.generate(prompt, GREEDY, 5)).token_ids == before.token_ids
    assert packed_copies() == packed  # served at full speed again

    original = {k: v.detach().clone() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    flipped = dict(original, **{"model.norm.weight": -original["model.norm.weight"]})
    publisher = make_publisher(
        WeightSyncMode.CHECKPOINT, engine, None, model=None, sync_root=tmp_path / "sync", fingerprint="t"
    )
    assert isinstance(publisher, InProcessPublisher)
    engine.release_until_sync()
    assert released()
    publisher.publish(7, flipped.items())
    changed = run(engine.generate(prompt, GREEDY, 5))
    assert changed.policy_version == 7 and changed.token_ids != before.token_ids
    assert packed_copies() == packed and not (tmp_path / "sync").exists()  # nothing written
    with pytest.raises(EngineError, match="model.norm.weight has shape"):
        publisher.publish(8, dict(flipped, **{"model.norm.weight": torch.zeros(3)}).items())
    publisher.publish(8, original.items())
    assert run(engine.generate(prompt, GREEDY, 5)).token_ids == before.token_ids


def test_weight_sync_swaps_weights_between_steps(engine, chat, tmp_path):
    from safetensors.torch import save_file

    from harnessrl.tinymodel import tiny_model_dir

    prompt = chat("Name a fruit.")
    before = run(engine.generate(prompt, GREEDY, 5))
    # contiguous: the engine may store a weight matrix transposed in memory (engine/layout.py)
    state = {
        k: v.detach().contiguous() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"
    }
    state["model.norm.weight"] = -state["model.norm.weight"]  # flips every logit: a different greedy answer
    perturbed = tmp_path / "ckpt"
    perturbed.mkdir()
    save_file(state, str(perturbed / "model.safetensors"))

    engine.load_weights_sync(perturbed, 5)
    changed = run(engine.generate(prompt, GREEDY, 5))
    assert changed.policy_version == 5 and changed.token_ids != before.token_ids

    # a sync in the middle of a request: its tokens record both versions
    async def mid_request():
        pending = asyncio.ensure_future(
            engine.generate(prompt, SamplingParams(temperature=1.0, seed=3), 300, request_id="mid")
        )
        start = engine.steps
        while engine.steps < start + 2:
            await asyncio.sleep(0.01)
        await engine.load_weights(tiny_model_dir(), 6)
        start = engine.steps
        while engine.steps < start + 2:
            await asyncio.sleep(0.01)
        engine.abort_requests(["mid"])
        return await pending

    mixed = run(mid_request())
    assert mixed.finish_reason == "abort"
    assert mixed.token_policy_versions[0] == 5 and mixed.token_policy_versions[-1] == 6
    assert mixed.policy_version == 6
    restored = run(engine.generate(prompt, GREEDY, 5))
    assert restored.token_ids == before.token_ids


def test_weight_sync_rejects_bad_checkpoints(engine, tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(EngineError, match="no \\*.safetensors"):
        engine.load_weights_sync(tmp_path, 1)
    save_file({"some.other.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(EngineError, match="does not match the served model"):
        engine.load_weights_sync(tmp_path, 1)


def test_generate_works_from_several_threads_and_loops(engine, chat):
    prompt = chat("hi")
    expected = run(engine.generate(prompt, GREEDY, 4)).token_ids
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(run(engine.generate(prompt, GREEDY, 4))))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    deadline = time.time() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    assert [r.token_ids for r in results] == [expected] * 3
