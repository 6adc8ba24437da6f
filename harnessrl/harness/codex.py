"""Codex CLI as a training harness: the upstream CLI, unchanged and version-pinned, inside the rollout's sandbox.

What runs where (docs/harness.md, "Codex"):
- the CLI's pinned native executable (`cli_agents`, installed by `make cli-agents`) is bound read-only into the
  rollout's bubblewrap sandbox at `/opt/harnessrl/codex` and started there once, headless: `codex exec --json
  --dangerously-bypass-approvals-and-sandbox --ephemeral ...`, the task on stdin, cwd `/workspace`. Its tools
  (exec_command, apply_patch, ...) run as its children, inside the sandbox: no network, the workspace, a private
  `/tmp`; its own sandbox is off (bubblewrap is the boundary);
- its home (`CODEX_HOME=/tmp/.codex`: config, sqlite state, logs, skills) is on the sandbox's per-run `/tmp`
  tmpfs: per rollout, discarded when the run ends; `--ephemeral` writes no session files;
- it reaches only the gateway: Codex's HTTP client needs a TCP base URL, so a bridge (`sandbox/loopback_bridge.py`,
  run by the sandbox's `python3`) listens on a loopback port in the sandbox's own network namespace and pipes
  each connection to the gateway's Unix socket (`BubblewrapSandbox.connect_gateway`). The CLI's model provider
  is that URL (`wire_api = "responses"`: it speaks the OpenAI Responses API, which the gateway serves); the
  bridge also ends the run when the model-call budget (`max_turns`) is spent;
- analytics, feedback, update checks, web search, sub-agents, goals, bundled skills, apps and plugins are off;
  every model name it sends is the policy (the gateway serves one model under any name).

The episode is bounded by `max_turns` (model calls, counted by the bridge) and the wall clock (the sandbox kills
the whole run at `wall_s`). How it ended is read from the sandbox's outcome, the bridge's marks and the CLI's
JSONL events (`turn.completed`, `turn.failed`, `error`); the rollout status names the cause. Training data comes
from the gateway's records only; the CLI's events are kept as the transcript (debugging).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from harnessrl.harness import cli_episode
from harnessrl.harness.base import Endpoint, EpisodeEnd, HarnessResult
from harnessrl.harness.cli_agents import CODEX, CODEX_VERSION
from harnessrl.harness.cli_episode import CliConfig, CliHarness, Ending
from harnessrl.sandbox import loopback_bridge
from harnessrl.sandbox.base import RunResult
from harnessrl.schema import RolloutStatus

BRIDGE_MOUNT = "/run/harnessrl/loopback_bridge.py"
BRIDGE_PORT = 41873  # inside the sandbox's own network namespace: nothing else listens there
CODEX_HOME = "/tmp/.codex"
PROVIDER = "harnessrl"
KEY_ENV = "HARNESSRL_API_KEY"
INSTRUCTIONS_ENV = "HARNESSRL_BASE_INSTRUCTIONS"  # the base_instructions option, written to INSTRUCTIONS_FILE
INSTRUCTIONS_FILE = f"{CODEX_HOME}/instructions.md"
# Off: what would reach a host other than the gateway, and the tool families a text policy has no use for.
OFFLINE_CONFIG = {
    "analytics.enabled": "false",
    "feedback.enabled": "false",
    "check_for_update_on_startup": "false",
    "web_search": '"disabled"',
    "skills.bundled.enabled": "false",
    "otel.exporter": '"none"',
}
DISABLED_FEATURES = (
    "multi_agent",
    "goals",
    "image_generation",
    "apps",
    "plugins",
    "browser_use",
    "computer_use",
)
# Config keys the harness owns (its provider and sandboxing): an option may not set them.
OWN_CONFIG = ("model_provider", "model_providers", "sandbox_mode", "approval_policy", "otel", "analytics")
_STATUS = re.compile(r"\b(?:status|HTTP)\D{0,3}(\d{3})\b|\b(\d{3}) (?:[A-Z][a-z]+ ?)+:")
# How Codex says its context window is full (the gateway's `context_length_exceeded`).
CONTEXT_FULL = ("ran out of room in the model's context window", "context window", "context_length_exceeded")
# A reply cut at the per-call token limit (the gateway's `response.incomplete`): Codex ends its turn.
REPLY_CUT = ("incomplete response returned",)


@dataclass
class CodexConfig(CliConfig):
    """Per-sample settings (HarnessSpec `limits.turns` = model calls: the bridge ends the run before the next
    one; `limits.wall_s` and `options`)."""

    tool = CODEX
    mount = "/opt/harnessrl/codex"
    own_env = (
        KEY_ENV,
        INSTRUCTIONS_ENV,
        "CODEX_HOME",
        "HOME",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "CODEX_API_KEY",
    )
    binds = {BRIDGE_MOUNT: Path(loopback_bridge.__file__)}  # the bridge, run by the sandbox's python3
    # Codex reads replaced base instructions from a file only (`model_instructions_file`): written in its home
    setup = (
        f'mkdir -p "$CODEX_HOME" && {{ [ -z "${INSTRUCTIONS_ENV}+x" ] || '
        f'printf %s "${INSTRUCTIONS_ENV}" > {INSTRUCTIONS_FILE}; }} && '
    )

    version: str = CODEX_VERSION
    model: str | None = None  # the model name it sends (None: the CLI's default); it changes its prompt
    base_instructions: str | None = None  # replaces its own system prompt (`model_instructions_file`)
    developer_instructions: str | None = None  # `developer_instructions`: added to its own
    disable: list[str] = field(default_factory=list)  # more features off (`--disable`)
    enable: list[str] = field(default_factory=list)  # features on (`--enable`), e.g. one of DISABLED_FEATURES
    config: dict[str, Any] = field(default_factory=dict)  # more `-c key=value` (values as TOML: JSON types)
    max_retries: int = 2  # the provider's request_max_retries / stream_max_retries

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise ValueError(f"codex option model: expected a model name, got {self.model!r}")
        if self.base_instructions is not None and not isinstance(self.base_instructions, str):
            raise ValueError(f"codex option base_instructions: expected text, got {self.base_instructions!r}")
        if not isinstance(self.config, dict) or not all(isinstance(k, str) for k in self.config):
            raise ValueError(f"codex option config: expected key -> value, got {self.config!r}")
        owned = sorted(k for k in self.config if k.split(".")[0] in OWN_CONFIG)
        if owned:
            raise ValueError(f"codex option config: {owned} are set by the harness")
        for k, v in self.config.items():
            toml_value(v, f"codex option config[{k!r}]")
        if int(self.max_retries) < 0:
            raise ValueError("codex option max_retries must be >= 0")

    def provider(self, base_url: str) -> str:
        """The `model_providers.harnessrl` table (TOML inline table): the gateway session through the bridge."""
        idle_ms = int(float(self.wall_s) * 1000)  # a slow engine is never an idle stream: wall_s bounds
        fields_ = {
            "name": toml_value("harnessrl gateway"),
            "base_url": toml_value(base_url),
            "env_key": toml_value(KEY_ENV),
            "wire_api": toml_value("responses"),
            "request_max_retries": str(int(self.max_retries)),
            "stream_max_retries": str(int(self.max_retries)),
            "stream_idle_timeout_ms": str(idle_ms),
        }
        return "{" + ", ".join(f"{k} = {v}" for k, v in fields_.items()) + "}"

    def codex_args(self, base_url: str) -> list[str]:
        """`codex exec`'s arguments (the task comes on stdin: the last `-`)."""
        a = ["exec", "--json", "--color", "never", "--strict-config", "--skip-git-repo-check", "--ephemeral"]
        a += ["--dangerously-bypass-approvals-and-sandbox", "-C", "/workspace"]
        a += [
            "-c",
            f"model_provider={toml_value(PROVIDER)}",
            "-c",
            f"model_providers.{PROVIDER}={self.provider(base_url)}",
        ]
        for key, value in OFFLINE_CONFIG.items():
            a += ["-c", f"{key}={value}"]
        for feature in [*DISABLED_FEATURES, *self.disable]:
            if feature not in self.enable:
                a += ["--disable", feature]
        for feature in self.enable:
            a += ["--enable", feature]
        if self.base_instructions is not None:
            a += ["-c", f"model_instructions_file={toml_value(INSTRUCTIONS_FILE)}"]
        if self.developer_instructions:
            a += ["-c", f"developer_instructions={toml_value(self.developer_instructions)}"]
        for key, value in self.config.items():
            a += ["-c", f"{key}={toml_value(value)}"]
        if self.model:
            a += ["-m", self.model]
        return [*a, *self.extra_args, "-"]

    def command(self, executable: str, endpoint: Endpoint, socket: str) -> tuple[list[str], dict[str, str]]:
        """The bridge from a loopback port to the gateway's socket, which runs `codex exec ...` pointed at it."""
        bridge = ["python3", BRIDGE_MOUNT, "--listen", f"127.0.0.1:{BRIDGE_PORT}", "--socket", socket]
        bridge += ["--max-requests", str(int(self.max_turns)), "--count-suffix", "/responses", "--"]
        argv = [*bridge, executable, *self.codex_args(bridge_base_url(endpoint.base_url))]
        env = {**self.env, KEY_ENV: endpoint.api_key, "CODEX_HOME": CODEX_HOME, "NO_COLOR": "1"}
        if self.base_instructions is not None:
            env[INSTRUCTIONS_ENV] = self.base_instructions
        return argv, env

    def read(self, res: HarnessResult, run: RunResult, events: list[dict[str, Any]]) -> Ending:
        count_events(res, events, run.stderr)
        return classify(run.outcome, run.exit_code, run.detail, run.stderr, events)


