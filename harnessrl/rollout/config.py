"""The generate stage's settings (also what estimate-difficulty and evaluate pass on): a module without heavy
imports, so the CLI offers them at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from harnessrl.choices import parse_choice
from harnessrl.rollout.executors import ExecutorName


class FailedSamples(StrEnum):
    """What happens to the samples of non-ok rollouts in samples.parquet."""

    KEEP = "keep"  # kept with their rollout_status; the trainer masks or drops them
    DROP = "drop"  # left out


# Rollouts in flight at once. The engine batches their turns: on the local engine a decode step for 8 rows
# costs ~1.5x one for 4 (its weights are read once per step), so 8 at once finish ~1.3x sooner than 4 then 4.
DEFAULT_CONCURRENCY = 8


@dataclass
class GenerateConfig:
    group_size: int = 4
    concurrency: int = DEFAULT_CONCURRENCY
    max_tasks: int | None = None
    instance_ids: list[str] | None = None
    failed_samples: FailedSamples = FailedSamples.KEEP
    allow_unsandboxed: bool = False
    keep_workspaces: bool = False
    seed: int = 0
    executor: ExecutorName = ExecutorName.THREADS
    ray_cpus: float = 0.5  # CPUs Ray reserves per rollout (the engine's GPUs stay with the engine service)
    spec_options: dict[str, Any] = field(default_factory=dict)  # laid over every rollout's spec options

    def __post_init__(self) -> None:  # modes may arrive as strings (KFP parameters, Python callers)
        self.failed_samples = parse_choice(FailedSamples, self.failed_samples, "failed_samples")
        self.executor = parse_choice(ExecutorName, self.executor, "executor")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
