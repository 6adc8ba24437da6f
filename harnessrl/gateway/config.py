"""Gateway settings (`harnessrl gateway serve` flags map onto these)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GatewayConfig:
    max_model_len: int = 32768  # prompt + completion tokens the engine accepts
    min_new_tokens: int = (
        1  # below this much room the call ends with finish_reason "length" (never silently 1)
    )
    default_max_tokens: int = 1024
    drift_check_every: int = 10  # re-render the whole prompt every N-th call of a chain (0: never)
    rollback_any_depth: bool = (
        False  # rewinds deeper than the last assistant turn: False = split, True = truncate
    )
    tool_format: str = "hermes"
    retry_after_s: int = 2
    model_name: str = "harnessrl-policy"
