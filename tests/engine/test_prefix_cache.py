"""Prefix cache and chunked prefill: the block store on its own, the KV layout's row moves, and the real tiny
model with the cache on vs off (same tokens), across a weight sync (flushed), and a long prompt prefilled in
chunks while another request keeps decoding."""

import asyncio

import pytest
import torch

from harnessrl.engine import kv
from harnessrl.engine.base import SamplingParams
from harnessrl.engine.kv import Cache
from harnessrl.engine.prefix_cache import PrefixCache, block_keys
from tests.engine.agentic import AgenticWorkload
from tests.engine.support import GREEDY, run

LAYERS, HEADS, DIM, BLOCK = 2, 1, 2, 4
BYTES_PER_TOKEN = LAYERS * 2 * HEADS * DIM * 4


def fake_kv(tokens: list[int]) -> torch.Tensor:
    """Keys/values that encode their token ids: [layers, 2, heads, n, dim]."""
    t = torch.tensor(tokens, dtype=torch.float32)
    return t[None, None, None, :, None].expand(LAYERS, 2, HEADS, len(tokens), DIM).clone()


def test_block_keys_name_the_whole_prefix():
    a = block_keys([1, 2, 3, 4, 5, 6, 7, 8], BLOCK, 2)
    b = block_keys([9, 2, 3, 4, 5, 6, 7, 8], BLOCK, 2)
    assert len(a) == 2 and a[0] != b[0]
    assert a[1] != b[1]  # same second block, different history: a different key
    assert block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], BLOCK, 2) == a


def test_match_returns_the_longest_cached_prefix_and_leaves_a_token_to_compute():
    cache = PrefixCache(BLOCK, budget_bytes=100 * BLOCK * BYTES_PER_TOKEN, bytes_per_token=BYTES_PER_TOKEN)
    prompt = list(range(10, 22))  # 3 full blocks
    cache.insert(prompt, 0, fake_kv(prompt))
    assert cache.blocks == 3
    hit, got = cache.match(prompt)  # all 12 cached, but the last token must be computed: 2 blocks
    assert hit == 8 and got is not None and got[0, 0, 0, :, 0].tolist() == prompt[:8]
    hit, got = cache.match([*prompt, 99])
    assert hit == 12 and got is not None and got[1, 1, 0, :, 1].tolist() == prompt
    assert cache.match([*prompt[:5], 0, *prompt[6:]])[0] == 4  # diverges in block 2
    assert cache.match([7, *prompt])[0] == 0
    assert cache.stats.lookups == 4 and cache.stats.hit_tokens == 8 + 12 + 4


def test_insert_from_a_later_block_and_lru_eviction_keeps_parents_longest():
    cache = PrefixCache(BLOCK, budget_bytes=4 * BLOCK * BYTES_PER_TOKEN, bytes_per_token=BYTES_PER_TOKEN)
    assert cache.capacity_blocks == 4
    a = list(range(100, 112))
    cache.insert(a[:8], 0, fake_kv(a[:8]))
    cache.insert(a, 2, fake_kv(a[8:]))  # only the new third block's keys/values are passed
    assert cache.blocks == 3 and cache.match([*a, 0])[0] == 12
    b = list(range(200, 212))
    cache.insert(b, 0, fake_kv(b))  # over budget by two blocks: a's least recent go, tail first
    assert cache.blocks == 4 and cache.stats.evicted_blocks == 2
    assert cache.match([*a, 0])[0] == 4  # a's first block (the parent) outlived its children
    assert cache.match([*b, 0])[0] == 12
    cache.clear()
    assert cache.blocks == 0 and cache.epoch == 1 and cache.match([*b, 0])[0] == 0


def test_a_disabled_cache_stores_nothing():
    cache = PrefixCache(BLOCK, budget_bytes=0, bytes_per_token=BYTES_PER_TOKEN)
    cache.insert(list(range(8)), 0, fake_kv(list(range(8))))
    assert not cache.enabled and cache.blocks == 0 and cache.match(list(range(9))) == (0, None)


def _one_row(tokens: list[int]) -> Cache:
    single = kv.new_cache(LAYERS)
    kv.fill(single, fake_kv(tokens), spare=0)
    return single


