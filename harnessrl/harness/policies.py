"""Swappable ReAct parts: error-handling policies and context policies.

Error policies (chosen per sample through `HarnessSpec.options`):
  on_no_tool_call     nudge (append a user reminder, continue) | fail_turn (discard the response and resample
                      from the same context — a gateway rollback; the turn still counts) | end
  on_malformed_args   report (tool message with the error, continue) | fail_turn | end
  on_tool_timeout     report (observation says it was killed, continue) | end
  on_sandbox_failure  retry (up to `sandbox_retries`, then end as infra_error) | report | end (infra_error)

Context policies decide which messages each call sends. `trim_oldest` and `summarize` rewrite earlier
history, so the gateway sees a prefix it has not sampled and starts a new chain (a split) — by design.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

NO_TOOL_CALL_POLICIES = ("nudge", "fail_turn", "end")
MALFORMED_ARGS_POLICIES = ("report", "fail_turn", "end")
TOOL_TIMEOUT_POLICIES = ("report", "end")
SANDBOX_FAILURE_POLICIES = ("retry", "report", "end")
CONTEXT_POLICIES = ("keep_all", "trim_oldest", "summarize")

TRIMMED = "[earlier output trimmed to save context]"
SUMMARY_REQUEST = (
    "Summarize your progress on the task so far: what you learned about the code, what you "
    "changed, and what remains. Reply with the summary only."
)


class ContextPolicy(Protocol):
    name: str

    def view(self, history: list[dict]) -> list[dict]: ...

    def should_compact(self, prompt_tokens: int) -> bool: ...


@dataclass
class KeepAll:
    name: str = "keep_all"

    def view(self, history: list[dict]) -> list[dict]:
        return history

    def should_compact(self, prompt_tokens: int) -> bool:
        return False


@dataclass
class TrimOldest:
    """Keeps only the last `keep_last` tool observations verbatim; older ones become a placeholder."""

    keep_last: int = 3
    name: str = "trim_oldest"

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
    name: str = "summarize"

    def view(self, history: list[dict]) -> list[dict]:
        return history

    def should_compact(self, prompt_tokens: int) -> bool:
        return prompt_tokens >= self.at_tokens


def compacted_history(head: list[dict], summary: str) -> list[dict]:
    """`head` = system + task messages; the summary continues as a user message."""
    return [*head, {"role": "user", "content": f"Summary of your progress so far:\n{summary}\n\nContinue."}]


CONTEXT_POLICY_FACTORIES: dict[str, Callable[..., ContextPolicy]] = {
    "keep_all": lambda **kw: KeepAll(),
    "trim_oldest": lambda keep_last_observations=3, **kw: TrimOldest(keep_last=int(keep_last_observations)),
    "summarize": lambda summarize_at_tokens=4096, **kw: Summarize(at_tokens=int(summarize_at_tokens)),
}


def check_choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"harness option {field}={value!r} is not one of {list(allowed)}")
    return value
