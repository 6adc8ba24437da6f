"""Checkpoints: Hugging Face layout (safetensors + config + tokenizer), trainer state beside it, atomic.

    <root>/step-000004/model.safetensors, config.json, tokenizer*.json, ...   ← AutoModelForCausalLM-loadable
    <root>/step-000004/trainer_state.pt     optimizer, LR scheduler, RNG states, global step
    <root>/step-000004/trainer_state.json   step, the run's fingerprint and its parts, per-step metrics so far

A directory is written under a temporary name `.<name>.<fingerprint>.<random>` beside its destination and
renamed into place when complete, so the newest step directory is always safe to resume from, and a kill -9
leaves only temporary directories that carry the fingerprint of the run that left them: a rerun of that run
removes them, other runs' leftovers are not touched. `<root>` holds the checkpoints of one run: rotation
(`keep`) counts only the current run's checkpoints, and `check_checkpoints` refuses a root holding another
run's.
`s3://bucket/prefix` destinations are uploaded with `harnessrl.store`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.io import atomic_write_json
from harnessrl.train.fingerprint import RunIdentity

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d{6,})$")
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"


@contextlib.contextmanager
def _atomic_dir(dest: Path, fingerprint: str) -> Iterator[Path]:
    """Yields an empty directory inside `.<name>.<fingerprint>.<random>/` beside `dest`; renames it to `dest`
    on success (replacing an existing `dest` whole)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}.{fingerprint}.", dir=dest.parent))
    try:
        tmp = scratch / "new"
        tmp.mkdir()  # not the mkdtemp directory itself: that one is private (0700)
        yield tmp
        if dest.is_dir() and not dest.is_symlink():
            os.replace(dest, scratch / "old")
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def sweep_partials(parent: Path, name: str, fingerprint: str) -> list[Path]:
    """Removes the temporary directories a killed run with this fingerprint left for `parent/name` (`name` a
    regex for the destination's name); returns them."""
    own = re.compile(rf"^\.{name}\.{re.escape(fingerprint)}\.")
    found = [p for p in parent.iterdir() if own.match(p.name) and p.is_dir()] if parent.is_dir() else []
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    if found:
        logger.warning(
            "removed %d partial director(ies) an earlier kill of this run left in %s", len(found), parent
        )
    return found


def save_model(
    model: PreTrainedModel,
    tokenizer: Any,
    dest: str | Path,
    fingerprint: str,
    extra_json: dict | None = None,
    state_dict: dict | None = None,
    write_extra: Callable[[Path], object] | None = None,
) -> Path:
    """Writes an HF model directory atomically; returns its path. `state_dict`: the gathered weights of a
    sharded (FSDP) model; `write_extra` writes more into the directory before it appears (a LoRA adapter)."""
    dest = Path(dest)
    with _atomic_dir(dest, fingerprint) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, obj in (extra_json or {}).items():
            atomic_write_json(tmp / name, obj)
        if write_extra is not None:
            write_extra(tmp)
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
    write_weights: Callable[[Path], object] | None = None,
) -> Path:
    """Writes `<root>/step-NNNNNN`; `meta` must hold the run's "fingerprint". With `keep` > 0 only the newest
    `keep` checkpoints *of this run* stay. `write_weights` writes the weights instead of the model's
    `save_pretrained` (a LoRA run: its adapter)."""
    root = Path(root)
    fingerprint = meta["fingerprint"]
    dest = root / f"step-{step:06d}"
    with _atomic_dir(dest, fingerprint) as tmp:
        if write_weights is not None:
            write_weights(tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / STATE_PT)
        atomic_write_json(tmp / STATE_JSON, {"step": step, **meta})
    if keep > 0:
        for old in list_checkpoints(root, fingerprint)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return dest


def read_meta(ckpt: Path) -> dict | None:
    """A complete checkpoint's trainer_state.json, or None (not a checkpoint, or removed meanwhile)."""
    try:
        return json.loads((ckpt / STATE_JSON).read_text())
    except FileNotFoundError:
        return None