def _rows(cache: Cache) -> list[list[int]]:
    """Each row's tokens as the window shows them (0 = padding)."""
    keys = cache.layers[0].window()[0]
    return [[int(x) for x in keys[r, 0, :, 0].tolist()] for r in range(keys.shape[0])]


def test_kv_rows_join_and_leave_without_moving_the_others():
    batch = kv.new_cache(LAYERS)
    kv.add_row(batch, _one_row([1, 2, 3]))
    kv.add_row(batch, _one_row([4, 5]))
    kv.add_row(batch, _one_row([6, 7, 8, 9, 10]))  # longer: the window grows to the left
    assert _rows(batch) == [[0, 0, 1, 2, 3], [0, 0, 0, 4, 5], [6, 7, 8, 9, 10]]
    for i in range(LAYERS):  # a decode step writes one column for every row
        batch.layers[i].update(torch.full((3, HEADS, 1, DIM), 11.0), torch.full((3, HEADS, 1, DIM), 11.0))
    assert kv.cache_length(batch) == 6
    order = kv.remove_rows(batch, {0})  # the last row moves into the hole
    assert order == [2, 1] and _rows(batch) == [[6, 7, 8, 9, 10, 11], [0, 0, 0, 4, 5, 11]]
    kv.remove_rows(batch, {0})
    kv.drop_left(batch, 3)
    assert _rows(batch) == [[4, 5, 11]]
    assert kv.row_kv(batch, 0, 1, 3)[1, 1, 0, :, 0].tolist() == [5, 11]


def test_kv_compact_drops_holes_and_right_aligns_rows():
    batch = kv.new_cache(LAYERS)
    kv.add_row(batch, _one_row([1, 2]))
    kv.add_row(batch, _one_row([3, 4, 5]))
    for i in range(LAYERS):  # a speculative step: three columns; row 0 keeps 1, row 1 keeps 3
        new = (
            torch.tensor([6.0, 0.0, 0.0, 7.0, 8.0, 9.0])
            .view(2, 1, 3, 1)
            .expand(2, HEADS, 3, DIM)
            .contiguous()
        )
        batch.layers[i].update(new, new)
    assert _rows(batch) == [[0, 1, 2, 6, 0, 0], [3, 4, 5, 7, 8, 9]]
    # row 0 kept 1 of its 3 new columns, row 1 2 of 3 (its last one was a rejected draft too)
    owned = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    kv.compact(batch, owned)
    assert kv.cache_length(batch) == 5
    assert _rows(batch)[0][-3:] == [1, 2, 6] and _rows(batch)[1] == [3, 4, 5, 7, 8]


def test_cache_on_gives_the_tokens_of_cache_off_across_agentic_turns(engine, engine_nocache):
    """Three sessions sharing a system prompt, three turns each: every turn after the first starts from
    the session's previous turn in the cache, and greedy tokens equal those computed without a cache."""
    workload = AgenticWorkload(engine.tokenizer, sessions=3, turns=3, max_tokens=10)
    off = run(workload.run(engine_nocache))
    on = run(workload.run(engine))
    assert [t.outputs for t in on] == [t.outputs for t in off]
    for trace in on:
        for turn in range(1, 3):
            fed = trace.prompts[turn - 1] + len(trace.outputs[turn - 1]) - 1  # the last token is never fed
            assert (
                trace.cached[turn]
                == fed // engine.prefix_cache.block_tokens * engine.prefix_cache.block_tokens
            )
    system_blocks = min(t.prompts[0] for t in on) // 16
    assert (
        sum(t.cached[0] for t in on) >= 2 * (system_blocks - 4) * 16
    )  # later sessions share the system prompt
    assert all(c == 0 for t in off for c in t.cached)
    stats = engine.snapshot().figures
    assert 0 < stats["prefix_cache_hit_rate"] <= 1 and stats["prefill_flops"] > 0


def test_seeded_sampling_with_a_cache_hit_equals_no_cache(engine, engine_nocache, chat):
    prompt = chat("Write two sentences about mountains and rivers, with many details please.")
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=5)
    first = run(engine.generate(prompt, seeded, 12))
    again = run(engine.generate(prompt, seeded, 12))
    reference = run(engine_nocache.generate(prompt, seeded, 12))
    assert again.cached_prompt_tokens > 0 and reference.cached_prompt_tokens == 0
    assert first.token_ids == again.token_ids == reference.token_ids
    assert max(abs(a - b) for a, b in zip(again.logprobs, reference.logprobs, strict=True)) < 1e-3


