"""Helpers for the RL loop tests: a small real policy and prompt tasks it gets right some of the time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harnessrl.engine.local import LocalEngine
    from harnessrl.rl.learner import Learner

# The 4-layer cut of SmolLM2-135M (below) writes short words like these in about half its replies, so
# groups of 4 have reward variance and the loop trains. Its steps cost about a fifth of the full model's.
ANSWERS = ("and", "the", "of", "I")


def small_policy(dest: Path, layers: int = 4) -> Path:
    """SmolLM2-135M-Instruct cut to its first `layers` decoder layers (real weights, real tokenizer)."""
    from harnessrl.tinymodel import cut_tiny_model

    return cut_tiny_model(dest, layers)


def write_prompt_tasks(path: Path, answers: tuple[str, ...] = ANSWERS) -> Path:
    rows = [
        {"task_id": f"say-{a}", "prompt": f"Reply with only the word '{a}' and nothing else.", "answer": a}
        for a in answers
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


PROMPT = "Write a long story about a dragon and a castle."


@dataclass
class SyncSetup:
    """A trainer model and the in-process engine its learner syncs into (weight sync tests)."""

    model: Any  # a transformers causal LM (load_model)
    engine: LocalEngine
    learner: Learner
    prompt: list[int]  # PROMPT in the chat template, as token ids

    def trainer_logprobs(self, token_ids: list[int]) -> list[float]:
        """What the trainer's model gives each of `token_ids` after the prompt."""
        import torch

        ids = torch.tensor([self.prompt + token_ids])
        with torch.no_grad():
            logits = self.model(ids).logits[0, len(self.prompt) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0].tolist()


def sync_setup(policy: Path, out: Path, config: dict[str, Any] | None = None) -> SyncSetup:
    """The learner of an `RLConfig.from_dict(config)` run (LoRA adapters added when it says so) and a LocalEngine
    of `policy`; close `.engine` after."""
    from harnessrl.engine.local import LocalEngine
    from harnessrl.rl.config import RLConfig
    from harnessrl.rl.learner import Learner
    from harnessrl.tinymodel import load_model, load_tokenizer
    from harnessrl.train.fingerprint import RunIdentity
    from harnessrl.train.lora import add_adapters
    from harnessrl.train.trainer import Trainer

    cfg = RLConfig.from_dict(config or {})
    model = load_model(policy)
    if cfg.train.lora.enabled:
        add_adapters(model, cfg.train.lora)
    tokenizer = load_tokenizer(policy)
    engine = LocalEngine(policy, max_batch=2, threads=1)
    learner = Learner(
        model, tokenizer, Trainer(model, cfg.train), cfg, out, RunIdentity({"x": "1"}, "p"), engine
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    return SyncSetup(model, engine, learner, tokenizer.encode(text, add_special_tokens=False))
