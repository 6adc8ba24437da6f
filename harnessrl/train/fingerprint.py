"""What a checkpoint was computed from, so `--resume` only continues the same computation.

A run's identity has five parts, each a content hash:
- settings: the TrainConfig, less what does not change the result (max_steps, save_every, keep_checkpoints,
  device; the optimizer step's memory settings, trainer.MEMORY_SETTINGS_AS_HASHED);
- policy: every file of the input model directory (config, weights, tokenizer), so another policy — or the
  same path with new weights — is a different run (SmolLM2-135M: 0.5 GB, about 1 s to hash here);
- samples: per rollout, its samples' ids, token ids, loss masks and behavior log-probs;
- rewards: per rollout, its reward, status and whether it trains, plus the exclusion counts;
- plan: the optimizer steps (group ids) and advantages, which also depend on the pass-rate history.

The digest of the parts names the run; the parts say what differs when a checkpoint is refused.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harnessrl.train.data import Prepared
    from harnessrl.train.plan import Plan
    from harnessrl.train.round import TrainConfig

# settings that change neither the plan nor any step's result
UNHASHED_SETTINGS = ("max_steps", "save_every", "keep_checkpoints", "device")


@dataclass(frozen=True)
class RunIdentity:
    parts: dict[str, str]
    policy: str  # the policy as given (path or s3:// URI), for messages

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.parts, sort_keys=True).encode()).hexdigest()[:16]

    def to_meta(self) -> dict:
        return {"fingerprint": self.digest, "fingerprint_parts": self.parts, "policy_in": self.policy}

    def differences(self, meta: dict) -> str:
        """What differs between this run and the run that wrote `meta` (a checkpoint's trainer_state.json). A
        part named `whole.field` (the RL loop's `specs.reward`, ...) is said as its whole with the fields
        that differ: "the specs differ (limits, reward)"."""
        theirs = meta.get("fingerprint_parts")
        if not isinstance(theirs, dict):
            return "it was written by an older version that did not record its inputs"
        changed: dict[str, list[str]] = {}
        for name in sorted(set(self.parts) | set(theirs)):
            if self.parts.get(name) != theirs.get(name):
                whole, _, part = name.partition(".")
                changed.setdefault(whole, []).extend([part] if part else [])
        diff = []
        for name, parts in changed.items():
            if name == "policy":
                diff.append(f"the policy differs (checkpoint: {meta.get('policy_in')}, now: {self.policy})")
                continue
            said = f"the {name} differ" if name.endswith("s") else f"the {name} differs"
            diff.append(f"{said} ({', '.join(parts)})" if parts else said)
        return ", ".join(diff) or "its fingerprint differs"


def run_identity(
    prepared: Prepared, plan: Plan, cfg: TrainConfig, policy_dir: Path, policy: str
) -> RunIdentity:
    from harnessrl.train.trainer import TrainerConfig

    settings = {k: v for k, v in cfg.to_dict().items() if k not in UNHASHED_SETTINGS}
    settings["train"] = TrainerConfig.hashed(settings["train"])
    parts = {
        "settings": _digest(json.dumps(settings, sort_keys=True, default=str).encode()),
        "policy": policy_digest(policy_dir),
        "samples": _samples_digest(prepared),
        "rewards": _rewards_digest(prepared),
        "plan": _digest(json.dumps([plan.steps, sorted(plan.advantages.items())]).encode()),
    }
    return RunIdentity(parts, policy)


def policy_digest(policy_dir: Path) -> str:
    """Content hash of every (non-hidden) file of a model directory, with its relative path."""
    h = hashlib.sha256()
    files = sorted(
        p
        for p in policy_dir.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(policy_dir).parts)
    )
    for p in files:
        h.update(p.relative_to(policy_dir).as_posix().encode() + b"\0")
        with open(p, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()[:16]


def _samples_digest(prepared: Prepared) -> str:
    h = hashlib.sha256()
    for r in sorted(prepared.rollouts, key=lambda r: r.rollout_id):
        h.update(f"{r.rollout_id}\0{r.group_id}\0{len(r.samples)}\0".encode())
        for s in r.samples:
            h.update(s.sample_id.encode() + b"\0")
            h.update(array("q", s.input_ids).tobytes())
            h.update(array("b", s.loss_mask).tobytes())
            h.update(array("d", s.behavior_logprobs).tobytes())
    return h.hexdigest()[:16]


def _rewards_digest(prepared: Prepared) -> str:
    rows = sorted((r.rollout_id, r.reward.hex(), r.status, r.trainable) for r in prepared.rollouts)
    counts = [sorted(prepared.excluded.items()), sorted(prepared.masked.items())]
    return _digest(json.dumps([rows, counts]).encode())


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
