"""Gateway counters (`GET /admin/metrics`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .enums import ChainOp, Drift


@dataclass
class GatewayMetrics:
    calls: int = 0
    calls_failed: int = 0
    rejected_paused: int = 0
    held_paused: int = 0  # new calls that waited out a holding pause
    context_exhausted: int = 0
    op_new: int = 0
    op_extend: int = 0
    op_rollback: int = 0
    op_fork: int = 0
    discarded_trainable_tokens: int = 0
    drift_clean: int = 0
    drift_realigned: int = 0
    drift_forked: int = 0
    aborted_generations: int = 0
    recovered_calls: int = 0
    salvaged_dropped_lines: int = 0  # journal lines a salvaging start left out (see its report file)
    stream_mismatch: int = 0
    gateway_cpu_s: float = 0.0

    def count_call(self, op: ChainOp, drift: Drift | None, discarded: int, cpu_s: float) -> None:
        self.calls += 1
        name = f"op_{op.value}"
        setattr(self, name, getattr(self, name) + 1)
        self.discarded_trainable_tokens += discarded
        self.gateway_cpu_s += cpu_s
        if drift is not None:
            name = f"drift_{drift.value}"
            setattr(self, name, getattr(self, name) + 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
