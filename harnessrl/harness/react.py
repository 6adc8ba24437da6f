"""Our white-box ReAct harness: tool set, budgets, context strategy and error handling are all exposed.

It talks to the model only through an OpenAI-compatible endpoint (the gateway session URL + key), exactly
as a production harness would; the gateway records the exact tokens. One `ReActHarness.run` = one episode.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import openai

from harnessrl.choices import parse_choice
from harnessrl.harness.base import (
    Endpoint,
    EpisodeEnd,
    HarnessResult,
    TaskPrompt,
    TurnError,
    model_error_status,
    spec_kwargs,
)
from harnessrl.harness.runtime import SandboxFailure, ToolRuntime
from harnessrl.harness.strategies import (
    SUMMARY_REQUEST,
    ContextStrategy,
    ContextStrategyName,
    OnMalformedArgs,
    OnNoToolCall,
    OnSandboxFailure,
    OnToolTimeout,
    compacted_history,
    context_strategy,
)
from harnessrl.harness.tools import MalformedArguments, Observation, Tool, parse_arguments, toolset
from harnessrl.schema import RolloutStatus

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in the repository in your current directory. "
    "Use the tools to inspect and edit the code and run tests. Call exactly one tool per turn. "
    "When the fix is done, call submit."
)
NUDGE = "You did not call a tool. Call one of the tools ({tools}); call submit when you are done."


class _EndEpisode(Exception):
    def __init__(
        self,
        finish_reason: EpisodeEnd,
        status: RolloutStatus = RolloutStatus.OK,
        error: str = "",
        history: list[dict] | None = None,
    ):
        super().__init__(finish_reason)
        self.finish_reason, self.status, self.error = finish_reason, status, error
        self.history = history  # the final history, when the ending turn added messages


@dataclass
class ReActConfig:
    LIMITS: ClassVar[dict[str, str]] = {
        "turns": "max_turns",
        "tokens": "max_context_tokens",
        "wall_s": "wall_s",
        "tool_timeout_s": "tool_timeout_s",
    }
    tools: tuple[str, ...] = ("bash", "edit", "submit")
    max_turns: int = 20
    max_context_tokens: int = 8192  # prompt + completion of any one call
    max_tokens_per_turn: int = 512
    min_tokens_per_turn: int = 32  # below this the episode ends (token_budget) instead of asking for 1 token
    wall_s: float = 600.0
    tool_timeout_s: float = 60.0
    temperature: float = 1.0
    on_no_tool_call: OnNoToolCall = OnNoToolCall.NUDGE
    on_malformed_args: OnMalformedArgs = OnMalformedArgs.REPORT
    on_tool_timeout: OnToolTimeout = OnToolTimeout.REPORT
    on_sandbox_failure: OnSandboxFailure = OnSandboxFailure.RETRY
    max_failed_turns: int = 3
    sandbox_retries: int = 1
    context: ContextStrategyName = ContextStrategyName.KEEP_ALL
    keep_last_observations: int = 3
    summarize_at_tokens: int = 4096
    system_prompt: str = SYSTEM_PROMPT
    seed: int | None = None  # call i of the episode samples with seed + i (reproducible rollouts)
    http_retries: int = 5  # 429/5xx from the gateway (e.g. paused for a weight sync) are retried with backoff

    def __post_init__(self) -> None:
        # options arrive as JSON strings: each becomes its enum member (or a ValueError naming the option)
        self.on_no_tool_call = parse_choice(
            OnNoToolCall, self.on_no_tool_call, "harness option on_no_tool_call"
        )
        self.on_malformed_args = parse_choice(
            OnMalformedArgs, self.on_malformed_args, "harness option on_malformed_args"
        )
        self.on_tool_timeout = parse_choice(
            OnToolTimeout, self.on_tool_timeout, "harness option on_tool_timeout"
        )
        self.on_sandbox_failure = parse_choice(
            OnSandboxFailure, self.on_sandbox_failure, "harness option on_sandbox_failure"
        )
        self.context = parse_choice(ContextStrategyName, self.context, "harness option context")
        self.tools = tuple(self.tools)
        toolset(list(self.tools))
        for name in ("max_turns", "max_context_tokens", "max_tokens_per_turn", "min_tokens_per_turn"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"harness option {name} must be >= 1, got {getattr(self, name)!r}")

    @classmethod
    def from_spec(cls, tools: list[str], limits: dict[str, Any], options: dict[str, Any]) -> ReActConfig:
        """Builds the config from a HarnessSpec's tools, limits (LIMITS) and options."""
        options = {k: v for k, v in options.items() if k != "tools"}
        return cls(tools=tuple(tools), **spec_kwargs(cls, limits, options, "react"))

    def context_strategy(self) -> ContextStrategy:
        return context_strategy(self.context, self.keep_last_observations, self.summarize_at_tokens)


def _assistant_message(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments},
            }
            for tc in msg.tool_calls
        ]
    return out


