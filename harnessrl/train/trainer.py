"""The torch training loop for one optimizer step over a set of whole rollouts.

Same code on CPU and GPU: `device` picks where the model lives; under torch.distributed the model is sharded
with FSDP2 (distributed.wrap_fsdp), each rank passes its share of the step's sequences (weights stay global,
see losses.py) and FSDP's reduce-scatter averages the gradients across ranks.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import NamedTuple, TypedDict

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from harnessrl import memory
from harnessrl.choices import parse_choice
from harnessrl.train import distributed as dist_mod
from harnessrl.train.batching import MicroBatch, SeqItem, pack, packed_kwargs, pad
from harnessrl.train.lora import LoraSettings
from harnessrl.train.losses import (
    PolicyLossConfig,
    entropy_from_logits,
    low_var_kl,
    ppo_token_losses,
    sft_token_losses,
)
from harnessrl.train.modes import LossMode, Objective, Precision

# Settings that change how much memory a step takes, not its result (the loss's denominators are global to the
# step, losses.py): a run's identity hashes them at the values every earlier version ran with, so that a run
# resumes whatever they are set to and the identities of earlier runs still hold.
MEMORY_SETTINGS_AS_HASHED: dict[str, object] = {
    "max_tokens_per_micro_batch": 4096,
    "activation_checkpointing": None,
    "head_chunk_tokens": None,
    "share_prefixes": None,
}

# how a checkpoint's optimizer state is keyed: a DP run saves the full, FQN-keyed state (see state_dict)
FULL_FQN_OPTIMIZER = "full_fqn"


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    lr_schedule: str = "constant_with_warmup"  # any transformers.get_scheduler name
    warmup_steps: int = 0
    total_steps: int = 1000  # used by decaying schedules
    max_grad_norm: float = 1.0


@dataclass
class TrainerConfig:
    """Settings of one optimizer step (the stage's settings, round.TrainConfig, hold one of these)."""

    loss_mode: LossMode = LossMode.ROLLOUT_TOKEN_MEAN
    loss_scale_factor: float | None = None  # only for seq-mean-token-sum-norm
    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    packing: bool = True
    # Packed micro-batch budget. Its full-vocabulary logits (tokens × vocab, fp32) and the activations it keeps
    # for the backward grow with it: 1,024 keeps one step of the tiny model under ~1.3 GB above its weights and
    # optimizer state, where 4,096 took ~6 GB, and was no faster on a CPU (docs/train.md, "Memory").
    max_tokens_per_micro_batch: int = 1024
    # Sequences that start with the same untrained tokens (a CLI's system prompt, a group's task) are packed
    # with that start once (batching.py): the same update, computed on fewer tokens. Only where the models
    # attend per sequence (segments.py).
    share_prefixes: bool = True
    # Recompute each decoder layer in the backward instead of keeping its activations: ~30 layers × tokens ×
    # hidden kept instead of every intermediate of every layer, for one more forward pass.
    activation_checkpointing: bool = True
    # The output head scores this many positions at a time (log π(target) and entropy), recomputed in the
    # backward: a (tokens × vocab) logits tensor never exists whole (0, or a model without a transformers
    # output head: the model's own whole logits)
    head_chunk_tokens: int = 256
    seqs_per_micro_batch: int = 4  # padded micro-batches (packing=False)
    precision: Precision = Precision.FP32
    ppo_epochs: int = 1  # optimizer steps per batch; >1 recomputes π_old once before the first
    seed: int = 0
    objective: Objective = Objective.PPO  # SFT: NLL of the trained tokens (the sft stage)
    lora: LoraSettings = field(default_factory=LoraSettings)  # rank 0: every weight trains

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)
        self.loss_mode = parse_choice(LossMode, self.loss_mode, "train.loss_mode")
        self.objective = parse_choice(Objective, self.objective, "train.objective")
        self.precision = parse_choice(Precision, self.precision, "train.precision")
        if self.ppo_epochs < 1:
            raise ValueError("ppo_epochs must be ≥ 1")
        if self.loss_mode is LossMode.SEQ_MEAN_TOKEN_SUM_NORM and not (self.loss_scale_factor or 0) > 0:
            raise ValueError(
                "train.loss_scale_factor: seq-mean-token-sum-norm needs a positive loss_scale_factor (e.g. the "
                "longest reply in tokens); packed sequences have no padded horizon to default to"
            )
        if self.head_chunk_tokens < 0:
            raise ValueError(
                f"head_chunk_tokens must be >= 0 (0: whole logits), got {self.head_chunk_tokens}"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def hashed(settings: dict) -> dict:
        """A run identity's view of these settings (`to_dict()`'s layout): the memory-only ones at their hashed
        values (None: not hashed); `lora` only where adapters are trained, so that a full fine-tuning run keeps
        the identity it had before LoRA existed (its checkpoints still resume)."""
        out = dict(settings)
        for name, hashed in MEMORY_SETTINGS_AS_HASHED.items():
            if hashed is None:
                out.pop(name, None)
            else:
                out[name] = hashed
        if not (out.get("lora") or {}).get("rank"):
            out.pop("lora", None)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> TrainerConfig:
        d = dict(d)
        policy = PolicyLossConfig(**d.pop("policy", {}))
        optim_d = dict(d.pop("optim", {}))
        if "betas" in optim_d:
            optim_d["betas"] = tuple(optim_d["betas"])
        return cls(policy=policy, optim=OptimConfig(**optim_d), **d)


class StepMetrics(TypedDict):
    """What one optimizer step reports."""

    loss: float
    pg_loss: float
    grad_norm: float
    lr: float
    entropy: float
    clip_frac: float
    dual_clip_frac: float
    is_weight_mean: float
    approx_kl: float
    kl_ref: float
    trained_tokens: float  # loss-masked tokens, summed over ranks
    step: int  # the trainer's own count of steps
    sequences: int
    micro_batches: int
    tokens: int  # the sequences' tokens
    computed_tokens: int  # the tokens the model ran: fewer where sequences share a prefix (batching.py)
    padding_fraction: float
    step_seconds: float
    tokens_per_s: float


STEP_METRICS = tuple(StepMetrics.__annotations__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log π(target | prefix) at every position; cross_entropy avoids materializing a second (T, V) tensor."""
    flat = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    )
    return -flat.view(targets.shape)


@torch.no_grad()
def token_entropy(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    flat = logits.detach().reshape(-1, logits.shape[-1])
    out = []
    for s in range(0, flat.shape[0], chunk):
        logp = torch.log_softmax(flat[s : s + chunk].float(), dim=-1)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out).view(logits.shape[:-1])


class TokenScores(NamedTuple):
    """Per position of a micro-batch: log π(target | prefix), and the entropy of π there (with a gradient only
    when the loss uses it)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


def _chunk_scores(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(head(hidden).float(), dim=-1)
    lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with contextlib.nullcontext() if entropy_grad else torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy


def output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """A transformers model's output head (the module that makes logits), or None."""
    from transformers import PreTrainedModel

    head = model.get_output_embeddings() if isinstance(model, PreTrainedModel) else None
    return head if isinstance(head, torch.nn.Module) else None


@contextlib.contextmanager
def scoring_head(
    head: torch.nn.Module, targets: torch.Tensor, trained: torch.Tensor, chunk: int, entropy_grad: bool
) -> Iterator[None]:
    """While open, the output head returns [rows, T, 2] (log π(target), entropy) instead of logits, `chunk`
    positions at a time under activation checkpointing: the backward recomputes each chunk's logits, so at
    most one chunk's (chunk × vocab) exists at once. Only the positions where `trained` is true are scored
    (0 elsewhere: the loss and every metric mask them out): a prompt, a tool's output or a shared prefix costs
    the head nothing. A micro-batch without any scores its first position alone, so that the head still gets a
    (zero) gradient and every FSDP rank reduces the same tensors. The head is still called inside the model's
    own forward, so FSDP2 has its parameters gathered as usual."""
    plain = head.forward
    where = trained.reshape(-1).nonzero().squeeze(-1)
    if not len(where):
        where = where.new_zeros(1)

    def score(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        kept, tgt = flat.index_select(0, where), targets.reshape(-1).index_select(0, where)
        parts = [
            checkpoint(
                _chunk_scores,
                plain,
                kept[s : s + chunk],
                tgt[s : s + chunk],
                entropy_grad,
                use_reentrant=False,
            )
            for s in range(0, kept.shape[0], chunk)
        ]
        lp = torch.cat([p[0] for p in parts])
        entropy = torch.cat([p[1] for p in parts])
        scored = flat.new_zeros(flat.shape[0], 2, dtype=torch.float32)
        return scored.index_copy(0, where, torch.stack((lp, entropy), dim=-1)).view(*hidden.shape[:-1], 2)

    head.forward = score
    try:
        yield
    finally:
        del head.forward  # the class's forward again


def resolve_precision(precision: Precision, model: torch.nn.Module, device: torch.device) -> Precision:
    """`auto`: bf16 where this host multiplies it faster than fp32 at the model's shapes (the probe of
    `harnessrl.numformat`, measured once per host and cached), else fp32. The weights and AdamW's state stay
    fp32 either way: bf16 is autocast compute."""
    if precision is not Precision.AUTO:
        return precision
    from harnessrl import numformat

    picked = numformat.resolve("auto", "trainer", getattr(model, "config", None), device)
    return Precision.BF16 if picked == numformat.BFLOAT16 else Precision.FP32


def enable_activation_checkpointing(model: torch.nn.Module) -> bool:
    """transformers' per-layer recomputation (non-reentrant, so FSDP2 and frozen inputs work); False, the model
    unchanged, where the model has none."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel) or not model.supports_gradient_checkpointing:
        return False
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return True


def micro_batches(
    items: Sequence[SeqItem], cfg: TrainerConfig, pad_id: int = 0, share_prefixes: bool = False
) -> list[MicroBatch]:
    if cfg.packing:
        return pack(items, cfg.max_tokens_per_micro_batch, share_prefixes)
    return pad(items, cfg.seqs_per_micro_batch, pad_id)


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        ref_model: torch.nn.Module | None = None,
        device: str | torch.device = "cpu",
        pad_id: int = 0,
    ):
        from transformers import get_scheduler

        self.model = model
        self.cfg = cfg
        self.ref_model = ref_model
        self.device = torch.device(device)
        self.pad_id = pad_id
        if cfg.policy.kl_coef > 0 and ref_model is None:
            raise ValueError("kl_coef > 0 needs a reference model")
        if self.world_size > 1 and not dist_mod.is_fsdp(model):
            raise ValueError(
                "under torch.distributed the model must be sharded first (distributed.wrap_fsdp): FSDP "
                "averages the gradients across ranks"
            )
        self.precision = resolve_precision(cfg.precision, model, self.device)
        self._per_sequence: set[int] = set()  # models whose packed rows attend per sequence (segments.py)
        if cfg.packing:
            from harnessrl.train.segments import use_segments  # transformers: only where a trainer runs

            self._per_sequence = {id(m) for m in (model, ref_model) if m is not None and use_segments(m)}
        # a shared prefix is only read right by per-sequence attention: every model the rows go through must have it
        self.share_prefixes = cfg.share_prefixes and all(
            id(m) in self._per_sequence for m in (model, ref_model) if m is not None
        )
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=o.lr,
            betas=o.betas,
            eps=o.eps,
            weight_decay=o.weight_decay,
        )
        self.scheduler = get_scheduler(
            o.lr_schedule, self.optimizer, num_warmup_steps=o.warmup_steps, num_training_steps=o.total_steps
        )
        self.global_step = 0

    @property
    def world_size(self) -> int:
        dist = torch.distributed
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _autocast(self):
        if self.precision == Precision.BF16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        positions = mb.position_ids.to(self.device)
        if mb.attention_mask is None and id(model) in self._per_sequence:
            extra = packed_kwargs(mb)
        else:
            extra = {
                "attention_mask": None if mb.attention_mask is None else mb.attention_mask.to(self.device)
            }
        with self._autocast():
            out = model(
                input_ids=mb.input_ids.to(self.device), position_ids=positions, use_cache=False, **extra
            )
        return out.logits

    def _scores(self, model: torch.nn.Module, mb: MicroBatch, entropy_grad: bool = False) -> TokenScores:
        targets = mb.targets.to(self.device)
        head, chunk = output_head(model), self.cfg.head_chunk_tokens
        if head is not None and chunk:  # other models: their whole logits
            with scoring_head(head, targets, mb.target_mask.to(self.device) > 0, chunk, entropy_grad):
                scored = self._forward(model, mb)
            return TokenScores(scored[..., 0], scored[..., 1])
        logits = self._forward(model, mb)
        if entropy_grad:
            return TokenScores(token_logprobs(logits, targets), entropy_from_logits(logits))
        return TokenScores(token_logprobs(logits, targets), token_entropy(logits))

    @torch.no_grad()
    def _logprobs_no_grad(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        return self._scores(model, mb).logprobs

    def step(self, items: Sequence[SeqItem]) -> StepMetrics:
        """One batch of whole rollouts → `ppo_epochs` optimizer steps. Returns metrics of the last. The step's
        activations and gradients come from malloc's heaps and go back to the system after it (memory.py)."""
        with memory.large_tensors_from_the_heap():
            return self._step(items)

    def _step(self, items: Sequence[SeqItem]) -> StepMetrics:
        cfg = self.cfg
        start = time.perf_counter()
        mbs = micro_batches(items, cfg, self.pad_id, self.share_prefixes)
        real_mbs = len(mbs)
        if self.world_size > 1:
            # FSDP all-gathers in every forward and reduce-scatters in every backward: all ranks must run the
            # same number of micro-batches, so short ranks add zero-weight ones (no effect on loss or gradient).
            filler = SeqItem([self.pad_id, self.pad_id], [0, 0], [0.0, 0.0], 0.0, 0.0)
            target = dist_mod.max_across_ranks(real_mbs, str(self.device))
            while len(mbs) < target:
                mbs.append(micro_batches([filler], cfg, self.pad_id)[0])
        self.model.train()
        old_lp = None
        if cfg.ppo_epochs > 1:
            old_lp = [self._logprobs_no_grad(self.model, mb) for mb in mbs]
        ref_model = self.ref_model if cfg.policy.kl_coef > 0 else None
        ref_lp = [self._logprobs_no_grad(ref_model, mb) for mb in mbs] if ref_model is not None else None
        sums: dict[str, float] = {}
        grad_norm = lr = 0.0
        for _epoch in range(cfg.ppo_epochs):
            sums = {
                k: 0.0
                for k in (
                    "loss",
                    "pg_loss",
                    "kl",
                    "entropy",
                    "clip",
                    "dual_clip",
                    "is_weight",
                    "approx_kl",
                    "tokens",
                )
            }
            for i, mb in enumerate(mbs):
                lp, entropy = self._scores(self.model, mb, entropy_grad=cfg.policy.entropy_coef > 0)
                mask = mb.target_mask.to(self.device)
                w = mb.weights.to(self.device)
                adv = mb.advantages.to(self.device)
                if cfg.objective is Objective.SFT:
                    tl = sft_token_losses(lp)
                else:
                    old = old_lp[i] if old_lp is not None else lp.detach()
                    tl = ppo_token_losses(lp, old, adv, cfg.policy, mb.behavior_logprobs.to(self.device))
                per_token = tl.pg
                ent_sum = float((entropy.detach() * (mask > 0)).sum())
                if cfg.policy.entropy_coef > 0:
                    per_token = per_token - cfg.policy.entropy_coef * entropy
                kl = torch.zeros_like(lp)
                if ref_lp is not None:
                    kl = low_var_kl(lp, ref_lp[i])
                    per_token = per_token + cfg.policy.kl_coef * kl
                loss = (per_token * mask * w).sum() * self.world_size
                loss.backward()
                n = float(mask.sum())
                sums["loss"] += float(loss.detach()) / self.world_size
                sums["pg_loss"] += float((tl.pg * mask * w).sum().detach())
                sums["kl"] += float((kl.detach() * mask).sum())
                sums["entropy"] += ent_sum
                sums["clip"] += float((tl.clipped.float() * mask).sum())
                sums["dual_clip"] += float((tl.dual_clipped.float() * mask).sum())
                sums["is_weight"] += float((tl.is_weight * mask).sum())
                sums["approx_kl"] += float((tl.approx_kl * mask).sum())
                sums["tokens"] += n
                del lp, entropy, loss, per_token
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)
            if isinstance(norm, DTensor):  # FSDP2: a replicated DTensor
                norm = norm.full_tensor()
            grad_norm = float(norm)
            sums = dist_mod.all_reduce_sum(sums, str(self.device))
            lr = float(self.scheduler.get_last_lr()[0])
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.global_step += 1
        elapsed = time.perf_counter() - start
        mbs = mbs[:real_mbs]
        counts = dist_mod.all_reduce_sum(
            {
                "sequences": len(items),
                "micro_batches": len(mbs),
                "tokens": sum(len(it) for it in items),
                "computed": sum(mb.real_tokens for mb in mbs),
                "pad": sum(mb.pad_tokens for mb in mbs),
            },
            str(self.device),
        )
        real, computed = int(counts["tokens"]), int(counts["computed"])
        ntok = max(sums["tokens"], 1.0)  # the last PPO epoch's
        return StepMetrics(
            loss=sums["loss"],
            pg_loss=sums["pg_loss"],
            grad_norm=grad_norm,
            lr=lr,
            entropy=sums["entropy"] / ntok,
            clip_frac=sums["clip"] / ntok,
            dual_clip_frac=sums["dual_clip"] / ntok,
            is_weight_mean=sums["is_weight"] / ntok,
            approx_kl=sums["approx_kl"] / ntok,
            kl_ref=sums["kl"] / ntok,
            trained_tokens=sums["tokens"],
            step=self.global_step,
            sequences=int(counts["sequences"]),
            micro_batches=int(counts["micro_batches"]),
            tokens=real,
            computed_tokens=computed,
            padding_fraction=counts["pad"] / (computed + counts["pad"]) if computed + counts["pad"] else 0.0,
            step_seconds=elapsed,
            tokens_per_s=real * cfg.ppo_epochs / max(elapsed, 1e-9),
        )

    def state_dict(self) -> dict:
        """Under FSDP a collective: every rank calls it; the full (unsharded, FQN-keyed) optimizer state
        is on rank 0."""
        if dist_mod.is_fsdp(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            optim = get_optimizer_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            return {
                "optimizer": optim,
                "optimizer_format": FULL_FQN_OPTIMIZER,
                "scheduler": self.scheduler.state_dict(),
                "global_step": self.global_step,
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
            }
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "global_step": self.global_step,
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("optimizer_format") == FULL_FQN_OPTIMIZER or dist_mod.is_fsdp(self.model):
            if state.get("optimizer_format") != FULL_FQN_OPTIMIZER:
                raise ValueError(
                    "this checkpoint was written by a single-process run; resume it with the same "
                    "world size (1), or start a new --out"
                )
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(
                self.model, self.optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True)
            )
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = int(state["global_step"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
