"""Checkpoints: Hugging Face layout (safetensors + config + tokenizer), trainer state beside it, atomic.

    <root>/step-000004/model.safetensors, config.json, tokenizer*.json, ...   ← AutoModelForCausalLM-loadable
    <root>/step-000004/trainer_state.pt     optimizer, LR scheduler, RNG states, global step
    <root>/step-000004/trainer_state.json   step, config fingerprint, per-step metrics so far

A checkpoint directory appears only complete (harnessrl.io.atomic_output), so the latest step directory
is always safe to resume from. `s3://bucket/prefix` destinations are uploaded with `harnessrl.store`.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from harnessrl.io import atomic_output, atomic_write_json

STEP_DIR = re.compile(r"^step-(\d{6,})$")
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"


def save_model(
    model: PreTrainedModel,
    tokenizer: Any,
    dest: str | Path,
    extra_json: dict | None = None,
    state_dict: dict | None = None,
) -> Path:
    """Writes an HF model directory atomically; returns its path. `state_dict`: the gathered weights of a
    sharded (FSDP) model."""
    dest = Path(dest)
    with atomic_output(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if extra_json:
            for name, obj in extra_json.items():
                atomic_write_json(Path(tmp) / name, obj)
    return dest


def save_checkpoint(
    root: str | Path,
    step: int,
    model: PreTrainedModel,
    tokenizer: Any,
    trainer_state: dict,
    meta: dict,
    keep: int = 2,
    state_dict: dict | None = None,
) -> Path:
    root = Path(root)
    dest = root / f"step-{step:06d}"
    with atomic_output(dest) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, Path(tmp) / STATE_PT)
        atomic_write_json(Path(tmp) / STATE_JSON, {"step": step, **meta})
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def list_checkpoints(root: str | Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := STEP_DIR.match(p.name)) and (p / STATE_JSON).is_file() and (p / STATE_PT).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint_state(ckpt: Path) -> tuple[dict, dict]:
    """(trainer_state for Trainer.load_state_dict, meta json)."""
    state = torch.load(ckpt / STATE_PT, map_location="cpu", weights_only=False)
    meta = json.loads((ckpt / STATE_JSON).read_text())
    return state, meta


def upload_dir(local: str | Path, uri: str) -> None:
    """Uploads a directory to `s3://bucket/prefix` with harnessrl.store (endpoint/credentials from env)."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri}: only s3:// destinations are uploaded")
    from harnessrl.store import ObjectStore

    ObjectStore.from_env().upload_dir(local, uri)


def fetch_policy(uri: str, dest: str | Path) -> Path:
    """Downloads an `s3://` model directory to `dest` (resumable; appears whole) and returns it."""
    from harnessrl.store import ObjectStore

    ObjectStore.from_env().download_dir(uri, dest)
    return Path(dest)