class ReActHarness:
    def __init__(self, config: ReActConfig | None = None):
        self.config = config or ReActConfig()
        self.tools: dict[str, Tool] = toolset(list(self.config.tools))

    # ------------------------------------------------------------------ episode
    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime) -> HarnessResult:
        cfg = self.config
        res = HarnessResult()
        start = time.monotonic()
        self._deadline = start + cfg.wall_s
        self._calls = 0
        client = openai.OpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=cfg.http_retries
        )
        context = cfg.context_strategy()
        head = [
            {"role": "system", "content": cfg.system_prompt},
            {"role": "user", "content": task.problem_statement},
        ]
        history: list[dict] = list(head)
        last_sent: list[dict] | None = None
        try:
            while True:
                if res.turns >= cfg.max_turns:
                    raise _EndEpisode(EpisodeEnd.TURN_BUDGET)
                if context.should_compact(res.prompt_tokens_last):
                    history = self._summarize(client, endpoint, context.view(history), head, res)
                    last_sent = None
                messages = context.view(history)
                if last_sent is not None and _rewrote_prefix(last_sent, messages):
                    res.compactions += 1
                completion = self._call(client, endpoint, messages, res, with_tools=True)
                last_sent = messages
                res.turns += 1
                choice = completion.choices[0]
                assistant = _assistant_message(choice.message)
                if not choice.message.tool_calls:
                    history = self._on_no_tool_call(
                        history, assistant, res, cut=choice.finish_reason == "length"
                    )
                    continue
                history = self._act(history, assistant, runtime, res)
        except _EndEpisode as end:
            res.finish_reason, res.status, res.error = end.finish_reason, end.status, end.error
            history = end.history or history
        except Exception as e:  # a harness bug: recorded as failed, never as reward 0
            logger.exception("task %s: the ReAct harness failed", task.instance_id)
            res.finish_reason, res.status = EpisodeEnd.HARNESS_ERROR, RolloutStatus.FAILED
            res.error = f"{type(e).__name__}: {e}"
        res.wall_s = time.monotonic() - start
        res.transcript = history
        return res

    # ------------------------------------------------------------------ model calls
    def _remaining(self) -> float:
        return self._deadline - time.monotonic()

    def _call(
        self,
        client: openai.OpenAI,
        endpoint: Endpoint,
        messages: list[dict],
        res: HarnessResult,
        with_tools: bool,
    ) -> Any:
        cfg = self.config
        max_tokens = min(cfg.max_tokens_per_turn, cfg.max_context_tokens - res.prompt_tokens_last)
        if max_tokens < min(cfg.min_tokens_per_turn, cfg.max_tokens_per_turn):
            raise _EndEpisode(EpisodeEnd.TOKEN_BUDGET)
        remaining = self._remaining()
        if remaining <= 0:
            raise _EndEpisode(
                EpisodeEnd.WALL_TIME, RolloutStatus.TIMEOUT, f"wall-clock limit {cfg.wall_s:.0f}s reached"
            )
        kwargs: dict[str, Any] = {"tools": [t.schema() for t in self.tools.values()]} if with_tools else {}
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed + self._calls
        self._calls += 1
        t0 = time.monotonic()
        try:
            completion = client.chat.completions.create(
                model=endpoint.model,
                # the history holds OpenAI chat messages (system/user/assistant/tool dicts) built here
                messages=cast("list[ChatCompletionMessageParam]", messages),
                max_tokens=max_tokens,
                temperature=cfg.temperature,
                timeout=remaining,
                **kwargs,
            )
        except openai.APITimeoutError:
            raise _EndEpisode(
                EpisodeEnd.WALL_TIME, RolloutStatus.TIMEOUT, "model call outlived the wall-clock limit"
            ) from None
        except openai.APIStatusError as e:
            raise _EndEpisode(
                EpisodeEnd.MODEL_ERROR,
                model_error_status(e.status_code),
                f"model endpoint answered {e.status_code}: {e.message}",
            ) from None
        except openai.APIConnectionError as e:
            raise _EndEpisode(
                EpisodeEnd.MODEL_ERROR, model_error_status(None), f"model endpoint unreachable: {e}"
            ) from None
        finally:
            res.model_s += time.monotonic() - t0
        usage = completion.usage
        if usage is not None:
            res.prompt_tokens_last = usage.prompt_tokens + usage.completion_tokens
            res.completion_tokens += usage.completion_tokens
        else:  # rough estimate so the budget still binds
            chars = sum(len(str(m.get("content") or "")) for m in messages)
            res.prompt_tokens_last = chars // 4 + len(completion.choices[0].message.content or "") // 4
        return completion

    def _summarize(
        self,
        client: openai.OpenAI,
        endpoint: Endpoint,
        view: list[dict],
        head: list[dict],
        res: HarnessResult,
    ) -> list[dict]:
        # the summary request extends the current chain; the compacted history then starts a new one (split)
        completion = self._call(
            client, endpoint, [*view, {"role": "user", "content": SUMMARY_REQUEST}], res, with_tools=False
        )
        res.compactions += 1
        summary = completion.choices[0].message.content or ""
        res.prompt_tokens_last = 0  # unknown until the next call reports usage; the history is now short
        return compacted_history(head, summary)

    # ------------------------------------------------------------------ error handling
    def _fail_turn(self, history: list[dict], res: HarnessResult) -> list[dict]:
        """Discards the response: the next call resamples from the same context (a gateway rollback)."""
        res.failed_turns += 1
        if res.failed_turns > self.config.max_failed_turns:
            raise _EndEpisode(EpisodeEnd.TOO_MANY_FAILED_TURNS)
        return history

    def _on_no_tool_call(
        self, history: list[dict], assistant: dict, res: HarnessResult, cut: bool
    ) -> list[dict]:
        """`cut`: the reply ran into its token limit (finish_reason `length`)."""
        res.count(TurnError.NO_TOOL_CALL)
        handling = self.config.on_no_tool_call
        if handling is OnNoToolCall.END:  # the reply is the agent's last word: its final answer
            res.final_answer = str(assistant.get("content") or "")
            # a reply cut at the budget is not a finished answer: ended as the chat harness ends one, so a
            # reward that refuses unfinished answers sees it (scoring it whole taught long, cut replies)
            end = EpisodeEnd.TOKEN_BUDGET if cut else EpisodeEnd.NO_TOOL_CALL
            raise _EndEpisode(end, history=[*history, assistant])
        if handling is OnNoToolCall.FAIL_TURN:
            return self._fail_turn(history, res)
        nudge = NUDGE.format(tools=", ".join(self.tools))
        return [*history, assistant, {"role": "user", "content": nudge}]

    def _act(
        self, history: list[dict], assistant: dict, runtime: ToolRuntime, res: HarnessResult
    ) -> list[dict]:
        cfg = self.config
        observations: list[dict] = []
        submitted = False
        for call in assistant["tool_calls"]:
            fn = call["function"]
            tool = self.tools.get(fn["name"])
            try:
                if tool is None:
                    raise MalformedArguments(f"unknown tool {fn['name']!r}; available: {sorted(self.tools)}")
                args = parse_arguments(tool, fn.get("arguments"))
                obs = self._execute(tool, args, runtime, res)
            except MalformedArguments as e:
                res.count(TurnError.MALFORMED_ARGS)
                if cfg.on_malformed_args is OnMalformedArgs.END:
                    raise _EndEpisode(EpisodeEnd.MALFORMED_ARGS) from None
                if cfg.on_malformed_args is OnMalformedArgs.FAIL_TURN:
                    return self._fail_turn(history, res)
                obs = Observation(f"Error: {e}")
            if obs.timed_out:
                res.count(TurnError.TOOL_TIMEOUT)
                if cfg.on_tool_timeout is OnToolTimeout.END:
                    raise _EndEpisode(EpisodeEnd.TOOL_TIMEOUT)
            observations.append({"role": "tool", "tool_call_id": call["id"], "content": obs.content})
            submitted = submitted or obs.submitted
            if obs.answer is not None:
                res.final_answer = obs.answer
        history = [*history, assistant, *observations]
        if submitted:
            raise _EndEpisode(EpisodeEnd.SUBMITTED, history=history)
        return history

    def _execute(
        self, tool: Tool, args: dict[str, Any], runtime: ToolRuntime, res: HarnessResult
    ) -> Observation:
        cfg = self.config
        attempts = 1 + (cfg.sandbox_retries if cfg.on_sandbox_failure is OnSandboxFailure.RETRY else 0)
        for attempt in range(attempts):
            timeout = min(cfg.tool_timeout_s, self._remaining())
            if timeout <= 0:
                raise _EndEpisode(
                    EpisodeEnd.WALL_TIME, RolloutStatus.TIMEOUT, f"wall-clock limit {cfg.wall_s:.0f}s reached"
                )
            t0 = time.monotonic()
            try:
                res.tool_calls += 1
                return tool.execute(args, runtime, timeout)
            except SandboxFailure as e:
                res.count(TurnError.SANDBOX_FAILURE)
                if cfg.on_sandbox_failure is OnSandboxFailure.REPORT:
                    return Observation(f"Error: the tool could not run ({e}). Try again.")
                if attempt + 1 >= attempts:
                    raise _EndEpisode(EpisodeEnd.SANDBOX_ERROR, RolloutStatus.INFRA_ERROR, str(e)) from None
            finally:
                res.tool_s += time.monotonic() - t0
        raise AssertionError("unreachable")


def _rewrote_prefix(previous: list[dict], current: list[dict]) -> bool:
    """True when `current` does not extend `previous` message-for-message (trim/summary → gateway split)."""
    if len(current) < len(previous):
        return True
    return any(
        json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True)
        for a, b in zip(previous, current, strict=False)
    )
