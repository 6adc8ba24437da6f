"""One forward pass for a whole engine step: the decode rows and the prefill chunks packed into one sequence.

The linear layers (nearly all of the work and all of the weight reads) then run once per step over every new
token — decoding requests ride along with a prefill chunk instead of paying their own pass over the weights —
and only attention is done per part: the decode rows against the batch KV cache (`kv.py`, one shared write
column, left padding masked), each prefill chunk against its request's own cache (its cached prefix plus
the chunk, causal). `attend` writes each part's new keys/values into its cache itself; the model's own
cache stays unused (`llama.py` calls `attend` from its attention layers; transformers' models reach it through
the attention function `hf_forward.py` registers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn import functional

from harnessrl.engine.kv import Cache


@dataclass
class Chunk:
    cache: Cache  # the request's one-row cache: its prefix (and earlier chunks) so far
    start: int  # where the chunk's tokens start in the packed sequence
    tokens: int


@dataclass
class StepPlan:
    """The packed sequence is [decode tokens..., chunk 0 tokens..., chunk 1 tokens..., ...].

    A decode row feeds one token (its pending token), or with speculative decoding several (tokens not yet in
    its cache, then drafts): `columns` new columns are then written for every row, row r's j-th fed token at
    column j, and `slots` gives each packed decode token's place `r * columns + j` in that grid."""

    batch: Cache | None = None  # the decode batch's cache (None: no decode rows this step)
    rows: int = 0
    # [rows, 1, 1, window + 1] bool (one column each) or [rows, columns, window + columns] (several): the
    # row's own columns, and among the new ones those at or before the query's own (causal)
    row_mask: torch.Tensor | None = None
    chunks: list[Chunk] = field(default_factory=list)
    columns: int = 1
    slots: torch.Tensor | None = None  # [decode tokens] long, when columns > 1
    decode_tokens: int = 0  # packed decode tokens (rows when columns == 1)
    _grouped_mask: torch.Tensor | None = None  # row_mask expanded to the query heads of a kv head (cached)

    def grouped_mask(self, groups: int) -> torch.Tensor:
        """[rows, 1, columns * groups, window + columns]: query (j, g) of a kv head is row j's token."""
        if self._grouped_mask is None:
            assert self.row_mask is not None
            n, c, w = self.row_mask.shape
            self._grouped_mask = (
                self.row_mask[:, :, None, :].expand(n, c, groups, w).reshape(n, 1, c * groups, w)
            )
        return self._grouped_mask


# (ids [tokens], positions [tokens], keep [kept], plan) -> logits [kept, vocab]: one packed step of a model
StepForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, StepPlan], torch.Tensor]


def attend(
    plan: StepPlan,
    layer_idx: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of one layer for the packed step: `query` [1, heads, T, dim], `key`/`value`
    [1, kv_heads, T, dim] of the step's new tokens; returns [T, heads, dim]."""
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[-1]
    groups = heads // kv_heads
    out = query.new_empty(query.shape[2], heads, dim)
    if plan.rows and plan.columns > 1:
        _decode_columns(plan, layer_idx, query, key, value, out, scaling)
    elif plan.rows:
        assert plan.batch is not None and plan.row_mask is not None
        n = plan.rows
        new_k = key[0, :, :n].transpose(0, 1).unsqueeze(2)  # [rows, kv_heads, 1, dim]
        new_v = value[0, :, :n].transpose(0, 1).unsqueeze(2)
        keys, values = plan.batch.layers[layer_idx].update(new_k, new_v)
        q = query[0, :, :n].transpose(0, 1).reshape(n, kv_heads, groups, dim)  # heads grouped by kv head
        rows = functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=plan.row_mask, scale=scaling
        )
        out[:n] = rows.reshape(n, heads, dim)
    for chunk in plan.chunks:
        s, e = chunk.start, chunk.start + chunk.tokens
        keys, values = chunk.cache.layers[layer_idx].update(key[:, :, s:e], value[:, :, s:e])
        prefix = keys.shape[-2] - chunk.tokens
        causal = torch.ones(chunk.tokens, keys.shape[-2], dtype=torch.bool, device=query.device).tril_(prefix)
        attended = functional.scaled_dot_product_attention(
            query[:, :, s:e], keys, values, attn_mask=causal, scale=scaling, enable_gqa=groups > 1
        )
        out[s:e] = attended[0].transpose(0, 1)
    return out


def _decode_columns(
    plan: StepPlan,
    layer_idx: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    scaling: float | None,
) -> None:
    """Decode rows feeding several tokens each: scattered into a [rows, columns] grid (a row feeding fewer
    leaves zeros, whose columns no kept query sees and the scheduler drops), written to the batch cache as
    `columns` new columns, attended with the row's mask (window + causal among the new columns)."""
    assert plan.batch is not None and plan.slots is not None
    n, c, t, slots = plan.rows, plan.columns, plan.decode_tokens, plan.slots
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[-1]
    groups = heads // kv_heads

    def grid(x: torch.Tensor) -> torch.Tensor:  # [1, h, T, dim] -> [rows, h, columns, dim]
        h = x.shape[1]
        full = x.new_zeros(n * c, h, dim).index_copy_(0, slots, x[0, :, :t].transpose(0, 1))
        return full.view(n, c, h, dim).transpose(1, 2)

    keys, values = plan.batch.layers[layer_idx].update(grid(key), grid(value))
    # queries [rows, kv_heads, columns * groups, dim]: head kv * groups + g of column j at j * groups + g
    q = grid(query).reshape(n, kv_heads, groups, c, dim).transpose(2, 3).reshape(n, kv_heads, c * groups, dim)
    rows = functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=plan.grouped_mask(groups), scale=scaling
    )
    rows = rows.reshape(n, kv_heads, c, groups, dim).transpose(1, 2).reshape(n * c, heads, dim)
    out[:t] = rows.index_select(0, slots)
