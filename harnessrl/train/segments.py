"""Attention per sequence for packed micro-batches.

A packed micro-batch is one row holding several sequences, each restarting its positions at 0. transformers'
SDPA path would attend over the whole row under a block-diagonal mask: (row length)² work per head and layer,
nearly all of it masked out — on a CPU it made a 3,200-token micro-batch of 32 sequences ~1.9× slower to
train than the same sequences as a batch. Here each sequence attends to itself alone (causal SDPA on its own
span), the same result without the masked work; padded batches keep transformers' SDPA with their mask.
A row that starts with a prefix its sequences share (batching.py, `share_prefixes`) attends causally over the
prefix, then each span over the prefix and, causally, itself.

`use_segments(model)` registers the attention function with transformers and selects it on the model;
`batching.packed_kwargs(micro_batch)` are the extra arguments of a forward call on a packed row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from harnessrl.train.batching import PREFIX, SPANS

ATTENTION = "harnessrl_segments"


def segment_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    spans: list[tuple[int, int]] | None = kwargs.pop(SPANS, None)
    prefix: int = kwargs.pop(PREFIX, 0)
    if spans is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    gqa = query.shape[1] != key.shape[1]

    def attend(q: tuple[int, int], kv: list[tuple[int, int]], mask: torch.Tensor | None) -> torch.Tensor:
        if len(kv) == 1:  # a view: no copy on the rows that share nothing (most of them)
            keys, values = key[:, :, kv[0][0] : kv[0][1]], value[:, :, kv[0][0] : kv[0][1]]
        else:
            keys, values = (torch.cat([t[:, :, s:e] for s, e in kv], dim=2) for t in (key, value))
        return functional.scaled_dot_product_attention(
            query[:, :, q[0] : q[1]],
            keys,
            values,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=mask is None,
            scale=scaling,
            enable_gqa=gqa,
        )

    if not prefix:
        parts = [attend((s, e), [(s, e)], None) for s, e in spans]
    else:  # the prefix causally, then each span over the prefix and, causally, itself
        parts = [attend((0, prefix), [(0, prefix)], None)]
        for s, e in spans:
            mask = torch.ones(e - s, prefix + e - s, dtype=torch.bool, device=query.device)
            mask[:, prefix:] = mask[:, prefix:].tril()
            parts.append(attend((s, e), [(0, prefix), (s, e)], mask))
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def use_segments(model: torch.nn.Module) -> bool:
    """Selects per-sequence attention on a transformers model that runs SDPA or eager attention (or already
    this one); False, the model unchanged, for any other model or attention implementation."""
    if not isinstance(model, PreTrainedModel):
        return False
    if model.config._attn_implementation in ("sdpa", "eager"):
        AttentionInterface.register(ATTENTION, segment_attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        model.config._attn_implementation = ATTENTION
    return model.config._attn_implementation == ATTENTION