def list_checkpoints(root: str | Path, fingerprint: str | None = None) -> list[Path]:
    """Complete checkpoints in step order; with `fingerprint`, only those that run wrote."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if not m or not (p / STATE_PT).is_file() or (meta := read_meta(p)) is None:
            continue
        if fingerprint is None or meta.get("fingerprint") == fingerprint:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def check_checkpoints(root: Path, identity: RunIdentity, *, resume: bool) -> Path | None:
    """Read-only. Refuses a `root` holding another run's checkpoints; returns the checkpoint to resume from
    (the newest of this run), or None to start at step 0."""
    others = [p for p in list_checkpoints(root) if (read_meta(p) or {}).get("fingerprint") != identity.digest]
    if others:
        newest = others[-1]
        why = identity.differences(read_meta(newest) or {})
        fix = (
            "--resume continues only the run that wrote them: rerun with its inputs and settings, or start "
            f"this run in a new --out (or delete {root})"
            if resume
            else f"use a new --out, or delete {root} (or move it aside) to start this run there"
        )
        raise ValueError(f"{root} holds checkpoints of another run ({newest.name}: {why}); {fix}")
    own = list_checkpoints(root, identity.digest)
    return own[-1] if resume and own else None


def clean_checkpoints(root: Path, identity: RunIdentity, *, resume: bool) -> None:
    """Rank 0, after check_checkpoints: removes this run's partial checkpoints; without `resume` also its
    complete ones (an earlier attempt at the same computation), so the fresh run's rotation starts clean."""
    sweep_partials(root, r"step-\d{6,}", identity.digest)
    if resume:
        return
    stale = list_checkpoints(root, identity.digest)
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    if stale:
        logger.warning(
            "starting over without --resume: removed %d checkpoint(s) of an earlier run of the same inputs "
            "and settings from %s (newest: %s)",
            len(stale),
            root,
            stale[-1].name,
        )


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


@dataclass(frozen=True)
class RunStart:
    policy_dir: Path  # the starting weights as a local Hugging Face directory
    identity: RunIdentity
    checkpoint: Path | None  # this run's newest checkpoint to resume from; None: start at step 0


def resolve_policy(
    policy: str | Path | None, out: Path, *, main: bool = True, barrier: Callable[[], None] = lambda: None
) -> Path:
    """The starting weights as a local Hugging Face directory: `policy` itself, an `s3://` URI fetched into
    OUT/policy_in (by the main rank), or the tiny model when None; a LoRA adapter directory (PEFT's layout) is
    merged onto its base into OUT/policy_merged. FileNotFoundError unless it holds a config.json."""
    from harnessrl.tinymodel import tiny_model_dir
    from harnessrl.train.lora import is_adapter_dir, merge_adapter

    policy_dir = Path(policy) if policy else tiny_model_dir()
    if str(policy).startswith("s3://"):
        if main:
            fetch_policy(str(policy), out / "policy_in")
        barrier()
        policy_dir = out / "policy_in"
    if is_adapter_dir(policy_dir) and not (policy_dir / "config.json").is_file():
        if main:
            merge_adapter(policy_dir, out / "policy_merged")
        barrier()
        policy_dir = out / "policy_merged"
    if not (policy_dir / "config.json").is_file():
        raise FileNotFoundError(f"{policy_dir}: not a Hugging Face model directory (no config.json)")
    return policy_dir


def start_run(
    policy: str | Path | None,
    out: Path,
    model_out: Path,
    identity_of: Callable[[Path], RunIdentity],
    *,
    resume: bool,
    main: bool = True,
    barrier: Callable[[], None] = lambda: None,
) -> RunStart:
    """The start of a resumable run, the same for the train stage and the RL loop: the policy resolved
    (`resolve_policy`), the run's identity (`identity_of(policy_dir)`), the checkpoint to resume from in OUT/checkpoints (another
    run's are refused), then — by the main rank — this run's partial checkpoints and partial `model_out`
    directories swept (and without `resume` its complete checkpoints). When every rank of a process group
    calls it (the train stage), `barrier` is the group's and every rank gets the same answer; the RL loop's
    rank 0 calls it alone (the other ranks wait for its commands, harnessrl.rl.ranks)."""
    policy_dir = resolve_policy(policy, out, main=main, barrier=barrier)
    identity = identity_of(policy_dir)
    root = out / "checkpoints"
    checkpoint = check_checkpoints(root, identity, resume=resume)  # every rank, before the main one cleans
    barrier()
    if main:
        clean_checkpoints(root, identity, resume=resume)
        sweep_partials(model_out.parent, re.escape(model_out.name), identity.digest)
    barrier()
    return RunStart(policy_dir, identity, checkpoint)
