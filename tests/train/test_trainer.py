"""Trainer on real forward/backward passes: packing, micro-batching and data parallelism leave the update
unchanged; bf16 and multi-epoch paths run; same seed → same result."""

from __future__ import annotations

import pytest
import torch

from harnessrl.train import trainer as trainer_module
from harnessrl.train.batching import (
    MIN_SHARED_PREFIX,
    MicroBatch,
    SeqItem,
    pack,
    pad,
    plan_packs,
    prefix_families,
)
from harnessrl.train.losses import PolicyLossConfig, ppo_token_losses, sequence_weights
from harnessrl.train.modes import LossMode, Precision
from harnessrl.train.trainer import Trainer, TrainerConfig, token_logprobs
from tests.train.support import tiny_llama

VOCAB = 512  # small vocabulary: the invariances are about batching, not the tokenizer


def small_llama(seed: int = 0):
    return tiny_llama(seed, vocab=VOCAB)


def make_items(mode: LossMode, seed: int = 0) -> list[SeqItem]:
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 40, 12, 3, 25, 9, 17]  # ~10× spread
    rollouts = ["a", "a", "b", "c", "c", "c", "d"]  # rollout a split in 2 samples, c in 3
    advs = {"a": 1.0, "b": -0.5, "c": 0.25, "d": -1.5}
    seqs = []
    for n in lengths:
        ids = torch.randint(3, VOCAB, (n,), generator=g).tolist()
        cut = max(1, n // 3)
        mask = [0] * cut + [1] * (n - cut)
        beh = [0.0] * cut + (-torch.rand(n - cut, generator=g) * 3).tolist()
        seqs.append((ids, mask, beh))
    counts = [sum(m[1:]) for _, m, _ in seqs]
    w = sequence_weights(counts, rollouts, mode, loss_scale_factor=64.0)
    return [SeqItem(i, m, b, advs[r], wi, r) for (i, m, b), r, wi in zip(seqs, rollouts, w, strict=True)]


def simulated_dp_grads(shares: list[list[SeqItem]], cfg: TrainerConfig, world: int) -> tuple[float, dict]:
    """Simulated data parallelism: each rank's share scaled by the world size, gradients averaged."""
    model = small_llama()
    total = 0.0
    acc = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for share in shares:
        for mb in pack(share, 10_000):
            lp = token_logprobs(
                model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits,
                mb.targets,
            )
            tl = ppo_token_losses(lp, lp.detach(), mb.advantages, cfg.policy, mb.behavior_logprobs)
            loss = (tl.pg * mb.target_mask * mb.weights).sum() * world
            loss.backward()
            total += float(loss.detach()) / world
        for n, p in model.named_parameters():
            if p.grad is not None:
                acc[n] += p.grad / world
                p.grad = None
    return total, acc


def grads_of_step(items, cfg: TrainerConfig) -> tuple[float, dict]:
    """Loss and gradient of one Trainer step (captured just before the optimizer applies it)."""
    model = small_llama()
    tr = Trainer(model, cfg)
    grads: dict = {}

    def capture(*_):
        grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    tr.optimizer.register_step_pre_hook(capture)
    m = tr.step(items)
    return m["loss"], grads


def no_clip(**kw) -> TrainerConfig:
    cfg = TrainerConfig(**kw)
    cfg.optim.max_grad_norm = 1e9
    return cfg


@pytest.mark.parametrize(
    "mode", [LossMode.TOKEN_MEAN, LossMode.SEQ_MEAN_TOKEN_MEAN, LossMode.ROLLOUT_TOKEN_MEAN]
)
def test_micro_batch_budget_and_padding_do_not_change_loss_or_gradient(mode):
    items = make_items(mode)
    ref_loss, ref = grads_of_step(
        items, no_clip(loss_mode=mode, max_tokens_per_micro_batch=10_000, loss_scale_factor=64.0)
    )
    for cfg in (
        no_clip(loss_mode=mode, max_tokens_per_micro_batch=45, loss_scale_factor=64.0),
        no_clip(loss_mode=mode, packing=False, seqs_per_micro_batch=2, loss_scale_factor=64.0),
    ):
        loss, grads = grads_of_step(items, cfg)
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        for name, g in ref.items():
            assert torch.allclose(grads[name], g, rtol=1e-4, atol=1e-7), name


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_the_output_head_scores_only_trained_positions_and_leaves_the_update_unchanged(
    entropy_coef, monkeypatch
):
    """The chunked head skips the prompt positions (a third of these tokens): same loss, gradient and entropy as
    the model's whole logits, in one chunk or many, with and without the entropy's gradient."""
    mode = LossMode.ROLLOUT_TOKEN_MEAN
    items = make_items(mode)

    def cfg(chunk: int) -> TrainerConfig:
        return no_clip(
            loss_mode=mode, head_chunk_tokens=chunk, policy=PolicyLossConfig(entropy_coef=entropy_coef)
        )

    ref_loss, ref = grads_of_step(items, cfg(0))
    ref_entropy = Trainer(small_llama(), cfg(0)).step(items)["entropy"]
    for chunk in (256, 7):
        loss, grads = grads_of_step(items, cfg(chunk))
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        for name, g in ref.items():
            assert torch.allclose(grads[name], g, rtol=1e-4, atol=1e-7), name
        assert Trainer(small_llama(), cfg(chunk)).step(items)["entropy"] == pytest.approx(
            ref_entropy, rel=1e-5
        )
    # what the head computed: the trained positions' rows alone, each the whole logits' log-prob
    trainer, scored_rows = Trainer(small_llama(), cfg(7)), []
    score = trainer_module._chunk_scores
    monkeypatch.setattr(
        trainer_module, "_chunk_scores", lambda head, h, *a: scored_rows.append(len(h)) or score(head, h, *a)
    )
    (mb,) = pack(items, 10_000)
    logprobs = trainer._logprobs_no_grad(trainer.model, mb)
    trained = mb.target_mask > 0
    assert sum(scored_rows) == int(trained.sum()) < mb.input_ids.numel() and max(scored_rows) <= 7
    whole = token_logprobs(
        trainer.model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits,
        mb.targets,
    )
    assert torch.allclose(logprobs[trained], whole[trained], atol=1e-5)
    assert not logprobs[~trained].any()


@pytest.mark.parametrize("world", [3])
def test_simulated_data_parallel_world_size_does_not_change_gradient(world):
    mode = LossMode.ROLLOUT_TOKEN_MEAN
    items = make_items(mode)
    ref_loss, ref = grads_of_step(items, no_clip(loss_mode=mode))
    shares = [items[r::world] for r in range(world)]
    loss, acc = simulated_dp_grads(shares, no_clip(loss_mode=mode), world)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for name, g in ref.items():
        assert torch.allclose(acc[name], g, rtol=1e-4, atol=1e-7), name


def items_with_shared_prompts(mode: LossMode) -> list[SeqItem]:
    """Two "system prompts" (60 and 45 tokens) under 3 and 2 replies, each reply after a task line of its own
    (two replies share theirs: a group), and one sequence that shares nothing; replies trained, prompts not."""
    g = torch.Generator().manual_seed(3)
    systems = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (60, 45)]
    task = torch.randint(3, VOCAB, (6,), generator=g).tolist()
    layout = [(0, task), (0, task), (0, None), (1, None), (1, None), (None, None)]
    rollouts = ["a", "b", "c", "d", "d", "e"]
    advs = {"a": 1.0, "b": -0.5, "c": 0.25, "d": -1.5, "e": 0.75}
    seqs = []
    for n, (system, own_task) in zip((9, 14, 5, 20, 7, 11), layout, strict=True):
        prompt = (systems[system] if system is not None else []) + (
            own_task or torch.randint(3, VOCAB, (6,), generator=g).tolist()
        )
        reply = torch.randint(3, VOCAB, (n,), generator=g).tolist()
        beh = [0.0] * len(prompt) + (-torch.rand(n, generator=g) * 3).tolist()
        seqs.append((prompt + reply, [0] * len(prompt) + [1] * n, beh))
    counts = [sum(m[1:]) for _, m, _ in seqs]
    w = sequence_weights(counts, rollouts, mode, loss_scale_factor=64.0)
    return [SeqItem(i, m, b, advs[r], wi, r) for (i, m, b), r, wi in zip(seqs, rollouts, w, strict=True)]


