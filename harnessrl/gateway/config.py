"""Gateway settings (`harnessrl gateway serve` flags map onto these)."""

from __future__ import annotations

from dataclasses import dataclass, fields

MiB = 1 << 20


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
    max_request_bytes: int = 8 * MiB  # larger request bodies get 413 (before they are read)
    # Bodies above this are decoded, converted and rendered in a worker thread (the event loop keeps serving);
    # at most `offload_concurrency` at a time (each can hold ~150x its size in memory while it is rendered).
    offload_bytes: int = MiB // 4
    offload_concurrency: int = 2
    # A streamed reply's text goes out at most this often (the rest with the end events): a CLI agent spends
    # ~6 ms of CPU on each text event (Claude Code: 1.45 s per 70-event reply vs 1.05 s for one event), and
    # a slow policy's per-token events cost its CPUs more than they tell the agent (it acts on a whole reply).
    stream_interval_ms: int = 1000
    salvage: bool = False  # start even if the journal has corrupt lines: keep every complete record, report

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"GatewayConfig.{f.name}: expected an integer >= 0, got {value!r}")
        for name in ("max_model_len", "max_request_bytes", "offload_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"GatewayConfig.{name}: must be >= 1")
