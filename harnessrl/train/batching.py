"""Turns one optimizer step's sequences into micro-batches: packed (no padding) or padded (baseline).

Packed micro-batch: one row, sequences concatenated, position ids restarting at 0 per sequence and no
attention mask — the trainer's models attend per sequence (segments.py; a model that cannot gets
transformers' block-diagonal causal mask, derived from the position ids), so packed logits equal
per-sequence logits. Targets are shifted *within* each sequence, so no token is ever
predicted across a sequence boundary.

Shared prefixes (`share_prefixes`, for models that attend per sequence): sequences that begin with the same
untrained tokens — a CLI agent's system prompt and tools, 1.4k tokens of Codex's first prompt under a
100-token reply; a group's task prompt — are packed as that prefix once followed by each sequence's rest,
whose positions go on from the prefix's and which attends to the prefix and to itself. The logits of every
trained token are those of its whole sequence, and the prefix's gradient is the sum of what each sequence
sends it: the same update for a fraction of the tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
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
PREFIX = "harnessrl_prefix"  # a forward call's keyword: the row's first tokens, context of every span
# fewer shared tokens than this are packed with each sequence (a span of their own would save next to nothing)
MIN_SHARED_PREFIX = 32


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
    # packed: each sequence's [start, end) in the row
    spans: list[tuple[int, int]] = field(default_factory=list)
    prefix: int = 0  # packed: the row's first `prefix` tokens are the shared start of every span's sequence


def packed_kwargs(mb: MicroBatch) -> dict[str, Any]:
    """The extra arguments of a forward call on one packed row for a model attending per sequence
    (segments.py): the spans, the shared prefix, and a 4D mask so that transformers builds none."""
    no_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=mb.input_ids.device)
    return {"attention_mask": no_mask, SPANS: mb.spans, PREFIX: mb.prefix}


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


def shareable(item: SeqItem) -> int:
    """How many of `item`'s first tokens a shared prefix may hold: up to, not including, the token before
    its first trained one (the prefix's last position predicts a token that must be shared and untrained)."""
    first_trained = next((t for t, m in enumerate(item.loss_mask) if t > 0 and m), len(item))
    return max(first_trained - 1, 0)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefix_families(items: Sequence[SeqItem]) -> list[tuple[int, list[int]]]:
    """The items as families of (shared prefix length, indices): the items sorted by their tokens, cut into runs
    whose shared untrained start stays >= MIN_SHARED_PREFIX, the cuts chosen to compute the fewest tokens (a
    run's prefix is computed once: it saves (members - 1) x prefix). A step of several groups keeps each group's
    whole prompt as its family's prefix rather than one family on the system prompt they all share; an item
    no run takes is alone, prefix 0."""
    order = sorted(range(len(items)), key=lambda i: items[i].input_ids)
    room = [shareable(items[i]) for i in order]
    common = [0] + [_common(items[a].input_ids, items[b].input_ids) for a, b in itertools.pairwise(order)]
    n = len(order)
    saved = [0] * (n + 1)  # saved[k]: the most tokens the first k sorted items can save
    runs = [(k - 1, 0) for k in range(n + 1)]  # runs[k]: (first, prefix) of the last run in that best cut
    for end in range(1, n + 1):
        saved[end] = saved[end - 1]
        shared = room[end - 1]
        for first in range(end - 2, -1, -1):  # the run order[first:end]
            shared = min(shared, room[first], common[first + 1] - 1)
            if shared < MIN_SHARED_PREFIX:
                break
            if saved[first] + (end - first - 1) * shared > saved[end]:
                saved[end] = saved[first] + (end - first - 1) * shared
                runs[end] = (first, shared)
    families: list[tuple[int, list[int]]] = []
    end = n
    while end > 0:
        first, shared = runs[end]
        families.append((shared, sorted(order[first:end])))
        end = first
    return families[::-1]


def pack(items: Sequence[SeqItem], max_tokens: int, share_prefixes: bool = False) -> list[MicroBatch]:
    """Packed micro-batches of ≤ max_tokens tokens (a longer sequence alone). `share_prefixes` (only for
    models that attend per sequence, segments.py): each family of sequences with a shared untrained start is
    packed as that start once plus each sequence's rest; the rests fill max_tokens less the prefix, at least
    half of max_tokens (a long prefix is counted once, as a long sequence's own tokens are)."""
    families = prefix_families(items) if share_prefixes else [(0, list(range(len(items))))]
    alone = [i for shared, family in families if not shared for i in family]  # packed together, whole
    batches = [
        _packed_row(items, [alone[m] for m in members], 0)
        for members in plan_packs([len(items[i]) for i in alone], max_tokens)
    ]
    for shared, family in families:
        if shared:
            room = max(max_tokens - shared, max_tokens // 2)
            for members in plan_packs([len(items[i]) - shared for i in family], room):
                batches.append(_packed_row(items, [family[m] for m in members], shared))
    return batches


def _packed_row(items: Sequence[SeqItem], members: list[int], prefix: int) -> MicroBatch:
    """One packed row of `members`, their first `prefix` tokens (the same in each) once at its start."""
    ids: list[int] = []
    pos: list[int] = []
    tgt: list[int] = []
    tmask: list[float] = []
    beh: list[float] = []
    adv: list[float] = []
    wts: list[float] = []
    if prefix:
        first = items[members[0]]
        t, _, _ = _shifted(first)
        ids += first.input_ids[:prefix]
        pos += list(range(prefix))
        tgt += t[:prefix]
        tmask += [0.0] * prefix
        beh += [0.0] * prefix
        adv += [0.0] * prefix
        wts += [0.0] * prefix
    spans = []
    for i in members:
        it = items[i]
        t, m, b = _shifted(it)
        spans.append((len(ids), len(ids) + len(it) - prefix))
        ids += it.input_ids[prefix:]
        pos += list(range(prefix, len(it)))
        tgt += t[prefix:]
        tmask += m[prefix:]
        beh += b[prefix:]
        adv += [it.advantage] * (len(it) - prefix)
        wts += [it.weight] * (len(it) - prefix)
    return MicroBatch(
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
        spans=spans,
        prefix=prefix,
    )


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
