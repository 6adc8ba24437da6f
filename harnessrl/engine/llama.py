"""The local engine's own forward pass for Llama-family checkpoints (llama, mistral, qwen2), read straight
from a Hugging Face directory (`config.json` + safetensors).

Why not transformers' model: importing its modeling code costs ~2.6 s per process on this machine (it pulls
in torch.distributed.tensor, dynamo, scipy), more than a sixth of a whole estimate-difficulty step, and the
engine needs nothing of it but the arithmetic of one decoder stack. The arithmetic is the same as transformers'
(RMSNorm in float32, rotary embedding of the default type, SiLU MLP, grouped-query attention through the
packed step in `packed.py`); parameter names are transformers' so checkpoints, weight syncs and
`weights.check_state` work unchanged. Tests compare logits and greedy outputs with transformers' model.

Anything else (other architectures, scaled rotary embeddings, sliding windows) runs on transformers' model
(`hf_forward.py`); `read_config` says why a checkpoint is not served here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

import torch
from torch import nn
from torch.nn import functional

from harnessrl.engine import layout
from harnessrl.engine.layout import LayoutLinear
from harnessrl.engine.packed import StepPlan, attend
from harnessrl.engine.weights import check_state, read_tensors

Family = Literal["llama", "mistral", "qwen2"]
FAMILIES: tuple[str, ...] = get_args(Family)


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of `config.json` the forward pass needs (names as in transformers' configs)."""

    model_type: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool


def read_config(model_dir: Path) -> LlamaConfig | str:
    """The checkpoint's config, or why this forward pass does not serve it (transformers' model then does)."""
    raw: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    family = raw.get("model_type")
    if family not in FAMILIES:
        return f"model_type {family!r} is not one of {', '.join(FAMILIES)}"
    if raw.get("hidden_act", "silu") != "silu":
        return f"hidden_act {raw['hidden_act']!r} (only silu)"
    if int(raw.get("pretraining_tp", 1)) != 1:
        return "pretraining_tp != 1"
    rope = raw.get("rope_parameters") or {}  # transformers >= 5; older configs: rope_theta + rope_scaling
    rope_type = rope.get("rope_type") or (raw.get("rope_scaling") or {}).get("rope_type", "default")
    if rope_type != "default":
        return f"rotary embedding of type {rope_type!r} (only the default)"
    window = raw.get("sliding_window")
    if window is not None and (family != "qwen2" or raw.get("use_sliding_window")):
        return f"sliding-window attention (sliding_window={window})"
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    qwen = family == "qwen2"
    return LlamaConfig(
        model_type=cast(Family, family),
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
        max_position_embeddings=int(raw.get("max_position_embeddings", 1 << 30)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=qwen or bool(raw.get("attention_bias", False)),
        o_bias=not qwen and bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
    )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = functional.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        hidden, q, kv = config.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = LayoutLinear(hidden, q, bias=config.qkv_bias)
        self.k_proj = LayoutLinear(hidden, kv, bias=config.qkv_bias)
        self.v_proj = LayoutLinear(hidden, kv, bias=config.qkv_bias)
        self.o_proj = LayoutLinear(q, hidden, bias=config.o_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: StepPlan) -> torch.Tensor:
        tokens = x.shape[0]
        query = _rotate(self.q_proj(x).view(tokens, self.heads, self.head_dim), cos, sin)
        key = _rotate(self.k_proj(x).view(tokens, self.kv_heads, self.head_dim), cos, sin)
        value = self.v_proj(x).view(tokens, self.kv_heads, self.head_dim)
        out = attend(
            plan,
            self.layer_idx,
            query.transpose(0, 1)[None],
            key.transpose(0, 1)[None],
            value.transpose(0, 1)[None],
            self.head_dim**-0.5,
        )
        return self.o_proj(out.reshape(tokens, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` [tokens, heads, dim] (transformers' rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _inv_freq(config: LlamaConfig) -> torch.Tensor:
    dim = config.head_dim
    return 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = LayoutLinear(hidden, inner, bias=config.mlp_bias)
        self.up_proj = LayoutLinear(hidden, inner, bias=config.mlp_bias)
        self.down_proj = LayoutLinear(inner, hidden, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: StepPlan) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        # given a weight, Embedding skips its random init (on "meta" that would import torch._dynamo, ~1.3 s)
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForward(nn.Module):
    """A causal LM whose `step` runs one packed engine step (`packed.StepPlan`) and returns the kept logits.
    Built without weights (on the meta device, uninitialized): `load` assigns the checkpoint's."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        with torch.device("meta"):
            self.model = Decoder(config)
            self.lm_head = LayoutLinear(config.hidden_size, config.vocab_size, bias=False)
        self.inv_freq = _inv_freq(config)  # [head_dim / 2] float32 (`load` moves it to the model's device)

    def step(
        self, ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, plan: StepPlan
    ) -> torch.Tensor:
        """`ids`/`positions` [tokens] long, `keep` the token indices whose logits to return [len(keep), vocab]."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [tokens, 1, head_dim]
        x = self.model.embed_tokens(ids)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, plan)
        return self.lm_head(self.model.norm(x.index_select(0, keep)))


def load(model_dir: Path, config: LlamaConfig, dtype: torch.dtype, device: torch.device) -> LlamaForward:
    """The model with the checkpoint's weights in `dtype`; EngineError naming what does not match."""
    state = read_tensors(model_dir)
    model = LlamaForward(config)
    check_state(model, state, f"{model_dir} (a {config.model_type} model of its config.json)")
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    # copies in the process's own memory: the file's mapping closes once `state` goes, instead of staying
    # resident beside the weights a first sync writes (and the resident set counting it twice)
    model.load_state_dict({k: v.to(dtype, copy=True) for k, v in state.items()}, strict=False, assign=True)
    del state
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device).eval()
    model.inv_freq = model.inv_freq.to(device)
    if device.type == "cpu" and dtype == torch.float32:
        layout.apply(model, model.lm_head)  # each matrix as this CPU multiplies it fastest
    return model
