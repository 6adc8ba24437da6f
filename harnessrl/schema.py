"""Data contracts shared between stages (see DESIGN.md §3). Column names are the Parquet/JSONL names."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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
    rollout_status: str = "ok"  # ok | failed | timeout | infra_error — non-ok rollouts are never trained as 0

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Sample:
        names = cls.__dataclass_fields__
        return cls(
            **{
                k: (list(v) if isinstance(v, (list, tuple)) or hasattr(v, "tolist") else v)
                for k, v in row.items()
                if k in names
            }
        )


@dataclass
class HarnessSpec:
    """Per-sample choice of harness, tools, sandbox, reward and limits."""

    harness: str = "react"  # react | mini-swe-agent | <registered name>
    tools: list[str] = field(default_factory=lambda: ["bash", "edit", "submit"])
    sandbox: str = "bubblewrap"  # bubblewrap | kubernetes
    reward: str = "swebench"  # swebench (binary resolved) | f2p_fraction
    limits: dict[str, Any] = field(default_factory=lambda: {"turns": 20, "tokens": 8192, "wall_s": 600})
    options: dict[str, Any] = field(
        default_factory=dict
    )  # harness-specific (context policy, error policies…)
