"""Control flow of the ReAct harness against a scripted model server (real loopback HTTP) and a real
local-subprocess tool runtime in a temp dir."""

from __future__ import annotations

import os

import pytest

from harnessrl.harness.base import Endpoint, TaskPrompt
from harnessrl.harness.react import ReActConfig, ReActHarness
from harnessrl.harness.runtime import LocalSubprocessRuntime, SandboxFailure, ShellResult
from harnessrl.harness.strategies import SUMMARY_REQUEST, TRIMMED
from tests.support.scripted_model import ScriptedModelServer

TASK = TaskPrompt("demo__task-1", "Fix the bug in calc.py")


@pytest.fixture
def episode(tmp_path):
    """Runs one episode; returns (result, requests the scripted model server received)."""

    def _run(script, runtime=None, repeat_last=False, **options):
        cfg = ReActConfig(http_retries=options.pop("http_retries", 0), **options)
        server = ScriptedModelServer(script, repeat_last=repeat_last)
        url = server.start()
        try:
            res = ReActHarness(cfg).run(
                TASK, Endpoint(url, "sk-session"), runtime or LocalSubprocessRuntime(tmp_path)
            )
        finally:
            server.stop()
        return res, server.requests

    return _run


def bash(cmd):
    return {"tool": "bash", "arguments": {"command": cmd}}


SUBMIT = {"tool": "submit", "arguments": {}}


def test_happy_path_edits_files_and_submits(episode, tmp_path):
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    res, reqs = episode(
        [
            bash("cat calc.py"),
            {
                "tool": "str_replace_editor",
                "arguments": {
                    "command": "str_replace",
                    "path": "calc.py",
                    "old_str": "a - b",
                    "new_str": "a + b",
                },
            },
            {
                "tool": "str_replace_editor",
                "arguments": {"command": "create", "path": "notes/n.txt", "file_text": "x"},
            },
            {"tool": "str_replace_editor", "arguments": {"command": "view", "path": "calc.py"}},
            SUBMIT,
        ]
    )
    assert (res.status, res.finish_reason, res.turns, res.tool_calls) == ("ok", "submitted", 5, 5)
    assert (tmp_path / "calc.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (tmp_path / "notes/n.txt").read_text() == "x"
    assert reqs[0]["_authorization"] == "Bearer sk-session"
    assert {t["function"]["name"] for t in reqs[0]["tools"]} == {"bash", "str_replace_editor", "submit"}
    assert [m["role"] for m in reqs[0]["messages"]] == ["system", "user"]
    obs = reqs[1]["messages"][-1]
    assert obs["role"] == "tool" and "return a - b" in obs["content"] and "<returncode>0" in obs["content"]
    assert "return a + b" in reqs[4]["messages"][-1]["content"]
    # each request extends the previous one (no split under keep_all)
    for a, b in zip(reqs, reqs[1:], strict=False):
        assert b["messages"][: len(a["messages"])] == a["messages"]
    assert res.compactions == 0


def test_no_tool_call_nudge_continues(episode):
    res, reqs = episode([{"content": "I think the bug is in calc."}, SUBMIT], on_no_tool_call="nudge")
    assert res.finish_reason == "submitted" and res.errors == {"no_tool_call": 1}
    assert reqs[1]["messages"][-2] == {"role": "assistant", "content": "I think the bug is in calc."}
    assert (
        reqs[1]["messages"][-1]["role"] == "user"
        and "did not call a tool" in reqs[1]["messages"][-1]["content"]
    )


def test_no_tool_call_fail_turn_resamples_from_same_context(episode):
    res, reqs = episode([{"content": "no"}, {"content": "still no"}, SUBMIT], on_no_tool_call="fail_turn")
    assert res.finish_reason == "submitted" and res.failed_turns == 2 and res.turns == 3
    # the discarded responses never enter the context: identical requests = rollback at the gateway
    assert reqs[0]["messages"] == reqs[1]["messages"] == reqs[2]["messages"]


def test_fail_turn_limit_ends_episode(episode):
    res, reqs = episode(
        [{"content": "no"}], repeat_last=True, on_no_tool_call="fail_turn", max_failed_turns=2
    )
    assert (res.status, res.finish_reason, len(reqs)) == ("ok", "too_many_failed_turns", 3)


def test_no_tool_call_end(episode):
    res, reqs = episode([{"content": "done?"}, SUBMIT], on_no_tool_call="end")
    assert (res.status, res.finish_reason, len(reqs)) == ("ok", "no_tool_call", 1)
    assert res.final_answer == "done?"


def test_a_reply_cut_at_its_token_limit_ends_on_the_token_budget_not_as_an_answer(episode):
    """The answer is what it wrote, but the episode says it was cut (as the chat harness does): a reward that
    refuses unfinished replies (the instruction family's `cut_off` guard) must see it."""
    res, reqs = episode(
        [{"content": "A long sentence that", "finish_reason": "length"}], on_no_tool_call="end"
    )
    assert (res.status, res.finish_reason, len(reqs)) == ("ok", "token_budget", 1)
    assert res.final_answer == "A long sentence that"


@pytest.mark.parametrize(
    "bad",
    [
        {"tool": "bash", "arguments": "{not json"},
        {"tool": "bash", "arguments": {"cmd": "ls"}},
        {"tool": "str_replace_editor", "arguments": {"command": "delete", "path": "a"}},
        {"tool": "rm_rf", "arguments": {}},
    ],
)
def test_malformed_arguments_reported(episode, bad):
    res, reqs = episode([bad, SUBMIT], on_malformed_args="report")
    assert res.finish_reason == "submitted" and res.errors == {"malformed_args": 1}
    last = reqs[1]["messages"][-1]
    assert last["role"] == "tool" and last["content"].startswith("Error:")


def test_malformed_arguments_fail_turn_and_end(episode):
    bad = {"tool": "bash", "arguments": "{"}
    res, reqs = episode([bad, SUBMIT], on_malformed_args="fail_turn")
    assert res.finish_reason == "submitted" and res.failed_turns == 1
    assert reqs[0]["messages"] == reqs[1]["messages"]
    res, reqs = episode([bad, SUBMIT], on_malformed_args="end")
    assert (res.finish_reason, len(reqs)) == ("malformed_args", 1)


def test_tool_timeout_report_and_end(episode):
    res, reqs = episode([bash("sleep 5; echo never"), SUBMIT], on_tool_timeout="report", tool_timeout_s=0.5)
    assert res.finish_reason == "submitted" and res.errors == {"tool_timeout": 1}
    assert "<timeout>" in reqs[1]["messages"][-1]["content"]
    assert res.tool_s < 4  # the command was killed, not waited for
    res, reqs = episode([bash("sleep 5"), SUBMIT], on_tool_timeout="end", tool_timeout_s=0.5)
    assert (res.status, res.finish_reason, len(reqs)) == ("ok", "tool_timeout", 1)


class FailingSandbox(LocalSubprocessRuntime):
    """Fault injection around the real local runtime: the first `failures` shell calls raise SandboxFailure."""

    def __init__(self, workspace, failures):
        super().__init__(workspace)
        self.failures = failures

    def run_shell(self, command: str, timeout: float) -> ShellResult:
        if self.failures > 0:
            self.failures -= 1
            raise SandboxFailure("bwrap: setting up uid map: Permission denied")
        return super().run_shell(command, timeout)


def test_sandbox_failure_retry_then_success(episode, tmp_path):
    res, reqs = episode(
        [bash("echo ok"), SUBMIT],
        runtime=FailingSandbox(tmp_path, 1),
        on_sandbox_failure="retry",
        sandbox_retries=1,
    )
    assert res.finish_reason == "submitted" and res.errors == {"sandbox_failure": 1}
    assert "ok" in reqs[1]["messages"][-1]["content"]


def test_sandbox_failure_exhausted_is_infra_error(episode, tmp_path):
    res, _ = episode(
        [bash("echo ok"), SUBMIT],
        runtime=FailingSandbox(tmp_path, 5),
        on_sandbox_failure="retry",
        sandbox_retries=2,
    )
    assert (res.status, res.finish_reason) == ("infra_error", "sandbox_error")
    assert res.errors == {"sandbox_failure": 3} and "Permission denied" in res.error
    res, _ = episode([bash("echo ok"), SUBMIT], runtime=FailingSandbox(tmp_path, 5), on_sandbox_failure="end")
    assert res.status == "infra_error" and res.errors == {"sandbox_failure": 1}


def test_sandbox_failure_report(episode, tmp_path):
    res, reqs = episode(
        [bash("echo ok"), SUBMIT], runtime=FailingSandbox(tmp_path, 1), on_sandbox_failure="report"
    )
    assert res.finish_reason == "submitted"
    assert "could not run" in reqs[1]["messages"][-1]["content"]


def test_trim_oldest_rewrites_old_observations(episode):
    script = [bash(f"echo out{i}") for i in range(4)] + [SUBMIT]
    res, reqs = episode(script, context="trim_oldest", keep_last_observations=2)
    tools = [m for m in reqs[4]["messages"] if m["role"] == "tool"]
    assert [m["content"] == TRIMMED for m in tools] == [True, True, False, False]
    assert "out3" in tools[-1]["content"]
    # the 4th request no longer extends the 3rd: the gateway must split
    assert reqs[3]["messages"][: len(reqs[2]["messages"])] != reqs[2]["messages"]
    assert res.compactions == 2


def test_summarize_compacts_history(episode):
    # the first call's usage (~190 tokens) crosses the threshold, so the second request asks for a summary
    script = [bash("echo " + "x" * 400), {"content": "I listed files and echoed x."}, SUBMIT]
    res, reqs = episode(script, context="summarize", summarize_at_tokens=150)
    summary_req = reqs[1]
    assert summary_req["messages"][-1]["content"] == SUMMARY_REQUEST
    assert "tools" not in summary_req
    after = reqs[reqs.index(summary_req) + 1]["messages"]
    assert [m["role"] for m in after] == ["system", "user", "user"]
    assert "I listed files and echoed x." in after[-1]["content"]
    assert res.finish_reason == "submitted" and res.compactions == 1


def test_turn_and_token_budgets(episode):
    res, reqs = episode([bash("echo a")], repeat_last=True, max_turns=3)
    assert (res.finish_reason, len(reqs)) == ("turn_budget", 3)
    res, reqs = episode(
        [bash("seq 1 400")],
        repeat_last=True,
        max_context_tokens=600,
        max_tokens_per_turn=256,
        min_tokens_per_turn=64,
    )
    assert res.finish_reason == "token_budget" and res.status == "ok"
    assert all(r["max_tokens"] >= 64 for r in reqs)  # never asks for a 1-token completion
    # a per-turn cap below the minimum is not a budget exhaustion: the cap itself is the minimum
    res, reqs = episode([SUBMIT], max_tokens_per_turn=24, min_tokens_per_turn=32)
    assert (res.finish_reason, reqs[0]["max_tokens"]) == ("submitted", 24)


def test_wall_time_limit_is_timeout(episode):
    res, _ = episode([{"sleep": 3, **bash("echo a")}], wall_s=0.8)
    assert (res.status, res.finish_reason) == ("timeout", "wall_time")


def test_model_endpoint_errors(episode):
    res, _ = episode([{"status": 500, "error": "engine crashed"}])
    assert (res.status, res.finish_reason) == ("infra_error", "model_error") and "engine crashed" in res.error
    res, _ = episode([{"status": 400, "error": "bad request"}])
    assert res.status == "failed"
    res, reqs = episode([{"status": 429, "error": "paused for weight sync"}, SUBMIT], http_retries=2)
    assert res.finish_reason == "submitted" and len(reqs) == 2


def test_editor_cannot_escape_workspace(episode, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    os.symlink("/etc", ws / "etc_link")
    res, reqs = episode(
        [
            {"tool": "str_replace_editor", "arguments": {"command": "view", "path": "../outside.txt"}},
            {"tool": "str_replace_editor", "arguments": {"command": "view", "path": "etc_link/hostname"}},
            {
                "tool": "str_replace_editor",
                "arguments": {"command": "create", "path": "/tmp/x", "file_text": "x"},
            },
            SUBMIT,
        ],
        runtime=LocalSubprocessRuntime(ws),
    )
    for i in (1, 2, 3):
        assert "outside the workspace" in reqs[i]["messages"][-1]["content"]


def test_config_from_spec_rejects_unknown_options():
    cfg = ReActConfig.from_spec(
        ["bash", "submit"], {"turns": 7, "tokens": 2048, "wall_s": 30}, {"context": "trim_oldest"}
    )
    assert (cfg.max_turns, cfg.max_context_tokens, cfg.wall_s, cfg.context) == (7, 2048, 30.0, "trim_oldest")
    with pytest.raises(ValueError, match="on_no_tool_cal"):
        ReActConfig.from_spec(["bash"], {}, {"on_no_tool_cal": "nudge"})
    with pytest.raises(
        ValueError, match="harness option on_no_tool_call must be one of nudge, fail_turn, end, got .ignore."
    ):
        ReActConfig.from_spec(["bash"], {}, {"on_no_tool_call": "ignore"})
    with pytest.raises(ValueError, match="unknown tool"):
        ReActConfig.from_spec(["bash", "browser"], {}, {})
