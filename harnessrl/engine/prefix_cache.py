"""Automatic prefix caching for the local engine: KV blocks keyed by the hash chain of their tokens.

A prompt is cut into blocks of `block_tokens` tokens; block i's key is hash(key of block i-1, its tokens),
so a key names the whole prefix up to the end of its block (as in vLLM's automatic prefix caching). A block
holds the keys/values of its tokens for every layer, `[layers, 2, kv_heads, block_tokens, head_dim]`; a
request whose prompt starts with cached blocks gets them concatenated (a copy) and prefills only the rest.
Blocks are shared by every request and session that reaches the same prefix (the system prompt and tool
definitions are computed once), evicted least recently used beyond a byte budget, and dropped all at once
when the weights change (`clear`: a new policy invalidates every key/value).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch


@dataclass
class PrefixCacheStats:
    lookups: int = 0
    lookup_tokens: int = 0  # prompt tokens of the requests looked up
    hit_tokens: int = 0  # of those, tokens whose keys/values came from the cache
    inserted_blocks: int = 0
    evicted_blocks: int = 0
    flushes: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "hit_rate": round(self.hit_rate, 4)}


def block_keys(tokens: list[int], block_tokens: int, blocks: int, parent: bytes = b"") -> list[bytes]:
    """Hash-chain keys of the first `blocks` full blocks of `tokens` (block i's key covers tokens[:(i+1)*B])."""
    keys = []
    for i in range(blocks):
        chunk = array("i", tokens[i * block_tokens : (i + 1) * block_tokens]).tobytes()
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        keys.append(parent)
    return keys


class PrefixCache:
    """Not thread-safe: the engine's scheduler thread is its only user."""

    def __init__(self, block_tokens: int, budget_bytes: int, bytes_per_token: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self.block_bytes = block_tokens * bytes_per_token
        self.capacity_blocks = max(0, budget_bytes // self.block_bytes)
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.epoch = 0  # bumped at every flush: KV computed before it must not be inserted after it
        self.stats = PrefixCacheStats()

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def match(self, tokens: list[int]) -> tuple[int, torch.Tensor | None]:
        """The longest cached block-aligned prefix of `tokens` that leaves at least one token to compute (the
        next-token logits need a forward pass): (its length, its keys/values `[layers, 2, heads, n, dim]`)."""
        self.stats.lookups += 1
        self.stats.lookup_tokens += len(tokens)
        if not self.enabled:
            return 0, None
        found: list[torch.Tensor] = []
        keys = block_keys(tokens, self.block_tokens, (len(tokens) - 1) // self.block_tokens)
        for key in keys:
            block = self._blocks.get(key)
            if block is None:
                break
            found.append(block)
        for key in reversed(
            keys[: len(found)]
        ):  # the tail first: a parent stays more recent than its children
            self._blocks.move_to_end(key)
        if not found:
            return 0, None
        tokens_hit = len(found) * self.block_tokens
        self.stats.hit_tokens += tokens_hit
        return tokens_hit, torch.cat(found, dim=3)

    def first_missing(self, tokens: list[int]) -> bytes | None:
        """The key of the first block of `tokens` that `match` would not find (None: all there); no side
        effects."""
        for key in block_keys(tokens, self.block_tokens, (len(tokens) - 1) // self.block_tokens):
            if key not in self._blocks:
                return key
        return None

    def insert(self, tokens: list[int], first_block: int, kv: torch.Tensor) -> None:
        """Stores the full blocks of `tokens` from block `first_block` on; `kv` `[layers, 2, heads, n, dim]`
        holds the keys/values of tokens[first_block * B : first_block * B + n]. Blocks already cached are kept
        (and refreshed)."""
        if not self.enabled:
            return
        blocks = len(tokens) // self.block_tokens
        keys = block_keys(tokens, self.block_tokens, blocks)
        for i in range(blocks - 1, first_block - 1, -1):  # the tail first, as in `match`
            lo = (i - first_block) * self.block_tokens
            if lo + self.block_tokens > kv.shape[3]:
                continue
            key = keys[i]
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            self._blocks[key] = kv[:, :, :, lo : lo + self.block_tokens].clone()
            self.stats.inserted_blocks += 1
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.stats.evicted_blocks += 1

    def clear(self) -> None:
        """Drops every block (the weights changed)."""
        self._blocks.clear()
        self.epoch += 1
        self.stats.flushes += 1
