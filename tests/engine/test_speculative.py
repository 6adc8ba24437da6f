"""Speculative decoding with prompt-lookup drafts: the drafts, the exact acceptance rule, and the engine's
output with speculation equal to its output without (greedy token for token; sampled logprobs the model's)."""

import math

import pytest
import torch

from harnessrl.engine.base import SamplingParams
from harnessrl.engine.sampling import RowSampling, _draw, _restrict_to_nucleus, verify
from harnessrl.engine.speculative import (
    ENGINE_DECAY,
    JUDGED_AFTER,
    MIN_KEPT_SHARE,
    PROBE_EVERY,
    DraftRecord,
    NgramIndex,
    draft_room,
)
from tests.engine.agentic import AgenticWorkload
from tests.engine.support import GREEDY, nucleus_logprobs, run


def test_ngram_index_drafts_what_followed_the_latest_match_of_the_longest_suffix():
    index = NgramIndex([1, 2, 3, 4, 5, 9, 2, 3, 7, 8], max_n=3)
    assert index.draft(3) == []  # the suffix (..., 8) never occurred before
    index.extend([9, 2, 3])  # suffix (9, 2, 3) occurred at 5..7, followed by 7, 8, 9, 2
    assert index.draft(4) == [7, 8, 9, 2]
    index.extend([4])  # (3, 4) occurred once, followed by 5, 9
    assert index.draft(2) == [5, 9]
    assert index.draft(0) == []
    index.extend([6])
    assert index.draft(3) == []
    index.extend([5])  # only the last token (5) occurred before: too weak a cue
    assert index.draft(3) == []
    assert NgramIndex([5, 9, 6, 5], min_n=1).draft(2) == [9, 6]


def test_drafts_the_model_mostly_rejects_stop_and_one_token_probes_reopen_them():
    engine, own = DraftRecord(), DraftRecord()
    assert draft_room(own, engine, 6, emitted=1) == 6  # nothing judged yet
    own.record(JUDGED_AFTER, 0)  # the model kept none of one full draft
    assert [draft_room(own, engine, 6, emitted=e) for e in range(1, PROBE_EVERY + 1)] == [0] * (
        PROBE_EVERY - 1
    ) + [1]
    while (own.kept_share() or 0.0) < MIN_KEPT_SHARE:
        own.record(1, 1)  # probes the model keeps
    assert draft_room(own, engine, 6, emitted=1) == 6
    # a new request is judged by the engine's record of requests that sampled alike, until it has its own
    for _ in range(10):
        engine.record(6, 0, ENGINE_DECAY)
    fresh = DraftRecord()
    assert draft_room(fresh, engine, 6, emitted=1) == 0
    fresh.record(JUDGED_AFTER, JUDGED_AFTER)
    assert draft_room(fresh, engine, 6, emitted=1) == 6
    assert draft_room(fresh, engine, 2, emitted=1) == 2  # never more than the room left


def _row(temperature: float, seed: int = 0, top_p: float = 1.0) -> RowSampling:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return RowSampling(temperature, top_p, generator)


def test_verify_greedy_keeps_drafts_while_they_are_the_argmax():
    logits = torch.full((4, 6), -5.0)
    for position, best in enumerate([2, 3, 1, 4]):
        logits[position, best] = 5.0
    out = verify(logits, [_row(0.0)], [[2, 3, 5]])  # the third draft (5) is not the argmax (1)
    assert [t.token_id for t in out[0]] == [2, 3, 1]
    assert out[0][0].logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[2]))
    # all drafts kept: the bonus token from the last position; no drafts: one token
    assert [t.token_id for t in verify(logits[:3], [_row(0.0)], [[2, 3]])[0]] == [2, 3, 1]
    two_rows = verify(torch.cat((logits[:1], logits[:2])), [_row(0.0), _row(0.0)], [[], [0]])
    assert [[t.token_id for t in row] for row in two_rows] == [[2], [2]]