def test_shared_prefixes_are_packed_once_and_leave_the_update_unchanged():
    """A prompt several sequences start with is packed once (each family: the tokens up to the one before
    its first trained token, where they all agree), and the step's loss and gradient are those of packing
    every sequence whole: per-sequence attention over prefix + own span reads the same context."""
    mode = LossMode.ROLLOUT_TOKEN_MEAN
    items = items_with_shared_prompts(mode)
    families = prefix_families(items)
    # the group's two replies share system + task (66 tokens: 65 before the last shared one), the third reply
    # of that system only the system (59); the other system's two share theirs (44); the last nothing
    assert sorted(families) == [(0, [5]), (44, [3, 4]), (59, [0, 1, 2])]
    assert MIN_SHARED_PREFIX <= 44
    shared, whole = pack(items, 10_000, share_prefixes=True), pack(items, 10_000)
    assert sum(b.real_tokens for b in shared) == sum(len(it) for it in items) - 2 * 59 - 44
    assert sum(b.real_tokens for b in whole) == sum(len(it) for it in items)
    assert sum(float(b.target_mask.sum()) for b in shared) == sum(float(b.target_mask.sum()) for b in whole)
    # sequences that share nothing are packed together as before, not a row each
    unrelated = make_items(mode)
    assert len(pack(unrelated, 64, share_prefixes=True)) == len(pack(unrelated, 64)) < len(unrelated)
    ref_loss, ref = grads_of_step(items, no_clip(loss_mode=mode, share_prefixes=False))
    for budget in (10_000, 40):  # one row per family, and families split over rows of their own prefix
        loss, grads = grads_of_step(items, no_clip(loss_mode=mode, max_tokens_per_micro_batch=budget))
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        for name, g in ref.items():
            assert torch.allclose(grads[name], g, rtol=1e-4, atol=1e-6), name


