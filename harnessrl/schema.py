"""Data contracts shared between stages. Column names are the Parquet/JSONL names.

A task row is SWE-smith's schema (see harnessrl.taskset); a `Sample` is what the trainer reads; a
`HarnessSpec` is the per-sample choice of harness, sandbox, reward and limits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


class RolloutStatus(StrEnum):
    """How a rollout ended (`rollout_status` of rollout rows and samples). Which ones are scored — their
    graded reward is the agent's — is `scored_statuses` below; the others keep their rows and reasons and are
    never trained as reward 0."""

    OK = "ok"  # the episode ran to an end the agent is accountable for (submitted, budget, ...)
    FAILED = "failed"  # the harness or the model call broke (a bug, a rejected request)
    TIMEOUT = "timeout"  # the wall-clock limit
    INFRA_ERROR = "infra_error"  # the sandbox, the engine or a worker failed: not the agent's doing
    # the agent's changes made a diff over the cap (sandbox/workspace.py MAX_PATCH_BYTES): no patch is kept.
    # The agent's doing: scored 0 (verify does not run the tests), not dropped as a failure.
    PATCH_TOO_LARGE = "patch_too_large"


# Rollouts the agent is accountable for: verify scores them (patch_too_large: 0, without running tests), they
# count as attempts and a trainer trains on their reward. A rollout its own budget cut short (finish_reason
# turn_budget, token_budget: truncated) ended `ok` and is scored on what it left.
SCORED_STATUSES = frozenset({RolloutStatus.OK, RolloutStatus.PATCH_TOO_LARGE})
# Never the agent's doing: never scored, and never in a group's baseline either (not even as a masked failed
# attempt, train.data: `nonok: mask`), whatever a config says.
INFRA_STATUSES = frozenset({RolloutStatus.INFRA_ERROR})


def scored_statuses(extra: Iterable[RolloutStatus | str] = ()) -> frozenset[RolloutStatus]:
    """The statuses whose graded reward is taken as the agent's: SCORED_STATUSES, plus those a trainer's
    settings add (`ok_statuses`, e.g. `timeout`: a timed-out rollout then trains on its verdict rather than
    being dropped or masked). The one definition the train stage and the RL loop (its learner and its group
    classification alike) read. An infrastructure status is refused: its rollout is never the agent's 0."""
    added = frozenset(RolloutStatus(s) for s in extra)
    refused = sorted(added & INFRA_STATUSES)
    if refused:
        raise ValueError(
            f"ok_statuses: {', '.join(refused)} is never scored (an infrastructure failure is not the agent's "
            f"doing); statuses that may be added: {', '.join(sorted(set(RolloutStatus) - INFRA_STATUSES))}"
        )
    return SCORED_STATUSES | added


@dataclass
class Sample:
    """One training sequence: a gateway chain flattened. Several samples may share one rollout.

    `loss_mask[i] == 1` only for tokens the policy sampled under exactly this prefix;
    `behavior_logprobs[i]` is the sampling logprob of token i (0.0 where the mask is 0);
    `policy_version[i]` is the weight version that sampled token i (-1 for context tokens).
    """

    sample_id: str
    rollout_id: str
    group_id: str  # the task (instance_id): advantages are computed over rollouts of one group
    input_ids: list[int]
    loss_mask: list[int]
    behavior_logprobs: list[float]
    policy_version: list[int] = field(default_factory=list)
    reward: float | None = None
    rollout_status: RolloutStatus = RolloutStatus.OK  # non-ok rollouts are never trained as reward 0

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Sample:
        """Reads a row (JSON or Parquet: sequences may come as arrays); extra columns are ignored."""

        def sequence(v: Any) -> list:
            return v.tolist() if hasattr(v, "tolist") else list(v)

        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in row.items() if k in names}
        for k in ("input_ids", "loss_mask", "behavior_logprobs", "policy_version"):
            if k in kw:
                kw[k] = sequence(kw[k])
        if "rollout_status" in kw:
            kw["rollout_status"] = RolloutStatus(kw["rollout_status"])
        return cls(**kw)


class HarnessName(StrEnum):
    REACT = "react"
    MINI_SWE_AGENT = "mini-swe-agent"
    CLAUDE_CODE = "claude-code"  # the upstream CLI, pinned, inside the rollout's bubblewrap sandbox
    CODEX = "codex"  # the upstream Codex CLI, pinned, inside the rollout's bubblewrap sandbox
    CHAT = "chat"  # one reply, no tools (environments graded on the answer)


class SpecMix(StrEnum):
    """How a run's harness specs are dealt to the rollouts of its groups (rollout.specs.assign)."""

    SAMPLE = "sample"  # rollout k of group g takes spec (g × group size + k) mod n: every group mixes them
    GROUP = "group"  # group g takes spec g mod n for all its rollouts: a group baseline compares one harness


class SandboxKind(StrEnum):
    BUBBLEWRAP = "bubblewrap"  # workspace = a one-commit git repo
    BUBBLEWRAP_STRICT = "bubblewrap-strict"  # no .git in the workspace; git refuses
    LOCAL = "local"  # no isolation: only with allow_unsandboxed, for debugging
    PODMAN = "podman"  # one container per rollout from the task's image (image_name), local
    KUBERNETES = "kubernetes"  # one pod per rollout from the task's image, commands via exec


class RewardName(StrEnum):
    SWEBENCH = "swebench"  # binary: resolved under SWE-bench grading
    F2P_FRACTION = "f2p_fraction"  # fraction of FAIL_TO_PASS tests that pass


@dataclass
class HarnessSpec:
    """Per-sample choice of harness, tools, sandbox, reward and limits."""

    harness: HarnessName = HarnessName.REACT
    tools: list[str] = field(default_factory=lambda: ["bash", "edit", "submit"])
    sandbox: SandboxKind = SandboxKind.BUBBLEWRAP
    reward: str = ""  # "": the task's environment's default; a name it offers; or "module:function"
    limits: dict[str, Any] = field(default_factory=lambda: {"turns": 20, "tokens": 8192, "wall_s": 600})
    options: dict[str, Any] = field(
        default_factory=dict
    )  # harness-specific (context strategy, error handling)
    network: str | None = None  # podman / kubernetes: named egress allow-list (None: no network)
    # which of a rollout's chains train: "all" (main agent, subagents, compaction, side calls) or "main" (the
    # chain its first call started); applied where the gateway assembles samples (gateway/samples.py)
    train_chains: str = "all"
