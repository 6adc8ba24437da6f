"""What the local engine did: per-request time split (queue, prefill, decode), forward-pass seconds, FLOPs and
(decode) bytes read (so achieved FLOP/s and bytes/s can be set against the machine's), and the prefix cache's
hit rate."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harnessrl.engine.prefix_cache import PrefixCacheStats


@dataclass(frozen=True)
class ModelShape:
    """What a forward pass costs: multiply-adds of the linear layers per token, of the output head per
    logits row, and of attention per (query, key) pair; and the bytes a decode step must read at least."""

    linear_params: int  # weights of the decoder layers' linear maps (not embeddings, not the head)
    head_params: int  # vocab x hidden (one logits row)
    attention_width: int  # layers x heads x head_dim (QK^T and AV each cost this many MACs per pair)
    element_bytes: int  # of one weight (and one key/value element)
    kv_bytes_per_token: int  # keys and values of one token, all layers

    @classmethod
    def of(cls, model: torch.nn.Module, config: Any) -> ModelShape:
        linear = 0
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
                linear += module.weight.numel()
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head = int(config.vocab_size) * int(config.hidden_size)
        element = next(model.parameters()).element_size()
        return cls(
            linear_params=linear,
            head_params=head,
            attention_width=int(config.num_hidden_layers) * heads * head_dim,
            element_bytes=element,
            kv_bytes_per_token=int(config.num_hidden_layers) * 2 * kv_heads * head_dim * element,
        )

    def flops(self, tokens: int, context_before: int, logits_rows: int) -> float:
        """FLOPs of `tokens` consecutive tokens of one sequence after `context_before` cached ones."""
        pairs = tokens * context_before + tokens * (tokens + 1) // 2  # causal: token i sees c + i + 1 keys
        return 2.0 * (
            tokens * self.linear_params + logits_rows * self.head_params + 2 * pairs * self.attention_width
        )

    @property
    def weight_bytes(self) -> int:
        """The linear maps' and the head's weights: a step reads every one of them."""
        return (self.linear_params + self.head_params) * self.element_bytes

    def decode_bytes(self, rows: int, window: int) -> float:
        """Bytes a decode step reads at least: every weight once, and each row's keys/values across the
        batch's `window` columns (what its attention reads, padding included)."""
        return float(self.weight_bytes + rows * window * self.kv_bytes_per_token)


@dataclass
class EngineCounters:
    requests: int = 0  # finished
    prompt_tokens: int = 0
    output_tokens: int = 0
    queue_s: float = 0.0  # summed over finished requests
    prefill_s: float = 0.0  # request admitted -> first token (wall, includes interleaved decode steps)
    decode_s: float = 0.0  # first token -> finished
    # A step is one forward pass. Steps that computed prompt tokens count as prefill, with the FLOPs of the
    # decode rows that rode along; steps of decode rows alone count as decode.
    prefill_forward_s: float = 0.0
    prefill_forward_tokens: int = 0  # prompt tokens computed (not served by the prefix cache)
    prefill_flops: float = 0.0
    decode_forward_s: float = 0.0
    decode_forward_steps: int = 0  # steps of decode rows alone
    decode_flops: float = 0.0
    decode_bytes: float = 0.0  # bytes decode-only steps had to read (ModelShape.decode_bytes)
    decode_steps: int = 0  # steps with decode rows (either kind)
    decode_row_tokens: int = 0  # decode rows summed over steps (rows x steps)
    decode_fed_tokens: int = 0  # tokens decode rows fed (pending tokens and speculative drafts)
    decode_emitted_tokens: int = 0  # tokens decode rows emitted (without each request's first token)
    speculative_drafted_tokens: int = 0  # prompt-lookup drafts fed
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def as_dict(self) -> dict[str, object]:
        n = max(self.requests, 1)
        out: dict[str, object] = {k: v for k, v in asdict(self).items() if k != "prefix_cache"}
        out.update(
            prefill_s_per_request=self.prefill_s / n,
            decode_s_per_request=self.decode_s / n,
            queue_s_per_request=self.queue_s / n,
            prefill_flops_per_s=self.prefill_flops / self.prefill_forward_s
            if self.prefill_forward_s
            else 0.0,
            decode_flops_per_s=self.decode_flops / self.decode_forward_s if self.decode_forward_s else 0.0,
            decode_bytes_per_s=self.decode_bytes / self.decode_forward_s if self.decode_forward_s else 0.0,
            decode_step_ms=1000 * self.decode_forward_s / self.decode_forward_steps
            if self.decode_forward_steps
            else 0.0,
            decode_tokens_per_row_step=self.decode_emitted_tokens / self.decode_row_tokens
            if self.decode_row_tokens
            else 0.0,
            prefix_cache_hit_rate=round(self.prefix_cache.hit_rate, 4),
            prefix_cache=self.prefix_cache.as_dict(),
        )
        return out
