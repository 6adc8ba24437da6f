"""The real SmolLM2-135M on CPU: packed log-probs equal per-sequence ones, and a GRPO step updates it."""

from __future__ import annotations

import pytest
import torch

from harnessrl.train.batching import SPANS, SeqItem, pack, packed_kwargs
from harnessrl.train.losses import sequence_weights
from harnessrl.train.modes import LossMode
from harnessrl.train.segments import use_segments
from harnessrl.train.trainer import Trainer, TrainerConfig, token_logprobs
from tests.train.support import chat_ids


@pytest.mark.slow
def test_packed_logprobs_match_and_a_step_updates_the_real_model(tokenizer):
    from harnessrl.tinymodel import load_model

    model = load_model()
    seqs = []
    for user, answer in (("Say hi.", "Hi!"), ("Name a fruit.", "An apple, which is red."), ("2+2?", "4")):
        p, a = chat_ids(tokenizer, user, answer)
        seqs.append((p + a, [0] * len(p) + [1] * len(a)))
    items = [
        SeqItem(ids, m, [0.0] * len(ids), adv, 0.0, f"r{i}")
        for i, ((ids, m), adv) in enumerate(zip(seqs, (1.0, -1.0, 0.5), strict=True))
    ]
    with torch.no_grad():
        mb = pack(items, 4096)[0]
        packed = token_logprobs(
            model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits, mb.targets
        )[0]
        offset = 0
        for ids, _ in seqs:
            alone = token_logprobs(
                model(input_ids=torch.tensor([ids]), use_cache=False).logits, torch.tensor([ids[1:] + [0]])
            )[0]
            assert torch.allclose(packed[offset : offset + len(ids) - 1], alone[:-1], atol=2e-4)
            offset += len(ids)
        assert use_segments(model)  # the trainer's attention for packed rows: per sequence, no row-wide mask
        kwargs = packed_kwargs(mb)
        assert kwargs[SPANS] == [
            (0, len(seqs[0][0])),
            (len(seqs[0][0]), offset - len(seqs[2][0])),
            (offset - len(seqs[2][0]), offset),
        ]
        per_sequence = token_logprobs(
            model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **kwargs).logits,
            mb.targets,
        )[0]
        assert torch.allclose(per_sequence, packed, atol=2e-4)
        # two replies to one long request: its prompt packed once, each reply's logprobs as when packed whole
        request = (
            "Write one sentence about the sea that holds the word [harbor] and ends with a period, please."
        )
        twice = []
        for answer in ("The [harbor] is calm.", "Ships rest in the [harbor] at night."):
            p, a = chat_ids(tokenizer, request, answer)
            twice.append(SeqItem(p + a, [0] * len(p) + [1] * len(a), [0.0] * (len(p) + len(a)), 1.0, 1.0))
        (shared,) = pack(twice, 4096, share_prefixes=True)
        assert shared.prefix == len(p) - 1 and shared.real_tokens == sum(map(len, twice)) - shared.prefix
        whole = pack(twice, 4096)[0]
        scored = [
            token_logprobs(
                model(
                    input_ids=b.input_ids, position_ids=b.position_ids, use_cache=False, **packed_kwargs(b)
                ).logits,
                b.targets,
            )[0][b.target_mask[0] > 0]
            for b in (shared, whole)
        ]
        assert scored[0].shape == scored[1].shape and torch.allclose(scored[0], scored[1], atol=2e-4)
        # behavior logprobs = the model's own: the on-policy case, IS weights are 1
        for it, (ids, _) in zip(items, seqs, strict=True):
            lp = token_logprobs(
                model(input_ids=torch.tensor([ids]), use_cache=False).logits, torch.tensor([ids[1:] + [0]])
            )[0]
            it.behavior_logprobs = [0.0] + lp[:-1].tolist()
    w = sequence_weights(
        [sum(m[1:]) for _, m in seqs], [it.rollout_id for it in items], LossMode.ROLLOUT_TOKEN_MEAN
    )
    for it, wi in zip(items, w, strict=True):
        it.weight = wi
    before = model.model.embed_tokens.weight.detach().clone()
    cfg = TrainerConfig()
    cfg.optim.lr = 1e-5
    m = Trainer(model, cfg).step(items)
    assert m["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert m["grad_norm"] > 0 and m["padding_fraction"] == 0.0 and m["entropy"] > 0
    assert not torch.equal(before, model.model.embed_tokens.weight)
