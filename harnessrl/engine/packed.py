"""One forward pass for a whole engine step: the decode rows and the prefill chunks packed into one sequence.

The linear layers (nearly all of the work and all of the weight reads) then run once per step over every new
token — decoding requests ride along with a prefill chunk instead of paying their own pass over the weights —
and only attention is done per part: the decode rows against the batch KV cache (`kv.py`, one shared write
column, left padding masked), each prefill chunk against its request's own cache (its cached prefix plus
the chunk, causal). The model runs with `cache=None`; the registered attention function writes each part's
new keys/values into its cache itself. Without a step plan the function is plain SDPA attention, so the
model stays usable for ordinary calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
from torch.nn import functional
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import Cache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from harnessrl.engine import kv

ATTENTION = "harnessrl_packed"


@dataclass
class Chunk:
    cache: Cache  # the request's one-row cache: its prefix (and earlier chunks) so far
    start: int  # where the chunk's tokens start in the packed sequence
    tokens: int


@dataclass
class StepPlan:
    """The packed sequence is [decode rows..., chunk 0 tokens..., chunk 1 tokens..., ...]."""

    batch: Cache | None = None  # the decode batch's cache (None: no decode rows this step)
    rows: int = 0
    row_mask: torch.Tensor | None = None  # [rows, 1, 1, window + 1] bool: the row's own columns
    chunks: list[Chunk] = field(default_factory=list)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """`query` [1, heads, T, dim], `key`/`value` [1, kv_heads, T, dim] of the packed step's new tokens."""
    plan: StepPlan | None = kwargs.pop("harnessrl_step", None)
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    layer_idx = cast(int, module.layer_idx)
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[-1]
    groups = heads // kv_heads
    out = query.new_empty(query.shape[2], heads, dim)
    if plan.rows:
        assert plan.batch is not None and plan.row_mask is not None
        n = plan.rows
        new_k = key[0, :, :n].transpose(0, 1).unsqueeze(2)  # [rows, kv_heads, 1, dim]
        new_v = value[0, :, :n].transpose(0, 1).unsqueeze(2)
        keys, values = kv.layer(plan.batch, layer_idx).update(new_k, new_v)
        q = query[0, :, :n].transpose(0, 1).reshape(n, kv_heads, groups, dim)  # heads grouped by kv head
        rows = functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=plan.row_mask, scale=scaling
        )
        out[:n] = rows.reshape(n, heads, dim)
    for chunk in plan.chunks:
        s, e = chunk.start, chunk.start + chunk.tokens
        keys, values = kv.layer(chunk.cache, layer_idx).update(key[:, :, s:e], value[:, :, s:e])
        prefix = keys.shape[-2] - chunk.tokens
        causal = torch.ones(chunk.tokens, keys.shape[-2], dtype=torch.bool, device=query.device).tril_(prefix)
        attended = functional.scaled_dot_product_attention(
            query[:, :, s:e], keys, values, attn_mask=causal, scale=scaling, enable_gqa=groups > 1
        )
        out[s:e] = attended[0].transpose(0, 1)
    return out.unsqueeze(0), None


def register() -> str:
    """Registers the attention function (and, for plain calls, SDPA's mask) under `ATTENTION`."""
    AttentionInterface.register(ATTENTION, packed_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION
