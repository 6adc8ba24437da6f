"""Black-box harness: mini-swe-agent, unchanged, against the gateway, with its actions run in our sandbox.

We use mini-swe-agent's own agent loop (`DefaultAgent`), prompts (`mini_textbased.yaml`) and model class
(`LitellmTextbasedModel`, i.e. litellm → OpenAI-compatible `api_base` = the gateway session URL). The only
piece we supply is its `Environment`: `SandboxEnvironment` executes each bash action through our
`ToolRuntime` (bubblewrap), so the harness never touches the host. Its trajectory is kept for debugging
only; training data comes from the gateway's records.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from harnessrl.harness.base import (
    Endpoint,
    EpisodeEnd,
    HarnessResult,
    TaskPrompt,
    TurnError,
    model_error_status,
    spec_kwargs,
)
from harnessrl.harness.runtime import TIMEOUT, SandboxFailure, ToolRuntime
from harnessrl.schema import RolloutStatus

logger = logging.getLogger(__name__)

# offline operation: no cost-map download, no cost errors for our unregistered model, no first-run wizard
OFFLINE_ENV = {
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_CONFIGURED": "true",
    "MSWEA_SILENT_STARTUP": "1",
}
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

EXIT_STATUS_TO_RESULT: dict[str, tuple[RolloutStatus, EpisodeEnd]] = {  # mini-swe-agent's exit_status
    "Submitted": (RolloutStatus.OK, EpisodeEnd.SUBMITTED),
    "LimitsExceeded": (RolloutStatus.OK, EpisodeEnd.TURN_BUDGET),
    "TimeExceeded": (RolloutStatus.TIMEOUT, EpisodeEnd.WALL_TIME),
    "RepeatedFormatError": (RolloutStatus.OK, EpisodeEnd.FORMAT_ERRORS),
}


def import_minisweagent() -> ModuleType:
    """Imports mini-swe-agent for offline use (it reads MSWEA_* at import) with litellm quiet: litellm
    otherwise prints a help banner to stdout with every provider error, into a stage's JSON output."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    import litellm
    import minisweagent

    litellm.suppress_debug_info = True
    return minisweagent


class SandboxEnvironment:
    """mini-swe-agent `Environment` protocol implemented on our `ToolRuntime`."""

    def __init__(self, runtime: ToolRuntime, timeout: float = 60.0, stats: dict[str, float] | None = None):
        self.runtime = runtime
        self.config = {"timeout": timeout, "cwd": str(runtime.workspace)}
        self.stats = stats if stats is not None else {}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = action.get("command", "")
        t0 = time.monotonic()
        try:
            res = self.runtime.run_shell(command, timeout=float(timeout or self.config["timeout"]))
        finally:
            self.stats["tool_s"] = self.stats.get("tool_s", 0.0) + time.monotonic() - t0
            self.stats["tool_calls"] = self.stats.get("tool_calls", 0) + 1
        if res.outcome == TIMEOUT:
            self.stats["tool_timeout"] = self.stats.get("tool_timeout", 0) + 1
            output = {
                "output": res.output,
                "returncode": -1,
                "exception_info": f"The command timed out after {self.config['timeout']}s and was killed.",
            }
        else:
            output = {
                "output": res.output,
                "returncode": res.exit_code if res.exit_code is not None else -1,
                "exception_info": "" if res.outcome in ("ok", "nonzero") else f"outcome: {res.outcome}",
            }
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": dict(self.config),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }


@dataclass
class MiniSweAgentConfig:
    LIMITS: ClassVar[dict[str, str]] = {
        "turns": "step_limit",
        "wall_s": "wall_s",
        "tool_timeout_s": "tool_timeout_s",
    }
    step_limit: int = 20
    wall_s: float = 600.0
    tool_timeout_s: float = 60.0
    max_tokens_per_turn: int = 512
    temperature: float = 1.0
    config_file: str = "mini_textbased.yaml"  # shipped with mini-swe-agent, or a path
    seed: int | None = None
    model_retries: int = 2  # attempts per model call (mini-swe-agent waits ≥4 s between attempts)

    @classmethod
    def from_spec(cls, limits: dict[str, Any], options: dict[str, Any]) -> MiniSweAgentConfig:
        return cls(**spec_kwargs(cls, limits, options, "mini-swe-agent"))


