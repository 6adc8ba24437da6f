"""Loss aggregation (parity table, verl agg_loss, invariances) and the PPO policy loss."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.train.losses import (
    PolicyLossConfig,
    agg_loss,
    entropy_from_logits,
    low_var_kl,
    ppo_token_losses,
    sequence_weights,
)
from harnessrl.train.modes import LossMode

# 3 sequences (rows), the last fully masked; rollouts: rows 0,1 → "a", row 2 → "b"
LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 8.0, 9.0, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
ROLLOUTS = ["a", "a", "b"]

# hand computed: row sums 6 and 11 over 3 and 2 tokens; the masked row is excluded from every count
PARITY = [
    (LossMode.TOKEN_MEAN, None, (6 + 11) / 5),
    (LossMode.TOKEN_SUM, None, 17.0),
    (LossMode.SEQ_MEAN_TOKEN_SUM, None, (6 + 11) / 2),
    (LossMode.SEQ_MEAN_TOKEN_MEAN, None, (6 / 3 + 11 / 2) / 2),
    (LossMode.SEQ_MEAN_TOKEN_SUM_NORM, 4.0, (6 + 11) / 2 / 4),
    (LossMode.ROLLOUT_TOKEN_MEAN, None, (6 + 11) / 5),  # one live rollout "a" with 5 tokens
]


@pytest.mark.parametrize(("mode", "scale", "expected"), PARITY)
def test_parity_table(mode, scale, expected):
    got = agg_loss(LOSS, MASK, mode, rollout_ids=ROLLOUTS, loss_scale_factor=scale)
    assert float(got) == pytest.approx(expected)


def test_rollout_token_mean_formula_two_rollouts():
    # L = 1/R Σ_r Σ_{s∈r,t} ℓm / Σ_{s∈r,t} m with rollout a = rows 0,1 (5 tokens), b = row 2 (2 tokens)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 1]])
    got = agg_loss(LOSS, mask, LossMode.ROLLOUT_TOKEN_MEAN, rollout_ids=ROLLOUTS)
    assert float(got) == pytest.approx(((6 + 11) / 5 + (7 + 1) / 2) / 2)


def verl_agg_loss(
    loss_mat,
    loss_mask,
    mode,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
):
    """verl `agg_loss` at verl-project/verl@018f23b5 restated for the comparison (verl is not a dependency)."""
    mask = loss_mask.to(loss_mat.dtype)
    if mode == "token-mean":
        n = mask.sum() if batch_num_tokens is None else batch_num_tokens
        return (loss_mat * mask).sum() / n * dp_size
    if mode == "token-sum":
        return (loss_mat * mask).sum() * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq = (loss_mat * mask).sum(-1)
        live = (mask.sum(-1) > 0).to(loss_mat.dtype)
        g = live.sum() if global_batch_size is None else global_batch_size
        loss = (seq * live).sum() / g * dp_size
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if mode == "seq-mean-token-mean":
        cnt = mask.sum(-1)
        seq = (loss_mat * mask).sum(-1) / (cnt + 1e-8)
        live = (cnt > 0).to(loss_mat.dtype)
        g = live.sum() if global_batch_size is None else global_batch_size
        return (seq * live).sum() / g * dp_size
    raise ValueError(mode)


VERL_MODES = [m for m in LossMode if m != LossMode.ROLLOUT_TOKEN_MEAN]


def random_batch(seed: int, rows: int = 8, width: int = 9):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(rows, width, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, width + 1, (rows,), generator=g)
    lengths[0] = 0  # always one fully-masked row
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    rollouts = [f"r{int(i)}" for i in torch.randint(0, 3, (rows,), generator=g)]
    return loss, mask, rollouts


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_matches_verl_agg_loss_whole_batch(mode, seed):
    loss, mask, _ = random_batch(seed)
    scale = 9.0 if mode == LossMode.SEQ_MEAN_TOKEN_SUM_NORM else None
    ours = agg_loss(loss, mask, mode, loss_scale_factor=scale)
    # verl adds 1e-8 to per-sequence token counts in seq-mean-token-mean; we divide exactly
    assert float(ours) == pytest.approx(
        float(verl_agg_loss(loss, mask, mode, loss_scale_factor=scale)), rel=1e-6, abs=1e-7
    )


@pytest.mark.parametrize("mode", VERL_MODES)
@pytest.mark.parametrize("dp_size", [2, 4])
def test_matches_verl_global_denominators_across_ranks(mode, dp_size):
    """verl: each rank scales by dp_size with global token/sequence counts; DDP averages the ranks."""
    loss, mask, rollouts = random_batch(7, rows=8)
    scale = 9.0 if mode == LossMode.SEQ_MEAN_TOKEN_SUM_NORM else None
    w = torch.tensor(sequence_weights(mask.sum(-1).tolist(), rollouts, mode, scale), dtype=loss.dtype)
    n_tokens, n_seqs = mask.sum(), (mask.sum(-1) > 0).sum()
    shards = [list(range(r, 8, dp_size)) for r in range(dp_size)]
    ours = [agg_loss(loss[s], mask[s], mode, weights=w[s], dp_size=dp_size) for s in shards]
    theirs = [verl_agg_loss(loss[s], mask[s], mode, dp_size, n_tokens, n_seqs, scale) for s in shards]
    assert [float(x) for x in ours] == pytest.approx([float(x) for x in theirs], rel=1e-6, abs=1e-7)
    # averaging over ranks (what DDP does to gradients) gives the whole-batch loss
    assert float(sum(ours) / dp_size) == pytest.approx(
        float(agg_loss(loss, mask, mode, loss_scale_factor=scale))
    )


@pytest.mark.parametrize("mode", list(LossMode))
@pytest.mark.parametrize("micro", [1, 2, 3, 8])
def test_micro_batching_does_not_change_loss_or_gradient(mode, micro):
    loss, mask, rollouts = random_batch(3)
    scale = 9.0 if mode == LossMode.SEQ_MEAN_TOKEN_SUM_NORM else None
    w = torch.tensor(sequence_weights(mask.sum(-1).tolist(), rollouts, mode, scale), dtype=loss.dtype)
    full_param = loss.clone().requires_grad_(True)
    full = agg_loss(full_param, mask, mode, rollout_ids=rollouts, loss_scale_factor=scale)
    full.backward()
    param = loss.clone().requires_grad_(True)
    total = 0.0
    for s in range(0, 8, micro):
        part = agg_loss(param[s : s + micro], mask[s : s + micro], mode, weights=w[s : s + micro])
        part.backward()
        total += float(part.detach())
    assert total == pytest.approx(float(full))
    assert param.grad is not None and full_param.grad is not None
    assert torch.allclose(param.grad, full_param.grad)


def test_splitting_a_rollout_keeps_its_weight_only_under_rollout_level_mode():
    """Rollout a = 4 tokens in one sample, or the same 4 tokens as 2 samples of 2; rollout b = 2 tokens."""
    one = sequence_weights([4, 2], ["a", "b"], LossMode.ROLLOUT_TOKEN_MEAN)
    split = sequence_weights([2, 2, 2], ["a", "a", "b"], LossMode.ROLLOUT_TOKEN_MEAN)
    weight_a = lambda w, n: sum(wi * ni for wi, ni in zip(w, n, strict=True))  # noqa: E731
    assert weight_a(one[:1], [4]) == pytest.approx(weight_a(split[:2], [2, 2])) == pytest.approx(0.5)
    assert one[1] * 2 == pytest.approx(split[2] * 2) == pytest.approx(0.5)
    # seq-mean-token-mean gives the split rollout 2/3 of the weight instead of 1/2
    sm = sequence_weights([2, 2, 2], ["a", "a", "b"], LossMode.SEQ_MEAN_TOKEN_MEAN)
    assert weight_a(sm[:2], [2, 2]) == pytest.approx(2 / 3)


def test_seq_mean_token_sum_norm_requires_a_constant_scale():
    with pytest.raises(ValueError, match="loss_scale_factor"):
        sequence_weights([3], ["a"], LossMode.SEQ_MEAN_TOKEN_SUM_NORM)
    with pytest.raises(ValueError, match="loss_mode must be one of token-mean, .*, got 'sum-everything'"):
        sequence_weights([3], ["a"], "sum-everything")  # type: ignore[arg-type]


# ---- policy loss -------------------------------------------------------------------------------------


def test_ppo_clip_asymmetric_and_dual_clip_by_hand():
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0, tis_cap=None)
    ratio = torch.tensor([1.5, 0.5, 1.1, 5.0, 0.7])
    adv = torch.tensor([1.0, 1.0, -2.0, -1.0, -1.0])
    old = torch.zeros(5)
    tl = ppo_token_losses(ratio.log(), old, adv, cfg)
    # A>0, r=1.5 → clipped at 1.28; A>0, r=0.5 → unclipped min objective (-0.5);
    # A<0, r=1.1 → 2.2; A<0, r=5 → max(5, 1.28)=5 bounded by dual clip 3; A<0, r=0.7 → max(-(-0.7), 0.8)=0.8
    assert tl.pg.tolist() == pytest.approx([-1.28, -0.5, 2.2, 3.0, 0.8])
    assert tl.clipped.tolist() == [True, False, False, False, True]
    assert tl.dual_clipped.tolist() == [False, False, False, True, False]


def verl_vanilla(old, logp, adv, clip_low, clip_high, c):
    """verl compute_policy_loss_vanilla per-token losses (before agg_loss), restated."""
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    c1 = torch.maximum(l1, l2)
    c2 = torch.min(-adv * c, c1)
    return torch.where(adv < 0, c2, c1)


@pytest.mark.parametrize("seed", range(3))
def test_policy_loss_matches_verl_vanilla(seed):
    g = torch.Generator().manual_seed(seed)
    old, logp = -torch.rand(4, 7, generator=g) * 3, -torch.rand(4, 7, generator=g) * 3
    adv = torch.randn(4, 1, generator=g).expand(4, 7)
    mask = (torch.rand(4, 7, generator=g) > 0.3).long()
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.3, dual_clip_c=3.0, tis_cap=None)
    ours = ppo_token_losses(logp, old, adv, cfg).pg
    theirs = verl_vanilla(old, logp, adv, 0.2, 0.3, 3.0)
    assert torch.allclose(ours, theirs)
    assert float(agg_loss(ours, mask, LossMode.TOKEN_MEAN)) == pytest.approx(
        float(verl_agg_loss(theirs, mask, LossMode.TOKEN_MEAN))
    )


def test_truncated_importance_weights_from_behavior_logprobs():
    cfg = PolicyLossConfig(tis_cap=2.0)
    old = torch.tensor([-1.0, -1.0, -1.0])
    behavior = torch.tensor([-1.0, -3.0, -0.5])  # same, much less likely under the sampler, more likely
    adv = torch.ones(3)
    logp = old.clone().requires_grad_(True)
    tl = ppo_token_losses(logp, old, adv, cfg, behavior)
    assert tl.is_weight.tolist() == pytest.approx([1.0, 2.0, math.exp(-0.5)])  # e^2 truncated to 2
    tl.pg.sum().backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx(
        [-1.0, -2.0, -math.exp(-0.5)]
    )  # weights are not differentiated


def test_low_var_kl_and_entropy():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0])
    assert low_var_kl(logp, ref).tolist() == pytest.approx([0.0, math.exp(1) - 1 - 1])
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-6)


def test_config_validation():
    with pytest.raises(ValueError, match="dual_clip_c"):
        PolicyLossConfig(dual_clip_c=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossConfig(clip_low=1.5)
