"""Per-step metrics of the RL loop: one JSONL row per step (`steps.jsonl`, rewritten atomically so a resumed
run continues the same file), TensorBoard event files (`tensorboard/`), and a callback for the one-line
stdout echo the CLI prints (the KFP UI shows pod logs live)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.io import write_jsonl
from harnessrl.rl.records import StepRecord

logger = logging.getLogger(__name__)

# the columns of the one-line echo, in order
ECHO_KEYS = (
    "step",
    "version",
    "outcome",
    "reward_mean",
    "loss",
    "groups_trained",
    "staleness_mean",
    "partial_rollouts",
    "mean_reply_tokens",
    "length_finish_share",
    "distinct_2",
    "engine_idle_frac",
    "step_s",
    "wall_s",
)


def echo_line(row: dict[str, Any]) -> str:
    parts = []
    for key in ECHO_KEYS:
        value = row.get(key)
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return "rl " + " ".join(parts)


class MetricsSink:
    """The one writer of step records: `steps.jsonl` (the rows of a resumed run's earlier steps first),
    TensorBoard scalars, the echo line."""

    def __init__(self, out: Path, earlier: list[StepRecord], echo: Callable[[str], None] | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.path = out / "steps.jsonl"
        self.records = list(earlier)
        self.echo = echo
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=len(earlier) + 1)

    def add(self, record: StepRecord) -> None:
        self.records.append(record)
        row = record.row()
        write_jsonl(self.path, [r.row() for r in self.records])
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(f"rl/{key}", value, global_step=record.step)
        self.writer.flush()
        line = echo_line(row)
        logger.info("%s", line)
        if self.echo is not None:
            self.echo(line)

    def close(self) -> None:
        self.writer.close()
