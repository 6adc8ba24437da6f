"""Types every harness shares: where the model is, what the task is, and how an episode ended."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from harnessrl.harness.runtime import ToolRuntime
from harnessrl.schema import RolloutStatus


class EpisodeEnd(StrEnum):
    """Why an episode ended: the `finish_reason` of a harness result and of a rollout row."""

    SUBMITTED = "submitted"
    TURN_BUDGET = "turn_budget"
    TOKEN_BUDGET = "token_budget"
    NO_TOOL_CALL = "no_tool_call"
    MALFORMED_ARGS = "malformed_args"
    TOOL_TIMEOUT = "tool_timeout"
    TOO_MANY_FAILED_TURNS = "too_many_failed_turns"
    FORMAT_ERRORS = "format_errors"  # mini-swe-agent: repeated replies without an action block
    WALL_TIME = "wall_time"
    SANDBOX_ERROR = "sandbox_error"
    MODEL_ERROR = "model_error"
    HARNESS_ERROR = "harness_error"
    SETUP_ERROR = "setup_error"  # the rollout failed before or after the harness ran (workspace, diff)
    WORKER_CRASHED = "worker_crashed"  # the rollout's worker died without returning


class TurnError(StrEnum):
    """What went wrong in one turn (the keys of `HarnessResult.errors`, counted per episode)."""

    NO_TOOL_CALL = "no_tool_call"
    MALFORMED_ARGS = "malformed_args"
    TOOL_TIMEOUT = "tool_timeout"
    SANDBOX_FAILURE = "sandbox_failure"


def model_error_status(http_status: int | None) -> RolloutStatus:
    """A failed model call: no answer (None), overloaded (429) or a server error (5xx, e.g. the gateway's 502
    for an unreachable engine) is infrastructure; any other answer (4xx: a request the harness got wrong)
    fails the rollout."""
    if http_status is None or http_status == 429 or http_status >= 500:
        return RolloutStatus.INFRA_ERROR
    return RolloutStatus.FAILED


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
    status: RolloutStatus = RolloutStatus.OK
    finish_reason: EpisodeEnd | None = None  # set when the episode ends
    turns: int = 0  # model calls made for the agent loop (summaries excluded)
    failed_turns: int = 0
    tool_calls: int = 0
    errors: dict[TurnError, int] = field(default_factory=dict)
    compactions: int = 0  # context rewrites (trims that changed history, summaries)
    prompt_tokens_last: int = 0
    completion_tokens: int = 0
    model_s: float = 0.0
    tool_s: float = 0.0
    wall_s: float = 0.0
    error: str = ""  # human-readable reason for a non-ok status
    final_answer: str = ""  # the agent's last reply: what answer-graded environments reward
    transcript: list[dict[str, Any]] = field(default_factory=list)  # debugging only — never training data

    def count(self, key: TurnError) -> None:
        self.errors[key] = self.errors.get(key, 0) + 1

    def to_row(self, with_transcript: bool = False) -> dict[str, Any]:
        row = asdict(self)
        if not with_transcript:
            row.pop("transcript")
        return row


class Harness(Protocol):
    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime) -> HarnessResult: ...


# A spec's harness limits and their types; each harness's config says which it honours (`SpecConfig.LIMITS`).
# The gateway's limits are every harness's: `reply_tokens` holds each model call's reply (a CLI is also told it),
# `context_tokens` each call's prompt + reply (the rollout's context window).
GATEWAY_LIMITS = ("reply_tokens", "context_tokens")
LIMIT_TYPES: dict[str, type] = {
    "turns": int,
    "tokens": int,
    "wall_s": float,
    "tool_timeout_s": float,
    "reply_tokens": int,
    "context_tokens": int,
}


class SpecConfig(Protocol):
    """A harness config made from a spec: `LIMITS` maps each limit key it honours to its field."""

    LIMITS: ClassVar[dict[str, str]]


def spec_kwargs(
    config: type[SpecConfig], limits: Mapping[str, Any], options: Mapping[str, Any], harness: str
) -> dict[str, Any]:
    """A config's keyword arguments from a spec: its options (fields, except those a limit sets: set those in
    `limits`), then the limits it honours, typed. ValueError naming an unknown option."""
    names = {f.name for f in fields(config)} - set(config.LIMITS.values())  # type: ignore[arg-type]
    unknown = sorted(set(options) - names)
    if unknown:
        set_by = sorted(k for k, f in config.LIMITS.items() if f in unknown)
        raise ValueError(
            f"unknown {harness} harness option(s) {unknown}; allowed: {sorted(names)}"
            + (f" (set limits.{', limits.'.join(set_by)} instead)" if set_by else "")
        )
    kw = dict(options)
    for key, name in config.LIMITS.items():
        if key in limits:
            kw[name] = LIMIT_TYPES[key](limits[key])
    return kw