def test_a_prefix_ends_before_the_first_trained_token_of_any_sequence_that_shares_it():
    mode = LossMode.TOKEN_MEAN
    items = items_with_shared_prompts(mode)[3:5]
    items[1].loss_mask = [0] * 40 + [1] * (len(items[1]) - 40)  # trains tokens of the prompt from 40 on
    assert prefix_families(items) == [(39, [0, 1])]  # position 38 predicts token 39: shared, untrained
    items[1].loss_mask = [0] * 20 + [1] * (len(items[1]) - 20)  # too little left to share
    assert sorted(prefix_families(items)) == [(0, [0]), (0, [1])]


def test_groups_under_one_system_prompt_each_share_their_whole_prompt_not_only_the_system_prompt():
    """A step of several groups: every sequence starts with the same system prompt (40 tokens), each group's
    with its own task (30 more). One family on the system prompt would save 8 x 39 tokens; a family per group
    on its whole prompt saves 3 x 2 x 69, and that is the cut taken (the fewest tokens computed)."""
    g = torch.Generator().manual_seed(5)
    system = torch.randint(3, VOCAB, (40,), generator=g).tolist()
    items = []
    for _group in range(3):
        prompt = system + torch.randint(3, VOCAB, (30,), generator=g).tolist()
        for _reply in range(3):
            reply = torch.randint(3, VOCAB, (8,), generator=g).tolist()
            items.append(SeqItem(prompt + reply, [0] * 70 + [1] * 8, [0.0] * 78, 1.0, 1.0, "r"))
    assert sorted(prefix_families(items)) == [(69, [0, 1, 2]), (69, [3, 4, 5]), (69, [6, 7, 8])]
    computed = sum(b.real_tokens for b in pack(items, 10_000, share_prefixes=True))
    assert computed == 9 * 78 - 3 * 2 * 69


def padding_fraction(batches: list[MicroBatch]) -> float:
    return sum(b.pad_tokens for b in batches) / sum(b.real_tokens + b.pad_tokens for b in batches)


def test_packing_removes_padding_and_never_crosses_sequences():
    items = make_items(LossMode.TOKEN_MEAN)
    packed, padded = pack(items, 64), pad(items, 3)
    assert padding_fraction(packed) == 0.0
    assert padding_fraction(padded) > 0.3
    assert sorted(i for p in plan_packs([len(x) for x in items], 64) for i in p) == list(range(len(items)))
    mb = packed[0]
    starts = (mb.position_ids[0] == 0).nonzero().flatten().tolist()
    ends = [s - 1 for s in starts[1:]] + [mb.input_ids.shape[1] - 1]
    assert all(mb.target_mask[0, e] == 0 for e in ends)  # last token of a sequence predicts nothing


def test_same_seed_same_losses_and_bf16_runs():
    items = make_items(LossMode.ROLLOUT_TOKEN_MEAN)
    a = Trainer(small_llama(), TrainerConfig()).step(items)["loss"]
    b = Trainer(small_llama(), TrainerConfig()).step(items)["loss"]
    assert a == b
    m = Trainer(small_llama(), TrainerConfig(precision=Precision.BF16)).step(items)
    assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0


def test_ppo_epochs_recompute_old_policy_and_clip_after_first_update():
    items = make_items(LossMode.TOKEN_MEAN)
    cfg = TrainerConfig(loss_mode=LossMode.TOKEN_MEAN, ppo_epochs=3)
    cfg.optim.lr = 5e-2
    tr = Trainer(small_llama(), cfg)
    m = tr.step(items)
    assert tr.global_step == 3
    assert m["clip_frac"] > 0  # the third epoch's ratio has moved away from π_old
    assert m["approx_kl"] != 0


def test_kl_to_reference_needs_and_uses_a_reference_model():
    from harnessrl.train.losses import PolicyLossConfig

    cfg = TrainerConfig(policy=PolicyLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="reference model"):
        Trainer(small_llama(), cfg)
    ref = small_llama(seed=1).requires_grad_(False)
    m = Trainer(small_llama(), cfg, ref_model=ref).step(make_items(LossMode.ROLLOUT_TOKEN_MEAN))
    assert m["kl_ref"] > 0


def test_a_sum_norm_loss_without_its_scale_is_refused_when_the_config_is_read():
    """Refused before any rollout runs, not at the first optimizer step."""
    with pytest.raises(ValueError, match="train.loss_scale_factor: seq-mean-token-sum-norm needs a positive"):
        TrainerConfig(loss_mode=LossMode.SEQ_MEAN_TOKEN_SUM_NORM)
    assert (
        TrainerConfig(loss_mode=LossMode.SEQ_MEAN_TOKEN_SUM_NORM, loss_scale_factor=128).loss_scale_factor
        == 128
    )
