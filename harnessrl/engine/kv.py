"""A batched, left-padded KV cache whose rows join and leave between decode steps without moving the others.

A cache that grows by `torch.cat` every step (as transformers' DynamicLayer) copies O(history) per layer per
token. Here each layer owns one zero-initialized buffer `[row capacity, kv_heads, column capacity,
head_dim]`; the live part is the window `[:rows, :, start:end]`, which attention gets as a view. All rows
share the write column `end`, so a decode step writes one column in place. A row holding fewer tokens than
the window is left-padded (its padding is masked by the caller's attention mask; its position ids stay its
own, so RoPE sees the positions it would see alone). Joining writes only the new row (a longer row moves `start` left into spare room);
leaving moves only the last row into the hole; dropping shared padding moves `start` right. Columns left of
`start` hold stale but finite keys/values (buffers start at zero), so a masked column contributes exactly 0.

The same layer holds one request's prefill: its prefix from the prefix cache, then each chunk appended.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MIN_COLUMNS = 64


class BufferedLayer:
    """One layer's keys/values in a buffer; `window()` gives views of the live part."""

    def __init__(self) -> None:
        self.buf_k: torch.Tensor | None = None
        self.buf_v: torch.Tensor | None = None
        self.rows = 0
        self.start = 0
        self.end = 0

    @property
    def width(self) -> int:
        return self.end - self.start

    def reserve(self, like: torch.Tensor, rows: int, width: int, right: int) -> None:
        """Room for `rows` rows, a window `width` columns wide ending at `end`, and `right` free columns after
        it. Reallocates (zeros) only when the buffer is too small, then with a quarter more room on the side
        that grew (doubled rows), so growth costs amortized O(1) copies."""
        buf = self.buf_k
        if (
            buf is not None
            and rows <= buf.shape[0]
            and width <= self.end
            and self.end + right <= buf.shape[-2]
        ):
            return
        cap_rows = rows
        if buf is not None:
            cap_rows = buf.shape[0] if rows <= buf.shape[0] else max(rows, 2 * buf.shape[0])
        grows_left = width > self.width
        new_end = width + (width // 4 if grows_left and buf is not None else 0)
        shape = (cap_rows, like.shape[1], new_end + max(right, _MIN_COLUMNS, width // 4), like.shape[3])
        buf_k, buf_v = like.new_zeros(shape), like.new_zeros(shape)
        if self.buf_k is not None and self.buf_v is not None and self.rows and self.width:
            old, new = slice(self.start, self.end), slice(new_end - self.width, new_end)
            buf_k[: self.rows, :, new] = self.buf_k[: self.rows, :, old]
            buf_v[: self.rows, :, new] = self.buf_v[: self.rows, :, old]
        self.buf_k, self.buf_v = buf_k, buf_v
        self.start, self.end = new_end - self.width, new_end

    def window(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.buf_k is None or self.buf_v is None:
            raise RuntimeError("this KV cache layer holds nothing yet")
        return (
            self.buf_k[: self.rows, :, self.start : self.end],
            self.buf_v[: self.rows, :, self.start : self.end],
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends `[rows, heads, new, dim]` keys/values at the write column; returns the live window."""
        if self.rows == 0:
            self.rows = key_states.shape[0]
        new = key_states.shape[-2]
        self.reserve(key_states, self.rows, self.width, new)
        assert self.buf_k is not None and self.buf_v is not None
        self.buf_k[: self.rows, :, self.end : self.end + new] = key_states
        self.buf_v[: self.rows, :, self.end : self.end + new] = value_states
        self.end += new
        return self.window()

    def fill(self, keys: torch.Tensor, values: torch.Tensor, spare: int) -> None:
        """Starts a one-row layer holding `keys`/`values` `[1, heads, n, dim]` with `spare` free columns."""
        self.buf_k = self.buf_v = None
        self.rows, self.start, self.end = 1, 0, 0
        self.reserve(keys, 1, 0, keys.shape[-2] + spare)
        assert self.buf_k is not None and self.buf_v is not None
        n = keys.shape[-2]
        self.buf_k[:1, :, :n] = keys
        self.buf_v[:1, :, :n] = values
        self.end = n

    def add_row(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Appends a row `[1, heads, n, dim]`, right-aligned at the shared write column."""
        n = keys.shape[-2]
        self.reserve(keys, self.rows + 1, max(self.width, n), _MIN_COLUMNS)
        assert self.buf_k is not None and self.buf_v is not None
        self.start = min(self.start, self.end - n)
        self.buf_k[self.rows, :, self.end - n : self.end] = keys[0]
        self.buf_v[self.rows, :, self.end - n : self.end] = values[0]
        self.rows += 1

    def move_row(self, src: int, dst: int) -> None:
        assert self.buf_k is not None and self.buf_v is not None
        self.buf_k[dst, :, self.start : self.end] = self.buf_k[src, :, self.start : self.end]
        self.buf_v[dst, :, self.start : self.end] = self.buf_v[src, :, self.start : self.end]


@dataclass
class Cache:
    """Every layer's keys/values of one request (a prefill) or of the decode batch."""

    layers: list[BufferedLayer]


def new_cache(num_layers: int) -> Cache:
    return Cache([BufferedLayer() for _ in range(num_layers)])


def cache_length(cache: Cache) -> int:
    """Columns of the live window (the longest row's tokens plus any padding not yet dropped)."""
    return cache.layers[0].width


def rows(cache: Cache) -> int:
    return cache.layers[0].rows


def fill(cache: Cache, kv: torch.Tensor, spare: int) -> None:
    """Makes `cache` a one-row cache holding `kv` `[layers, 2, heads, n, dim]` with `spare` free columns."""
    for i, layer in enumerate(cache.layers):
        layer.fill(kv[i, 0].unsqueeze(0), kv[i, 1].unsqueeze(0), spare)


def add_row(cache: Cache, single: Cache) -> None:
    """Appends the one row of `single` to `cache`; the existing rows do not move."""
    for layer, src in zip(cache.layers, single.layers, strict=True):
        keys, values = src.window()
        layer.add_row(keys, values)


def remove_rows(cache: Cache, drop: set[int]) -> list[int]:
    """Removes rows `drop`, moving the last live rows into the holes (one row copy per hole). Returns the old
    index of each remaining row, in its new order."""
    layers = cache.layers
    order = [i for i in range(layers[0].rows) if i not in drop]
    count = len(order)
    holes = sorted(i for i in drop if i < count)
    movers = [i for i in order if i >= count]
    position = {old: old for old in order}
    for hole, mover in zip(holes, movers, strict=True):
        for layer in layers:
            layer.move_row(mover, hole)
        position[mover] = hole
    new_order = sorted(order, key=lambda old: position[old])
    for layer in layers:
        layer.rows = count
    return new_order


def drop_left(cache: Cache, columns: int) -> None:
    """Drops `columns` columns of padding shared by every row (no copy: the window starts later)."""
    for layer in cache.layers:
        layer.start += columns


def row_kv_at(cache: Cache, row: int, columns: torch.Tensor) -> torch.Tensor:
    """A copy of one row's keys/values at window `columns`: `[layers, 2, heads, len(columns), dim]`."""
    parts = []
    for layer in cache.layers:
        keys, values = layer.window()
        at = columns.to(keys.device)
        parts.append(torch.stack((keys[row].index_select(1, at), values[row].index_select(1, at))))
    return torch.stack(parts)


def compact(cache: Cache, owned: torch.Tensor) -> None:
    """Moves each row's own columns (`owned` `[rows, window]` bool) right-aligned to the write column, in order,
    dropping the holes between them; the window then starts at the longest row."""
    counts = owned.sum(dim=1).tolist()
    for layer in cache.layers:
        assert layer.buf_k is not None and layer.buf_v is not None
        keys, values = layer.window()
        for row, n in enumerate(counts):
            at = torch.nonzero(owned[row]).flatten().to(keys.device)
            layer.buf_k[row, :, layer.end - n : layer.end] = keys[row].index_select(1, at)
            layer.buf_v[row, :, layer.end - n : layer.end] = values[row].index_select(1, at)
        layer.start = layer.end - max(counts, default=0)


def drop_right(cache: Cache, columns: int) -> None:
    """Forgets the last `columns` columns of every row (speculative drafts the model did not keep): the next
    write overwrites them."""
    for layer in cache.layers:
        layer.end -= columns


def row_kv(cache: Cache, row: int, lo: int, hi: int) -> torch.Tensor:
    """A copy of one row's keys/values for window columns [lo, hi): `[layers, 2, heads, hi - lo, dim]`."""
    parts = []
    for layer in cache.layers:
        keys, values = layer.window()
        parts.append(torch.stack((keys[row, :, lo:hi], values[row, :, lo:hi])))
    return torch.stack(parts)
