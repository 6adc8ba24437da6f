"""Turns one optimizer step's sequences into micro-batches: packed (no padding) or padded (baseline).

Packed micro-batch: one row, sequences concatenated, position ids restarting at 0 per sequence and no
attention mask — the trainer's models attend per sequence (segments.py; a model that cannot gets
transformers' block-diagonal causal mask, derived from the position ids), so packed logits equal
per-sequence logits. Targets are shifted *within* each sequence, so no token is ever
predicted across a sequence boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class SeqItem:
    """One training sequence with everything the loss needs, aligned to its tokens."""

    input_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]
    advantage: float
    weight: float  # aggregation weight from losses.sequence_weights (global over the step)
    rollout_id: str = ""

    def __len__(self) -> int:
        return len(self.input_ids)


SPANS = "harnessrl_spans"  # a forward call's keyword: [(start, end), ...] of a packed row's sequences (segments.py)


def packed_kwargs(position_ids: torch.Tensor) -> dict[str, Any]:
    """The extra arguments of a forward call on one packed row (`position_ids` [1, T], 0 where a sequence
    starts) for a model attending per sequence (segments.py): the spans, and a 4D mask so that transformers
    builds none."""
    starts = (position_ids[0] == 0).nonzero().flatten().tolist()
    ends = [*starts[1:], position_ids.shape[1]]
    no_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=position_ids.device)
    return {"attention_mask": no_mask, SPANS: list(zip(starts, ends, strict=True))}


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (rows, T)
    position_ids: torch.Tensor  # (rows, T)
    attention_mask: torch.Tensor | None  # (rows, T) for padded batches, None for packed
    targets: torch.Tensor  # (rows, T) token predicted at each position (0 where unused)
    target_mask: torch.Tensor  # (rows, T) float: 1 where the predicted token is trained
    behavior_logprobs: torch.Tensor  # (rows, T) for the predicted token
    advantages: torch.Tensor  # (rows, T)
    weights: torch.Tensor  # (rows, T) per-token aggregation weight
    real_tokens: int
    pad_tokens: int


def _shifted(item: SeqItem) -> tuple[list[int], list[float], list[float]]:
    targets = item.input_ids[1:] + [0]
    mask = [float(m) for m in item.loss_mask[1:]] + [0.0]
    beh = [float(b) for b in item.behavior_logprobs[1:]] + [0.0]
    return targets, mask, beh


def plan_packs(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of sequence indices into packs of ≤ max_tokens tokens.

    A sequence longer than max_tokens gets a pack of its own (it cannot be split without breaking
    attention). Deterministic: ties broken by index.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for p, free in enumerate(room):
            if lengths[i] <= free:
                packs[p].append(i)
                room[p] -= lengths[i]
                break
        else:
            packs.append([i])
            room.append(max_tokens - lengths[i])
    return [sorted(p) for p in packs]


def pack(items: Sequence[SeqItem], max_tokens: int) -> list[MicroBatch]:
    batches = []
    for pack_idx in plan_packs([len(it) for it in items], max_tokens):
        ids: list[int] = []
        pos: list[int] = []
        tgt: list[int] = []
        tmask: list[float] = []
        beh: list[float] = []
        adv: list[float] = []
        wts: list[float] = []
        for i in pack_idx:
            it = items[i]
            t, m, b = _shifted(it)
            ids += it.input_ids
            pos += list(range(len(it)))
            tgt += t
            tmask += m
            beh += b
            adv += [it.advantage] * len(it)
            wts += [it.weight] * len(it)
        batches.append(
            MicroBatch(
                input_ids=torch.tensor([ids]),
                position_ids=torch.tensor([pos]),
                attention_mask=None,
                targets=torch.tensor([tgt]),
                target_mask=torch.tensor([tmask]),
                behavior_logprobs=torch.tensor([beh]),
                advantages=torch.tensor([adv]),
                weights=torch.tensor([wts]),
                real_tokens=len(ids),
                pad_tokens=0,
            )
        )
    return batches


def pad(items: Sequence[SeqItem], seqs_per_batch: int, pad_id: int = 0) -> list[MicroBatch]:
    """The padded baseline: fixed number of sequences per micro-batch, right-padded to the longest."""
    batches = []
    for start in range(0, len(items), seqs_per_batch):
        chunk = items[start : start + seqs_per_batch]
        width = max(len(it) for it in chunk)
        rows: dict[str, list] = {k: [] for k in ("ids", "pos", "att", "tgt", "tmask", "beh", "adv", "w")}
        for it in chunk:
            n, fill = len(it), width - len(it)
            t, m, b = _shifted(it)
            rows["ids"].append(it.input_ids + [pad_id] * fill)
            rows["pos"].append(list(range(n)) + [0] * fill)
            rows["att"].append([1] * n + [0] * fill)
            rows["tgt"].append(t + [0] * fill)
            rows["tmask"].append(m + [0.0] * fill)
            rows["beh"].append(b + [0.0] * fill)
            rows["adv"].append([it.advantage] * width)
            rows["w"].append([it.weight] * width)
        real = sum(len(it) for it in chunk)
        batches.append(
            MicroBatch(
                input_ids=torch.tensor(rows["ids"]),
                position_ids=torch.tensor(rows["pos"]),
                attention_mask=torch.tensor(rows["att"]),
                targets=torch.tensor(rows["tgt"]),
                target_mask=torch.tensor(rows["tmask"]),
                behavior_logprobs=torch.tensor(rows["beh"]),
                advantages=torch.tensor(rows["adv"]),
                weights=torch.tensor(rows["w"]),
                real_tokens=real,
                pad_tokens=width * len(chunk) - real,
            )
        )
    return batches