def test_verify_sampled_rule_draws_exactly_from_the_model_distribution():
    """A draft kept with probability p(draft), else a token from p without it: the emitted token is distributed
    as p (whatever the draft), and its logprob is log p(token) under temperature and top-p."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    temperature, top_p = 0.8, 0.9
    p = _restrict_to_nucleus(torch.log_softmax(logits[:1] / temperature, -1), torch.tensor([top_p]))[0].exp()
    for draft in (1, 4):  # a likely draft, and one outside the nucleus (never kept)
        row = _row(temperature, seed=draft, top_p=top_p)
        first = verify(logits, [row], [[draft]])[0][0]
        assert first.logprob == pytest.approx(math.log(p[first.token_id]), abs=1e-5)
        counts = torch.zeros(5)
        draws = 4000
        for _ in range(draws):
            counts[_draw(p.log(), row.generator, draft)] += 1
        # every bin within 4.5 standard deviations of its expected count
        sd = (draws * p * (1 - p)).sqrt()
        assert ((counts - draws * p).abs() <= 4.5 * sd + 1).all(), (counts / draws, p)
    assert counts[4] == 0


@pytest.fixture
def plain_engine():
    """The model without speculative decoding: the reference (one test at a time: with the speculative engine
    and transformers' model alive too, the module peaked at 3.3 GB)."""
    from harnessrl.engine.local import LocalEngine

    eng = LocalEngine(max_batch=8, speculative_tokens=0)
    yield eng
    eng.close()


def test_speculative_greedy_equals_plain_greedy_token_for_token(engine, plain_engine):
    """Three concurrent agentic sessions (their histories repeat tool names and listings, so drafts are kept):
    the same tokens and logprobs with speculation as without, with fewer decode steps."""
    workload = AgenticWorkload(engine.tokenizer, sessions=3, turns=2, max_tokens=16)
    plain = run(workload.run(plain_engine))
    before = engine.snapshot().figures
    fast = run(workload.run(engine))
    after = engine.snapshot().figures
    assert [t.outputs for t in fast] == [t.outputs for t in plain]
    emitted = after["decode_emitted_tokens"] - before["decode_emitted_tokens"]
    row_steps = after["decode_row_tokens"] - before["decode_row_tokens"]
    assert after["speculative_drafted_tokens"] > before["speculative_drafted_tokens"]
    assert emitted > 1.3 * row_steps  # drafts were kept: more tokens than row-steps
    # and the logprobs: the model's log_softmax at each position, whether the token came from a draft or not
    prompt = workload.next_prompt(workload.first_prompt(0), plain[0].outputs[0], 0, 0)
    with_drafts = run(engine.generate(prompt, GREEDY, 24))
    without = run(plain_engine.generate(prompt, GREEDY, 24))
    assert with_drafts.token_ids == without.token_ids
    assert max(abs(a - b) for a, b in zip(with_drafts.logprobs, without.logprobs, strict=True)) < 1e-3


def test_speculative_sampled_logprobs_are_the_models(engine, chat, hf_model):
    """A sampled request whose drafts are kept: every token's logprob equals a full forward pass's
    log_softmax(logits / T) within the top-p nucleus."""
    prompt = chat("Repeat this line ten times: the cat sat on the mat. the cat sat on the mat.")
    temperature, top_p = 0.5, 0.95
    before = engine.snapshot().figures
    gen = run(engine.generate(prompt, SamplingParams(temperature=temperature, top_p=top_p, seed=3), 40))
    after = engine.snapshot().figures
    assert after["decode_emitted_tokens"] - before["decode_emitted_tokens"] > (
        after["decode_row_tokens"] - before["decode_row_tokens"]
    )
    expected = nucleus_logprobs(hf_model, prompt, gen.token_ids, temperature, top_p)
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=2e-3)


@pytest.mark.parametrize("compact", [False, True], ids=["holes", "compacted"])
def test_keys_values_shared_after_speculative_turns_are_the_models(engine, plain_engine, compact):
    """Rows that kept different numbers of drafts leave holes in the batch cache (dropped by compaction once
    there are too many; here forced after every step that made one): the outputs stay the model's, and what a
    finished turn puts in the prefix cache is each token's own keys/values, in order (against what the engine
    without speculation caches for the same turn; its forward pass is transformers' within 1e-4:
    test_model_impl.py)."""
    workload = AgenticWorkload(engine.tokenizer, sessions=3, turns=1, max_tokens=24)
    engine.prefix_cache.clear()
    if compact:
        engine._hole_slack, engine._hole_share = 0, 0.0
    try:
        traces = run(workload.run(engine))
    finally:
        engine._hole_slack, engine._hole_share = type(engine)._hole_slack, type(engine)._hole_share
    assert [t.outputs for t in traces] == [t.outputs for t in run(workload.run(plain_engine))]
    prompt = workload.first_prompt(1)
    fed = prompt + traces[1].outputs[0][:-1]
    hit, cached = engine.prefix_cache.match([*fed, 0])
    assert cached is not None and hit == len(fed) // 16 * 16 > len(prompt)
    plain_hit, plain_cached = plain_engine.prefix_cache.match([*fed, 0])
    assert plain_cached is not None and plain_hit == hit
    assert cached.shape == plain_cached.shape and torch.allclose(cached, plain_cached, atol=1e-4)