class MiniSweAgentHarness:
    def __init__(self, config: MiniSweAgentConfig | None = None):
        self.config = config or MiniSweAgentConfig()

    def _agent_config(self) -> dict[str, Any]:
        import yaml

        minisweagent = import_minisweagent()
        path = Path(self.config.config_file)
        if not path.is_file():
            path = Path(minisweagent.package_dir) / "config" / self.config.config_file
        if not path.is_file():
            raise FileNotFoundError(f"mini-swe-agent config {self.config.config_file!r} not found")
        return yaml.safe_load(path.read_text())

    def run(self, task: TaskPrompt, endpoint: Endpoint, runtime: ToolRuntime) -> HarnessResult:
        cfg = self.config
        res = HarnessResult()
        start = time.monotonic()
        stats: dict[str, float] = {}
        agent = None
        try:
            os.environ["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = str(cfg.model_retries)
            full = self._agent_config()
            from minisweagent.agents.default import DefaultAgent
            from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

            model_cfg = {k: v for k, v in full.get("model", {}).items() if k != "model_kwargs"}
            model = LitellmTextbasedModel(
                model_name=f"openai/{endpoint.model}",
                cost_tracking="ignore_errors",
                model_kwargs={
                    **full.get("model", {}).get("model_kwargs", {}),
                    "api_base": endpoint.base_url,
                    "api_key": endpoint.api_key,
                    "max_tokens": cfg.max_tokens_per_turn,
                    "temperature": cfg.temperature,
                    "timeout": cfg.wall_s,
                    **({"seed": cfg.seed} if cfg.seed is not None else {}),
                },
                **model_cfg,
            )
            env = SandboxEnvironment(runtime, timeout=cfg.tool_timeout_s, stats=stats)
            agent_cfg = {
                **full.get("agent", {}),
                "step_limit": cfg.step_limit,
                "cost_limit": 0,
                "wall_time_limit_seconds": int(cfg.wall_s),
            }
            agent = DefaultAgent(model, env, **agent_cfg)
            info = agent.run(task.problem_statement)
            exit_status = info.get("exit_status") or ""
            res.final_answer = str(info.get("submission") or "")  # what follows its submit command
            if exit_status in EXIT_STATUS_TO_RESULT:
                res.status, res.finish_reason = EXIT_STATUS_TO_RESULT[exit_status]
            else:
                res.status, res.finish_reason = RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR
                res.error = f"mini-swe-agent ended with exit status {exit_status!r}"
        except SandboxFailure as e:
            res.status, res.finish_reason, res.error = (
                RolloutStatus.INFRA_ERROR,
                EpisodeEnd.SANDBOX_ERROR,
                str(e),
            )
            res.count(TurnError.SANDBOX_FAILURE)
        except Exception as e:
            res.status, res.finish_reason, res.error = _classify_exception(e)
            if res.finish_reason is EpisodeEnd.HARNESS_ERROR:
                logger.exception("task %s: mini-swe-agent failed", task.instance_id)
        if agent is not None:
            res.turns = agent.n_calls
            res.transcript = [{k: v for k, v in m.items() if k != "extra"} for m in agent.messages]
            format_errors = sum(
                1 for m in agent.messages if m.get("extra", {}).get("interrupt_type") == "FormatError"
            )
            if format_errors:
                res.errors[TurnError.NO_TOOL_CALL] = format_errors
        res.tool_calls = int(stats.get("tool_calls", 0))
        if stats.get("tool_timeout"):
            res.errors[TurnError.TOOL_TIMEOUT] = int(stats["tool_timeout"])
        res.tool_s = stats.get("tool_s", 0.0)
        res.wall_s = time.monotonic() - start
        res.model_s = max(0.0, res.wall_s - res.tool_s)  # mini-swe-agent does little besides these two
        return res


def _classify_exception(e: Exception) -> tuple[RolloutStatus, EpisodeEnd, str]:
    """litellm raises openai's exception classes (subclassed): the same rules as the ReAct harness."""
    import litellm
    import openai

    msg = f"{type(e).__name__}: {e}"[:1000]
    if isinstance(e, openai.APITimeoutError):  # before APIConnectionError, its base class
        return RolloutStatus.TIMEOUT, EpisodeEnd.WALL_TIME, msg
    if isinstance(e, litellm.exceptions.ContextWindowExceededError):
        return RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET, msg
    if isinstance(e, openai.APIConnectionError):
        return model_error_status(None), EpisodeEnd.MODEL_ERROR, msg
    if isinstance(e, openai.APIStatusError | litellm.exceptions.APIError):
        return model_error_status(e.status_code), EpisodeEnd.MODEL_ERROR, msg
    return RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR, msg