def toml_value(value: Any, where: str = "value") -> str:
    """A JSON-typed value as TOML (what `-c key=value` parses): strings, numbers, booleans, lists, tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string is a JSON string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v, where) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v, where)}" for k, v in value.items()) + "}"
        )
    raise ValueError(f"{where}: cannot write {value!r} as TOML")


def bridge_base_url(openai_base_url: str) -> str:
    """The session's OpenAI base URL (`http://host:port/sessions/{sid}/v1`) as the CLI reaches it: through the
    bridge's loopback port inside the sandbox."""
    parts = urlsplit(openai_base_url)
    return urlunsplit(("http", f"127.0.0.1:{BRIDGE_PORT}", parts.path.rstrip("/"), "", ""))


class CodexHarness(CliHarness):
    def __init__(self, config: CodexConfig | None = None):
        super().__init__(config or CodexConfig())


def model_calls(stderr: str) -> int | None:
    """The bridge's count of model calls (its last line on stderr), None when it did not print one. The CLI's
    processes write to the same stream: the mark may follow a line of theirs that they left unfinished."""
    found = re.findall(rf"{re.escape(loopback_bridge.COUNT_MARK)} (\d+)$", stderr, re.M)
    return int(found[-1]) if found else None


def count_events(res: HarnessResult, events: list[dict[str, Any]], stderr: str = "") -> None:
    """Turns = model calls (the bridge counts them; else the agent's messages and tool calls), tool calls = its
    command executions, file changes and MCP calls; the final answer = its last agent message."""
    messages = 0
    for e in events:
        item = cli_episode.as_dict(e.get("item"))
        if e.get("type") == "item.completed":
            kind = item.get("type")
            if kind == "agent_message":
                messages += 1
                res.final_answer = str(item.get("text") or "")
            elif kind in ("command_execution", "file_change", "mcp_tool_call"):
                res.tool_calls += 1
        if e.get("type") == "turn.completed":
            res.completion_tokens = int(cli_episode.as_dict(e.get("usage")).get("output_tokens") or 0)
    calls = model_calls(stderr)
    res.turns = calls if calls is not None else messages + res.tool_calls


