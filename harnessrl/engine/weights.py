"""Weight updates of the local engine: read a Hugging Face checkpoint directory, check that it matches the
served model, copy it into the model in place (between two decode steps, on the scheduler thread)."""

from __future__ import annotations

from pathlib import Path

import torch

from harnessrl.engine.base import EngineError


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors files, or EngineError naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        raise EngineError(
            f"{directory}: no *.safetensors files; expected a Hugging Face checkpoint "
            "directory written by save_pretrained"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except (SafetensorError, OSError) as e:
            raise EngineError(f"{file}: cannot read safetensors ({e})") from e
    return state


def check_state(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """EngineError naming `source` and the parameters unless `state` holds exactly the model's (shapes too)."""
    params = dict(model.named_parameters())
    config = getattr(model, "config", None)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(params) - set(state) - tied)
    unexpected = sorted(set(state) - set(params) - tied)
    if missing or unexpected:
        raise EngineError(
            f"{source}: checkpoint does not match the served model "
            f"({len(missing)} missing, e.g. {missing[:3]}; "
            f"{len(unexpected)} unexpected, e.g. {unexpected[:3]})"
        )
    for name, tensor in state.items():
        if name in params and tensor.shape != params[name].shape:
            raise EngineError(
                f"{source}: {name} has shape {tuple(tensor.shape)}, "
                f"the served model has {tuple(params[name].shape)}"
            )


def copy_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copies `state` into the model's parameters in place (which keeps tied embeddings tied)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in state.items():
            if name in params:
                params[name].copy_(tensor)
