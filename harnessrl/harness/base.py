"""Types every harness shares: where the model is, what the task is, and how an episode ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from harnessrl.harness.runtime import ToolRuntime

# rollout_status values (harnessrl.schema.Sample.rollout_status): non-ok rollouts are never trained as reward 0
STATUS_OK, STATUS_FAILED, STATUS_TIMEOUT, STATUS_INFRA = "ok", "failed", "timeout", "infra_error"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint: the gateway's per-session URL (`.../sessions/{sid}/v1`) and its key."""

    base_url: str
    api_key: str
    model: str = "policy"


@dataclass(frozen=True)
class TaskPrompt:
    instance_id: str
    problem_statement: str


@dataclass
class HarnessResult:
    status: str = STATUS_OK  # ok | failed | timeout | infra_error
    finish_reason: str = ""  # submitted | turn_budget | token_budget | no_tool_call | malformed_args |
    # tool_timeout | too_many_failed_turns | wall_time | sandbox_error | model_error | harness_error | <harness's>
    turns: int = 0  # model calls made for the agent loop (summaries excluded)
    failed_turns: int = 0
    tool_calls: int = 0
    errors: dict[str, int] = field(
        default_factory=dict
    )  # no_tool_call, malformed_args, tool_timeout, sandbox_failure
    compactions: int = 0  # context rewrites (trims that changed history, summaries)
    prompt_tokens_last: int = 0
    completion_tokens: int = 0
    model_s: float = 0.0
    tool_s: float = 0.0
    wall_s: float = 0.0
    error: str = ""  # human-readable reason for a non-ok status
    transcript: list[dict[str, Any]] = field(default_factory=list)  # debugging only — never training data

    def count(self, key: str) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1

    def to_row(self, with_transcript: bool = False) -> dict[str, Any]:
        row = asdict(self)
        if not with_transcript:
            row.pop("transcript")
        return row


class Harness(Protocol):
    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime) -> HarnessResult: ...