def test_weight_sync_flushes_the_cache_and_in_flight_kv_is_not_shared(engine, chat):
    from harnessrl.tinymodel import tiny_model_dir

    prompt = chat("List five animals that live in the ocean and describe each one.")
    run(engine.generate(prompt, GREEDY, 4))
    assert run(engine.generate(prompt, GREEDY, 4)).cached_prompt_tokens > 0
    flushes = engine.snapshot().figures["prefix_cache"]["flushes"]

    async def sync_mid_request():
        crossing = asyncio.ensure_future(engine.generate(prompt, GREEDY, 40))
        start = engine.steps
        while engine.steps < start + 2:
            await asyncio.sleep(0.01)
        await engine.load_weights(tiny_model_dir(), engine.policy_version + 1)
        fresh = await engine.generate(prompt, GREEDY, 1)  # puts the prompt's blocks back, on the new weights
        return fresh, await crossing

    fresh, crossed = run(sync_mid_request())
    assert engine.snapshot().figures["prefix_cache"]["flushes"] == flushes + 1
    assert fresh.cached_prompt_tokens == 0  # flushed
    assert len(set(crossed.token_policy_versions)) == 2
    # the crossing request's keys/values mix two weight versions: none of them may be served after the sync
    follow_up = prompt + crossed.token_ids + chat("And five birds?")
    assert run(engine.generate(follow_up, GREEDY, 2)).cached_prompt_tokens == len(prompt) // 16 * 16


@pytest.fixture
def chunky():
    """An engine whose steps hold 64 tokens: a long prompt is prefilled over many steps."""
    from harnessrl.engine.local import LocalEngine

    eng = LocalEngine(max_batch=4, step_tokens=64)
    yield eng
    eng.close()


def test_chunked_prefill_lets_running_requests_decode_and_gives_the_same_tokens(chunky, engine, chat):
    log = "\n".join(f"line {i}: request served in {i % 7} ms" for i in range(120))
    long_prompt = chat("Summarize this log:\n" + log)
    short_prompt = chat("Tell me a long story about a cat.")
    assert len(long_prompt) > 1200

    async def go():
        short = asyncio.ensure_future(chunky.generate(short_prompt, GREEDY, 16))
        while not chunky.steps:
            await asyncio.sleep(0.005)
        long = asyncio.ensure_future(chunky.generate(long_prompt, GREEDY, 2))
        done, _ = await asyncio.wait({short, long}, return_when=asyncio.FIRST_COMPLETED)
        return short in done, await short, await long

    # one prefill step for the long prompt would let it finish in 2 steps, long before the 16-token story
    short_first, short, long = run(go())
    assert short_first and len(short.token_ids) == 16
    # unchunked (whether the prompt's blocks are cached or not, the same tokens: tested above)
    reference = run(engine.generate(long_prompt, GREEDY, 2))
    assert long.token_ids == reference.token_ids


def test_identical_prompts_arriving_together_are_prefilled_once(engine, chat):
    """A group of rollouts of one task: the followers wait a step for the blocks the first one is computing,
    then each computes only its last partial block."""
    prompt = chat("Group prompt: " + " ".join(f"word{i}" for i in range(120)))
    assert 256 < len(prompt) < 2 * 256  # the first request needs two steps of the default budget
    before = engine.snapshot().figures["prefill_forward_tokens"]

    async def group():
        return await asyncio.gather(*(engine.generate(prompt, GREEDY, 2) for _ in range(4)))

    gens = run(group())
    hit = (len(prompt) - 1) // 16 * 16
    first, *followers = sorted(g.cached_prompt_tokens for g in gens)
    assert first < 100 and followers == [hit, hit, hit]  # the first may find the chat template's opening
    assert engine.snapshot().figures["prefill_forward_tokens"] - before == len(prompt) - first + 3 * (
        len(prompt) - hit
    )
    assert len({tuple(g.token_ids) for g in gens}) == 1
