"""Sampling math on small synthetic logits (fast, no model)."""

import math

import torch

from harnessrl.engine import sampling
from harnessrl.engine.sampling import RowSampling, _restrict_to_nucleus, sample


def generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_nucleus_fast_path_equals_full_sort(monkeypatch):
    logits = torch.randn(4, 5000, generator=generator(0)) * 3
    logp = torch.log_softmax(logits, -1)
    top_p = torch.tensor([0.5, 0.9, 0.99, 1e-6])
    fast = _restrict_to_nucleus(logp, top_p)
    monkeypatch.setattr(sampling, "_NUCLEUS_CANDIDATES", 5000)  # forces the full sort
    full = _restrict_to_nucleus(logp, top_p)
    assert torch.equal(torch.isinf(fast), torch.isinf(full))
    assert torch.allclose(fast[~torch.isinf(fast)], full[~torch.isinf(full)], atol=1e-5)
    kept = (~torch.isinf(fast)).sum(-1)
    assert kept[3] == 1  # a tiny top_p keeps only the best token
    probs = logp.exp()
    for row in range(3):  # the kept set is the smallest prefix reaching top_p
        mass = probs[row][~torch.isinf(fast[row])].sum()
        assert mass >= top_p[row] and mass - probs[row][~torch.isinf(fast[row])].min() < top_p[row]


def test_samples_follow_the_distribution_and_logprobs_match():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -8.0]])
    g = generator(5)
    counts = torch.zeros(5)
    for _ in range(3000):
        tok = sample(logits, [RowSampling(1.0, 1.0, g)])[0]
        counts[tok.token_id] += 1
        assert math.isclose(tok.logprob, float(torch.log_softmax(logits, -1)[0, tok.token_id]), abs_tol=1e-6)
    expected = torch.softmax(logits, -1)[0]
    assert torch.allclose(counts / counts.sum(), expected, atol=0.03)


def test_top_p_never_samples_outside_the_nucleus_and_temperature_scales():
    logits = torch.tensor([[3.0, 2.5, 0.0, -1.0]])
    g = generator(1)
    seen = {sample(logits, [RowSampling(0.5, 0.8, g)])[0].token_id for _ in range(300)}
    assert seen <= {0, 1}
    tok = sample(logits, [RowSampling(0.5, 1.0, generator(2))])[0]
    assert math.isclose(
        tok.logprob, float(torch.log_softmax(logits / 0.5, -1)[0, tok.token_id]), abs_tol=1e-6
    )


def test_each_row_uses_its_own_generator():
    logits = torch.randn(3, 100, generator=generator(3))
    alone = sample(logits[1:2], [RowSampling(1.0, 1.0, generator(42))])[0].token_id
    batch = sample(
        logits,
        [
            RowSampling(1.0, 1.0, generator(7)),
            RowSampling(1.0, 1.0, generator(42)),
            RowSampling(0.0, 1.0, generator(9), top_logprobs=2),
        ],
    )
    assert batch[1].token_id == alone
    top = batch[2].top
    assert top is not None and batch[2].token_id == int(logits[2].argmax()) and top[0][0] == batch[2].token_id
    assert batch[0].top is None
