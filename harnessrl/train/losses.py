"""Loss aggregation with global (per optimizer step) denominators, and the PPO policy loss.

Every aggregation mode is a *per-sequence weight* applied to the masked token-loss sum of that sequence:

    L = Σ_i w_i Σ_t ℓ_it m_it

with w_i computed once per optimizer step from the whole step's sequences (across micro-batches and
data-parallel ranks). A micro-batch then contributes Σ_{i∈mb} w_i Σ_t ℓ_it m_it, gradients of micro-batches
add up, and with DDP/FSDP gradient averaging each rank scales its part by dp_size — so neither the
micro-batch size nor the world size changes the loss or its gradient.

Modes (semantics of verl `agg_loss` at verl-project/verl@018f23b5f83a13340421349e40ec42530739b23a:
fully-masked sequences are excluded from sequence counts; `seq-mean-token-sum-norm` divides by a constant
`loss_scale_factor`):
  token-mean               w = 1 / N                 N = masked tokens in the step
  token-sum                w = 1
  seq-mean-token-sum       w = 1 / S                 S = sequences with ≥1 masked token
  seq-mean-token-mean      w = 1 / (S · n_i)         n_i = masked tokens of sequence i
  seq-mean-token-sum-norm  w = 1 / (S · scale)
  rollout-token-mean       w = 1 / (R · N_r(i))      R = rollouts with ≥1 masked token, N_r = their masked tokens
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harnessrl.choices import parse_choice
from harnessrl.train.modes import LossMode


def sequence_weights(
    token_counts: Sequence[int],
    rollout_ids: Sequence[str],
    mode: LossMode,
    loss_scale_factor: float | None = None,
) -> list[float]:
    """Weight per sequence for one optimizer step (all its sequences, on all ranks)."""
    mode = parse_choice(LossMode, mode, "loss_mode")
    if len(token_counts) != len(rollout_ids):
        raise ValueError("token_counts and rollout_ids must have the same length")
    live = [n > 0 for n in token_counts]
    n_tokens = sum(token_counts)
    n_seqs = sum(live)
    if n_tokens == 0:
        return [0.0] * len(token_counts)
    if mode == LossMode.TOKEN_MEAN:
        return [1.0 / n_tokens if ok else 0.0 for ok in live]
    if mode == LossMode.TOKEN_SUM:
        return [1.0 if ok else 0.0 for ok in live]
    if mode == LossMode.SEQ_MEAN_TOKEN_SUM:
        return [1.0 / n_seqs if ok else 0.0 for ok in live]
    if mode == LossMode.SEQ_MEAN_TOKEN_MEAN:
        return [1.0 / (n_seqs * n) if n > 0 else 0.0 for n in token_counts]
    if mode == LossMode.SEQ_MEAN_TOKEN_SUM_NORM:
        if not loss_scale_factor or loss_scale_factor <= 0:
            raise ValueError(
                "seq-mean-token-sum-norm needs a positive loss_scale_factor (e.g. the max response "
                "length); with packed sequences there is no padded horizon to default to"
            )
        return [1.0 / (n_seqs * loss_scale_factor) if ok else 0.0 for ok in live]
    per_rollout: dict[str, int] = defaultdict(int)
    for n, r in zip(token_counts, rollout_ids, strict=True):
        per_rollout[r] += n
    n_rollouts = sum(1 for v in per_rollout.values() if v > 0)
    return [
        1.0 / (n_rollouts * per_rollout[r]) if n > 0 else 0.0
        for n, r in zip(token_counts, rollout_ids, strict=True)
    ]


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: LossMode,
    *,
    rollout_ids: Sequence[str] | None = None,
    loss_scale_factor: float | None = None,
    weights: torch.Tensor | None = None,
    dp_size: int = 1,
) -> torch.Tensor:
    """Aggregates a padded (batch, length) token-loss matrix.

    Without `weights` the batch is taken to be the whole step (local denominators). Pass `weights` from
    `sequence_weights` over the whole step to get a micro-batch's / rank's share of the global loss.
    """
    mask = loss_mask.to(loss_mat.dtype)
    seq_sums = (loss_mat * mask).sum(dim=-1)
    if weights is None:
        counts = [int(c) for c in loss_mask.sum(dim=-1).tolist()]
        ids = list(rollout_ids) if rollout_ids is not None else [str(i) for i in range(len(counts))]
        weights = torch.tensor(
            sequence_weights(counts, ids, mode, loss_scale_factor),
            dtype=loss_mat.dtype,
            device=loss_mat.device,
        )
    return (seq_sums * weights).sum() * dp_size


@dataclass(frozen=True)
class PolicyLossConfig:
    clip_low: float = 0.2  # ε_low: ratio floor 1-ε_low
    clip_high: float = 0.28  # ε_high: ratio ceiling 1+ε_high (clip-higher, DAPO)
    dual_clip_c: float | None = 3.0  # bound -A·c on the loss of negative-advantage tokens; None disables
    tis_cap: float | None = 2.0  # truncated IS weight min(π_old/π_behavior, cap); None disables
    kl_coef: float = 0.0  # KL(π‖π_ref) penalty in the loss (low-variance k3 estimator); 0 disables
    entropy_coef: float = 0.0  # entropy bonus; entropy is always reported

    def __post_init__(self) -> None:
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(
                f"clip_low must be in [0,1) and clip_high ≥ 0, got {self.clip_low}, {self.clip_high}"
            )
        if self.dual_clip_c is not None and self.dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c must be > 1 (got {self.dual_clip_c})")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0 (got {self.tis_cap})")


@dataclass
class TokenLosses:
    pg: torch.Tensor  # per-token policy-gradient loss (IS-weighted)
    clipped: torch.Tensor  # bool: the ε clip was active
    dual_clipped: torch.Tensor  # bool: the dual clip bound was active
    is_weight: torch.Tensor  # truncated IS weight used (1 where disabled)
    approx_kl: torch.Tensor  # log π_old - log π (k1), for reporting


def ppo_token_losses(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    cfg: PolicyLossConfig,
    behavior_logprob: torch.Tensor | None = None,
) -> TokenLosses:
    """PPO clipped surrogate with asymmetric clip, dual clip and token-level truncated IS (verl 'vanilla')."""
    log_ratio = torch.clamp(logprob - old_logprob, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual = torch.zeros_like(clipped)
    if cfg.dual_clip_c is not None:
        bound = -advantages * cfg.dual_clip_c
        dual = (loss > bound) & (advantages < 0)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    is_weight = torch.ones_like(logprob)
    if cfg.tis_cap is not None and behavior_logprob is not None:
        is_weight = (
            torch.exp(torch.clamp(old_logprob - behavior_logprob, -20.0, 20.0))
            .clamp(max=cfg.tis_cap)
            .detach()
        )
        loss = loss * is_weight
    return TokenLosses(
        pg=loss,
        clipped=clipped,
        dual_clipped=dual,
        is_weight=is_weight,
        approx_kl=(old_logprob - logprob).detach(),
    )


def sft_token_losses(logprob: torch.Tensor) -> TokenLosses:
    """Supervised fine-tuning: the per-token loss is -log π(token); which tokens count is the caller's
    loss mask (the sampled tokens of a sample), exactly as for the policy loss."""
    none = torch.zeros_like(logprob, dtype=torch.bool)
    return TokenLosses(
        pg=-logprob,
        clipped=none,
        dual_clipped=none,
        is_weight=torch.ones_like(logprob),
        approx_kl=torch.zeros_like(logprob),
    )


def low_var_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π‖π_ref): exp(ref-logp) - (ref-logp) - 1, clamped as verl does."""
    d = torch.clamp(ref_logprob - logprob, -20.0, 20.0)
    return torch.clamp(torch.exp(d) - d - 1, -10.0, 10.0)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)
