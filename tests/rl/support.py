"""Helpers for the RL loop tests: a small real policy and prompt tasks it gets right some of the time."""

from __future__ import annotations

import json
from pathlib import Path

# The 4-layer cut of SmolLM2-135M (below) writes short words like these in about half its replies, so
# groups of 4 have reward variance and the loop trains. Its steps cost about a fifth of the full model's.
ANSWERS = ("and", "the", "of", "I")


def small_policy(dest: Path, layers: int = 4) -> Path:
    """SmolLM2-135M-Instruct cut to its first `layers` decoder layers (real weights, real tokenizer)."""
    from harnessrl.tinymodel import load_model, load_tokenizer

    if (dest / "config.json").is_file():
        return dest
    model = load_model()
    inner = model.model
    inner.layers = inner.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(dest)
    load_tokenizer().save_pretrained(dest)
    return dest


def write_prompt_tasks(path: Path, answers: tuple[str, ...] = ANSWERS) -> Path:
    rows = [
        {"task_id": f"say-{a}", "prompt": f"Reply with only the word '{a}' and nothing else.", "answer": a}
        for a in answers
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
