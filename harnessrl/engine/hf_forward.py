"""transformers' model as the local engine's forward pass, for checkpoints `llama.py` does not serve (or with
`model_impl="transformers"`): the packed step reaches the model's attention layers through an attention
function registered with transformers (`attend` from `packed.py`); without a step plan it is plain SDPA, so
the model stays usable for ordinary calls."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from harnessrl.engine.base import DType, EngineError
from harnessrl.engine.packed import StepPlan, attend

ATTENTION = "harnessrl_packed"


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
    plan: StepPlan | None = kwargs.pop("harnessrl_step", None)
    if plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return attend(plan, cast(int, module.layer_idx), query, key, value, scaling).unsqueeze(0), None


class TransformersForward:
    """`step(ids, positions, keep, plan)` on a transformers causal LM (the signature of `LlamaForward.step`)."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = getattr(model, "config", None)
        if not isinstance(config, PretrainedConfig):
            raise EngineError("the model has no Hugging Face config")
        AttentionInterface.register(ATTENTION, packed_attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)
        config._attn_implementation = ATTENTION
        self.model = model
        device = next(model.parameters()).device
        self._no_mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)

    def step(
        self, ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, plan: StepPlan
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids[None],
            position_ids=positions[None],
            attention_mask=self._no_mask,  # 4D: transformers skips building a mask; each part has its own
            logits_to_keep=keep,
            use_cache=False,
            harnessrl_step=plan,
        )
        return out.logits[0]


def load(model_dir: Path, dtype: DType, device: torch.device) -> TransformersForward:
    from harnessrl.tinymodel import load_model

    model = load_model(model_dir, dtype=dtype)
    # transformers declares PreTrainedModel.to as torch's unbound Module.to (functools.wraps): call that
    return TransformersForward(torch.nn.Module.to(model, device).eval())
