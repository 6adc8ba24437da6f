"""Swappable parts of the ReAct harness: how it handles errors and what context each model call sees.

Error handling (chosen per sample through `HarnessSpec.options`):
  on_no_tool_call     nudge (append a user reminder, continue) | fail_turn (discard the response and resample
                      from the same context — a gateway rollback; the turn still counts) | end
  on_malformed_args   report (tool message with the error, continue) | fail_turn | end
  on_tool_timeout     report (observation says it was killed, continue) | end
  on_sandbox_failure  retry (up to `sandbox_retries`, then end as infra_error) | report | end (infra_error)

Context strategies decide which messages each call sends. `trim_oldest` and `summarize` rewrite earlier
history, so the gateway sees a prefix it has not sampled and starts a new chain (a split) — by design.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class OnNoToolCall(StrEnum):
    NUDGE = "nudge"
    FAIL_TURN = "fail_turn"
    END = "end"


class OnMalformedArgs(StrEnum):
    REPORT = "report"
    FAIL_TURN = "fail_turn"
    END = "end"


class OnToolTimeout(StrEnum):
    REPORT = "report"
    END = "end"


class OnSandboxFailure(StrEnum):
    RETRY = "retry"
    REPORT = "report"
    END = "end"


class ContextStrategyName(StrEnum):
    KEEP_ALL = "keep_all"
    TRIM_OLDEST = "trim_oldest"
    SUMMARIZE = "summarize"


TRIMMED = "[earlier output trimmed to save context]"
SUMMARY_REQUEST = (
    "Summarize your progress on the task so far: what you learned about the code, what you "
    "changed, and what remains. Reply with the summary only."
)


class ContextStrategy(Protocol):
    name: ContextStrategyName

    def view(self, history: list[dict]) -> list[dict]: ...

    def should_compact(self, prompt_tokens: int) -> bool: ...


@dataclass
class KeepAll:
    name: ContextStrategyName = ContextStrategyName.KEEP_ALL

    def view(self, history: list[dict]) -> list[dict]:
        return history

    def should_compact(self, prompt_tokens: int) -> bool:
        return False


@dataclass
class TrimOldest:
    """Keeps only the last `keep_last` tool observations verbatim; older ones become a placeholder."""

    keep_last: int = 3
    name: ContextStrategyName = ContextStrategyName.TRIM_OLDEST

    def view(self, history: list[dict]) -> list[dict]:
        tool_idx = [i for i, m in enumerate(history) if m.get("role") == "tool"]
        old = set(tool_idx[: max(0, len(tool_idx) - self.keep_last)])
        return [{**m, "content": TRIMMED} if i in old else m for i, m in enumerate(history)]

    def should_compact(self, prompt_tokens: int) -> bool:
        return False


@dataclass
class Summarize:
    """When the prompt exceeds `at_tokens`, ask the model for a summary and restart from task + summary."""

    at_tokens: int = 4096
    name: ContextStrategyName = ContextStrategyName.SUMMARIZE

    def view(self, history: list[dict]) -> list[dict]:
        return history

    def should_compact(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.at_tokens


def compacted_history(head: list[dict], summary: str) -> list[dict]:
    """`head` = system + task messages; the summary continues as a user message."""
    return [*head, {"role": "user", "content": f"Summary of your progress so far:\n{summary}\n\nContinue."}]


def context_strategy(
    name: ContextStrategyName, keep_last_observations: int = 3, summarize_at_tokens: int = 4096
) -> ContextStrategy:
    if name is ContextStrategyName.TRIM_OLDEST:
        return TrimOldest(keep_last=int(keep_last_observations))
    if name is ContextStrategyName.SUMMARIZE:
        return Summarize(at_tokens=int(summarize_at_tokens))
    return KeepAll()
