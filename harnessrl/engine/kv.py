"""A batched, left-padded KV cache whose rows can join and leave between decode steps.

transformers' DynamicLayer grows by `torch.cat` every step (an O(history) copy per layer per token). Here
each layer owns a preallocated buffer `[batch, kv_heads, capacity, head_dim]` that grows by doubling, so a
decode step writes one column in place and hands attention a view. All rows share the same write column;
a row shorter than the batch is left-padded and its padding is masked out by the attention mask, while its
position ids stay its own (so RoPE sees the same positions as when the row runs alone).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

_MIN_CAPACITY = 64


class BufferedLayer(DynamicLayer):
    """One layer's keys/values in a growable buffer; `keys`/`values` are views of the filled part."""

    def __init__(self) -> None:
        super().__init__()
        self.buf_k: torch.Tensor | None = None
        self.buf_v: torch.Tensor | None = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True

    def _buffers(self, needed: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers, grown (filled part kept) to at least `needed` columns."""
        if self.buf_k is not None and self.buf_v is not None and needed <= self.buf_k.shape[-2]:
            return self.buf_k, self.buf_v
        capacity = 0 if self.buf_k is None else self.buf_k.shape[-2]
        new_capacity = max(_MIN_CAPACITY, capacity * 2, needed)
        shape = (like.shape[0], like.shape[1], new_capacity, like.shape[3])
        buf_k = like.new_empty(shape)
        buf_v = like.new_empty(shape)
        if self.buf_k is not None and self.buf_v is not None and self.length:
            buf_k[:, :, : self.length] = self.buf_k[:, :, : self.length]
            buf_v[:, :, : self.length] = self.buf_v[:, :, : self.length]
        self.buf_k, self.buf_v = buf_k, buf_v
        return buf_k, buf_v

    def filled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the filled columns of the key and value buffers."""
        if self.buf_k is None or self.buf_v is None:
            raise RuntimeError("this KV cache layer holds nothing yet")
        return self.buf_k[:, :, : self.length], self.buf_v[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        buf_k, buf_v = self._buffers(self.length + new, key_states)
        buf_k[:, :, self.length : self.length + new] = key_states
        buf_v[:, :, self.length : self.length + new] = value_states
        self.length += new
        keys, values = self.filled()
        self.keys, self.values = keys, values
        return keys, values

    def get_seq_length(self) -> int:
        return self.length

    def set_filled(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 0) -> None:
        """Replaces the contents with `keys`/`values` (copied into a fresh buffer with `spare` free columns)."""
        self.buf_k = self.buf_v = None
        self.length = 0
        self.is_initialized = True
        self.device = keys.device
        buf_k, buf_v = self._buffers(keys.shape[-2] + spare, keys)
        buf_k[:, :, : keys.shape[-2]] = keys
        buf_v[:, :, : keys.shape[-2]] = values
        self.length = keys.shape[-2]
        self.keys, self.values = self.filled()


def new_cache(num_layers: int) -> Cache:
    return Cache(layers=[BufferedLayer() for _ in range(num_layers)])


def _layers(cache: Cache) -> list[BufferedLayer]:
    layers = [layer for layer in cache.layers if isinstance(layer, BufferedLayer)]
    if len(layers) != len(cache.layers):
        raise TypeError("expected a cache made by kv.new_cache (BufferedLayer layers)")
    return layers


def cache_length(cache: Cache) -> int:
    return _layers(cache)[0].length


def select_rows(cache: Cache, rows: list[int], drop_left: int = 0) -> None:
    """Keeps only `rows` (in that order), optionally dropping `drop_left` all-padding columns on the left."""
    index = torch.tensor(rows, dtype=torch.long)
    for layer in _layers(cache):
        keys, values = layer.filled()
        layer.set_filled(
            keys[:, :, drop_left:].index_select(0, index),
            values[:, :, drop_left:].index_select(0, index),
            spare=_MIN_CAPACITY,
        )


def append_rows(cache: Cache, other: Cache) -> int:
    """Appends `other`'s rows to `cache`, left-padding whichever is shorter. Returns how many pad columns
    were added to the front of the existing rows (their padding grows by that much)."""
    mine, theirs = _layers(cache), _layers(other)
    if mine[0].length == 0 or mine[0].buf_k is None:
        for layer, src in zip(mine, theirs, strict=True):
            layer.set_filled(*src.filled(), spare=_MIN_CAPACITY)
        return 0
    length = max(mine[0].length, theirs[0].length)
    grown = length - mine[0].length
    for layer, src in zip(mine, theirs, strict=True):
        (keys, values), (src_keys, src_values) = layer.filled(), src.filled()
        layer.set_filled(
            torch.cat([_left_pad(keys, length), _left_pad(src_keys, length)], dim=0),
            torch.cat([_left_pad(values, length), _left_pad(src_values, length)], dim=0),
            spare=_MIN_CAPACITY,
        )
    return grown


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - x.shape[-2]
    if pad == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], x.shape[1], pad, x.shape[3]), x], dim=-2)