def _error_text(events: list[dict[str, Any]]) -> str:
    """The CLI's last error: a `turn.failed` event's, else the last `error` event's."""
    for e in reversed(events):
        if e.get("type") == "turn.failed":
            err = e.get("error")
            return str(err.get("message") if isinstance(err, dict) else err or "")
    for e in reversed(events):
        if e.get("type") == "error":
            return str(e.get("message") or "")
    return ""


def http_status(text: str) -> int | None:
    """An HTTP status named in the CLI's error text (`unexpected status 404 Not Found: ...`)."""
    m = _STATUS.search(text)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def classify(
    outcome: str, exit_code: int | None, detail: str, stderr: str, events: list[dict[str, Any]]
) -> Ending:
    """How the episode ended: the sandbox's outcome first (it killed the run or could not start it), then the
    bridge's budget mark, then the CLI's events. `ok` endings are the agent's (verify scores them)."""
    lines = [x for x in stderr.strip().splitlines() if loopback_bridge.COUNT_MARK not in x]
    tail = (lines or [""])[-1][:300]
    if ending := cli_episode.sandbox_ending(outcome, detail, tail):
        return ending
    if loopback_bridge.BUDGET_MARK in stderr:
        return RolloutStatus.OK, EpisodeEnd.TURN_BUDGET, ""
    kinds = {e.get("type") for e in events}
    error = _error_text(events)
    if "turn.completed" in kinds and "turn.failed" not in kinds:
        return RolloutStatus.OK, EpisodeEnd.SUBMITTED, ""
    if exit_code == 127 and "python3" in tail:  # the bridge could not start: the sandbox lacks what it needs
        return (
            RolloutStatus.INFRA_ERROR,
            EpisodeEnd.SANDBOX_ERROR,
            f"no python3 in the sandbox for the bridge: {tail}",
        )
    if not error:
        return cli_episode.unfinished(exit_code, tail, "finishing its turn")
    if any(x in error.lower() for x in (*CONTEXT_FULL, *REPLY_CUT)):  # the agent's end, scored
        return RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET, error[:300]
    code = http_status(error)
    if code is None and "invalid_request_error" in error:  # a 400 whose body the CLI shows as it came
        code = 400
    return cli_episode.model_error(code, error)
