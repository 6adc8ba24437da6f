"""mini-swe-agent (unchanged, its own loop and prompts) against a scripted model server over real HTTP,
its actions executed through our ToolRuntime."""

from __future__ import annotations

import pytest

from harnessrl.harness.base import Endpoint, TaskPrompt, TurnError
from harnessrl.harness.mini_swe_agent import MiniSweAgentConfig, MiniSweAgentHarness
from harnessrl.harness.runtime import LocalSubprocessRuntime
from tests.support.scripted_model import ScriptedModelServer

TASK = TaskPrompt("demo__task-1", "Fix the bug in calc.py")


def action(cmd: str) -> dict:
    return {"content": f"THOUGHT: do it.\n\n```mswea_bash_command\n{cmd}\n```"}


def episode(script, tmp_path, **options):
    server = ScriptedModelServer(script)
    url = server.start()
    try:
        cfg = MiniSweAgentConfig(model_retries=1, **options)
        res = MiniSweAgentHarness(cfg).run(TASK, Endpoint(url, "sk-mini"), LocalSubprocessRuntime(tmp_path))
    finally:
        server.stop()
    return res, server.requests


def test_mini_swe_agent_runs_actions_in_our_runtime_and_submits(tmp_path):
    (tmp_path / "calc.py").write_text("x = 1 - 1\n")
    res, reqs = episode(
        [
            action("sed -i 's/1 - 1/1 + 1/' calc.py && cat calc.py"),
            {"content": "I am not sure what to do."},  # format error: mini-swe-agent handles it itself
            action("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
        ],
        tmp_path,
    )
    assert (res.status, res.finish_reason, res.turns, res.tool_calls) == ("ok", "submitted", 3, 2)
    assert (tmp_path / "calc.py").read_text() == "x = 1 + 1\n"
    assert res.errors == {"no_tool_call": 1}
    assert reqs[0]["_authorization"] == "Bearer sk-mini" and reqs[0]["max_tokens"] == 512
    assert "Fix the bug in calc.py" in reqs[0]["messages"][1]["content"]
    observation = reqs[1]["messages"][-1]["content"]
    assert "<returncode>0</returncode>" in observation and "x = 1 + 1" in observation


def test_mini_swe_agent_step_limit_and_tool_timeout(tmp_path):
    res, reqs = episode(
        [action("sleep 5"), action("echo a"), action("echo b")], tmp_path, step_limit=2, tool_timeout_s=0.5
    )
    assert (res.status, res.finish_reason, len(reqs)) == ("ok", "turn_budget", 2)
    assert res.errors.get(TurnError.TOOL_TIMEOUT) == 1
    assert "timed out" in reqs[1]["messages"][-1]["content"]


def test_mini_swe_agent_endpoint_down_is_infra_error(tmp_path):
    res, _ = episode([{"status": 503, "error": "engine unavailable"}], tmp_path)
    assert res.status == "infra_error" and res.finish_reason == "model_error"


def test_mini_swe_agent_bad_gateway_is_infra_error(tmp_path):
    """The gateway answers 502 when the engine behind it fails: litellm raises BadGatewayError for it."""
    res, _ = episode([{"status": 502, "error": "inference engine failed: unreachable"}] * 3, tmp_path)
    assert (res.status, res.finish_reason) == ("infra_error", "model_error")
    assert "BadGateway" in res.error


def test_mini_swe_agent_rejects_unknown_option():
    with pytest.raises(ValueError, match="step_limt"):
        MiniSweAgentConfig.from_spec({}, {"step_limt": 3})
