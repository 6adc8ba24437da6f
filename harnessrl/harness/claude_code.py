"""Claude Code as a training harness: the upstream CLI, unchanged and version-pinned, inside the rollout's sandbox.

What runs where (docs/harness.md, "Claude Code"):
- the CLI's pinned native executable (`cli_agents`, installed by `make cli-agents`) is bound read-only into the
  rollout's bubblewrap sandbox at `/opt/harnessrl/claude-code` and started there once, headless:
  `claude -p --output-format stream-json --verbose --max-turns N --permission-mode bypassPermissions ...`, the
  task on stdin, cwd `/workspace`. Its tools (Bash, Read, Edit, ...) run in-process or as its children, so every
  action is inside the sandbox: no network, the workspace, a private `/tmp`;
- its home is the sandbox's per-run `/tmp` tmpfs (`~/.claude.json`, `~/.claude/`): per rollout, discarded when
  the run ends;
- it reaches only the gateway: one Unix socket bound at `/run/harnessrl/gateway.sock`, forwarded to the
  gateway's TCP address by the sandbox (`BubblewrapSandbox.connect_gateway`), which the CLI uses for every API
  call (`ANTHROPIC_UNIX_SOCKET`; `ANTHROPIC_BASE_URL` = the session's Anthropic URL, its key the session key);
  non-essential traffic, telemetry, error reporting, auto-update and the web tools are off;
- every model it asks for (main, small/fast, subagents) is the policy: the gateway serves one model under any
  name; `models` only sets the names the CLI sends (they change what it sends: its default model adds a
  mid-conversation system message, a 1M-token window, ...).

The episode is bounded by `max_turns` (`--max-turns`) and the wall clock (the sandbox kills the whole run at
`wall_s`). How it ended is read from the CLI's final `result` event and the sandbox's outcome; the rollout
status names the cause (docs/harness.md has the table). Training data comes from the gateway's records only; the
CLI's events are kept as the transcript (debugging).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from harnessrl.harness import cli_episode
from harnessrl.harness.base import Endpoint, EpisodeEnd, HarnessResult
from harnessrl.harness.cli_agents import CLAUDE_CODE, CLAUDE_CODE_VERSION
from harnessrl.harness.cli_episode import CliConfig, CliHarness, Ending
from harnessrl.sandbox.base import RunResult
from harnessrl.schema import RolloutStatus

# Off: anything that would reach a host other than the gateway, and what would write outside the run's /tmp.
OFFLINE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",  # a per-task billing header in the first system block
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_UPDATES": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
    "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
    "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
    "IS_SANDBOX": "1",  # bypassPermissions: the sandbox is the boundary
}
WEB_TOOLS = ("WebFetch", "WebSearch")
MODEL_TIERS = {  # option key -> the variable the CLI reads for it (main: --model)
    "fast": ("ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL"),
    "subagent": ("CLAUDE_CODE_SUBAGENT_MODEL",),
}
_API_ERROR = re.compile(r"API Error: (\d{3})")
_TRUNCATED = re.compile(r"^\[\.\.\. \d+ bytes truncated \.\.\.\]$", re.M)  # the sandbox's output cap
# How the CLI says its context is full: the gateway's `prompt is too long` 400, or compaction that cannot keep up.
CONTEXT_FULL = ("prompt is too long", "autocompact is thrashing")
# Its replies cut at the per-call token limit (`stop_reason: max_tokens`) after its own continuation attempts:
# "Claude's response exceeded the N output token maximum" — the agent's end, scored.
REPLY_CUT = ("output token maximum",)


@dataclass
class ClaudeCodeConfig(CliConfig):
    """Per-sample settings (HarnessSpec `limits.turns` = `--max-turns`, `limits.wall_s` and `options`)."""

    tool = CLAUDE_CODE
    mount = "/opt/harnessrl/claude-code"
    own_env = (
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_UNIX_SOCKET",
        "ANTHROPIC_AUTH_TOKEN",
        "HOME",
    )

    version: str = CLAUDE_CODE_VERSION
    tools: list[str] | None = None  # --tools: the built-in tools it offers (None: the CLI's default set)
    allowed_tools: list[str] | None = None  # --allowedTools rules; given: everything else is denied (dontAsk)
    disallowed_tools: list[str] = field(default_factory=list)  # --disallowedTools, besides the web tools
    append_system_prompt: str | None = None
    system_prompt: str | None = None  # replaces the CLI's own
    models: dict[str, str] = field(default_factory=dict)  # main / fast / subagent -> the name it sends
    bare: bool = False  # --bare: no hooks, skills, CLAUDE.md discovery; a ~1.2k-token first prompt
    max_retries: int = 3  # CLAUDE_CODE_MAX_RETRIES (429 / 5xx; a paused gateway holds calls instead)
    auto_compact_window: int | None = None  # CLAUDE_CODE_AUTO_COMPACT_WINDOW (the CLI honours >= 100k)

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = sorted(set(self.models) - {"main", *MODEL_TIERS})
        if unknown or not all(isinstance(v, str) and v for v in self.models.values()):
            raise ValueError(
                f"claude-code option models: keys main / fast / subagent -> a model name, got {self.models!r}"
            )
        if self.auto_compact_window is not None and int(self.auto_compact_window) < 1:
            raise ValueError("claude-code option auto_compact_window must be >= 1")

    def command(self, executable: str, endpoint: Endpoint, socket: str) -> tuple[list[str], dict[str, str]]:
        """`claude -p ...`; every API call goes to the gateway's socket, to the session's Anthropic URL."""
        a = [executable, "-p", "--output-format", "stream-json", "--verbose"]
        a += ["--max-turns", str(int(self.max_turns)), "--no-session-persistence"]
        if self.allowed_tools is not None:
            a += ["--permission-mode", "dontAsk", "--allowedTools", ",".join(self.allowed_tools)]
        else:
            a += ["--permission-mode", "bypassPermissions"]
        a += ["--disallowedTools", ",".join([*WEB_TOOLS, *self.disallowed_tools])]
        if self.tools is not None:
            a += ["--tools", ",".join(self.tools)]
        if self.system_prompt is not None:
            a += ["--system-prompt", self.system_prompt]
        if self.append_system_prompt:
            a += ["--append-system-prompt", self.append_system_prompt]
        if "main" in self.models:
            a += ["--model", self.models["main"]]
        if self.bare:
            a.append("--bare")
        env = {
            **OFFLINE_ENV,
            "ANTHROPIC_BASE_URL": anthropic_base_url(endpoint.base_url),
            "ANTHROPIC_API_KEY": endpoint.api_key,
            "ANTHROPIC_UNIX_SOCKET": socket,
            "CLAUDE_CODE_MAX_RETRIES": str(int(self.max_retries)),
        }
        if self.reply_tokens is not None:  # it then asks for what the gateway allows
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(int(self.reply_tokens))
        for tier, variables in MODEL_TIERS.items():
            if tier in self.models:
                env.update(dict.fromkeys(variables, self.models[tier]))
        if self.auto_compact_window is not None:
            env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(int(self.auto_compact_window))
        return a + list(self.extra_args), {**env, **self.env}

    def read(self, res: HarnessResult, run: RunResult, events: list[dict[str, Any]]) -> Ending:
        count_events(res, events, truncated=bool(_TRUNCATED.search(run.stdout)))
        return classify(run.outcome, run.exit_code, run.detail, run.stderr, events)


class ClaudeCodeHarness(CliHarness):
    def __init__(self, config: ClaudeCodeConfig | None = None):
        super().__init__(config or ClaudeCodeConfig())


def anthropic_base_url(openai_base_url: str) -> str:
    """The session's Anthropic base URL (`.../sessions/{sid}`) from its OpenAI one (`.../sessions/{sid}/v1`)."""
    url = openai_base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def count_events(res: HarnessResult, events: list[dict[str, Any]], truncated: bool = False) -> None:
    """Turns = the main agent's model replies (one message id each; the CLI emits an event per block), tool calls,
    compactions; model time from the result event."""
    replies: set[str] = set()
    cli_turns = 0
    for e in events:
        message = cli_episode.as_dict(e.get("message"))
        if (  # its own error notes ("API Error: ...", "Prompt is too long") come as replies of model <synthetic>
            e.get("type") == "assistant"
            and e.get("parent_tool_use_id") is None
            and message.get("model") != "<synthetic>"
        ):
            replies.add(str(message.get("id") or len(replies)))
            content = message.get("content")
            if isinstance(content, list):
                res.tool_calls += sum(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
        if e.get("type") == "system" and (
            e.get("subtype") == "compact_boundary" or e.get("compact_result") == "success"
        ):
            res.compactions += 1
        if e.get("type") == "result":
            if not e.get("is_error"):
                res.final_answer = str(e.get("result") or "")
            usage = cli_episode.as_dict(e.get("usage"))
            res.completion_tokens = int(usage.get("output_tokens") or 0)
            res.model_s = float(e.get("duration_api_ms") or 0) / 1000
            cli_turns = int(e.get("num_turns") or 0)
    # output cut in the middle (the sandbox's cap): the CLI's own count, which includes its error notes
    res.turns = max(len(replies), cli_turns) if truncated else len(replies)


def classify(
    outcome: str, exit_code: int | None, detail: str, stderr: str, events: list[dict[str, Any]]
) -> Ending:
    """How the episode ended: the sandbox's outcome first (it killed the run or could not start it), then the
    CLI's final `result` event. `ok` endings are the agent's (verify scores them); the others name the cause."""
    tail = (stderr.strip().splitlines() or [""])[-1][:300]
    if ending := cli_episode.sandbox_ending(outcome, detail, tail):
        return ending
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    if result is None:
        return cli_episode.unfinished(exit_code, tail, "a result event")
    text = str(result.get("result") or "")
    subtype = str(result.get("subtype") or "")
    if subtype == "error_max_turns":
        return RolloutStatus.OK, EpisodeEnd.TURN_BUDGET, ""
    if not result.get("is_error") and subtype == "success":
        return RolloutStatus.OK, EpisodeEnd.SUBMITTED, ""
    if any(x in text.lower() for x in (*CONTEXT_FULL, *REPLY_CUT)):  # the agent's end, scored
        return RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET, text[:300]
    status_code = result.get("api_error_status")
    if not isinstance(status_code, int):
        m = _API_ERROR.search(text)
        status_code = int(m.group(1)) if m else None
    if status_code is not None or text.startswith("API Error"):
        return cli_episode.model_error(status_code, text)
    return RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR, f"{subtype or 'error'}: {text[:300]}"
