"""What is Claude Code's own in how its episode ends (tests/harness/test_cli_episode.py has what every CLI
shares): the arguments, environment and socket it gets, its address space, its `result` event's endings, its
specs. The CLI here is a stand-in script at the pinned install's place (no npm needed);
tests/harness/test_claude_code.py runs the real one."""

from __future__ import annotations

import contextlib
import json

import pytest

from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.claude_code import ClaudeCodeConfig, classify
from harnessrl.harness.cli_agents import CLAUDE_CODE
from harnessrl.harness.cli_episode import parse_events
from harnessrl.rollout.specs import load_specs, parse_specs
from harnessrl.schema import RolloutStatus
from tests.support.cli_agents import TASK, StandIn
from tests.support.fixtures import requires_bwrap


def result_line(**fields) -> str:
    return json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "done", **fields})


@pytest.fixture
def cli(tmp_path, monkeypatch):
    with contextlib.closing(StandIn(ClaudeCodeConfig, tmp_path, monkeypatch)) as cli:
        yield cli


@requires_bwrap
def test_the_cli_sees_its_task_arguments_and_the_gateway_socket(cli):
    cli.install(
        'echo "{\\"type\\": \\"probe\\", \\"stdin\\": \\"$(cat)\\", \\"args\\": \\"$*\\", '
        '\\"socket\\": \\"$ANTHROPIC_UNIX_SOCKET\\", \\"base\\": \\"$ANTHROPIC_BASE_URL\\", '
        '\\"traffic\\": \\"$CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC\\", \\"home\\": \\"$HOME\\", '
        '\\"sock_ok\\": \\"$(test -S /run/harnessrl/gateway.sock && echo yes)\\"}"; '
        f"echo '{result_line()}'"
    )
    res = cli.run(
        max_turns=7, tools=["Bash", "Read"], append_system_prompt="Be brief.", models={"main": "m1"}
    )
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    [probe] = [e for e in res.transcript if e.get("type") == "probe"]
    assert probe["stdin"] == TASK.problem_statement and probe["sock_ok"] == "yes"
    assert (
        probe["socket"] == "/run/harnessrl/gateway.sock"
        and probe["base"] == "http://127.0.0.1:9/sessions/s-1"
    )
    assert probe["traffic"] == "1" and probe["home"] == "/tmp"
    for part in ("-p --output-format stream-json", "--max-turns 7", "--permission-mode bypassPermissions"):
        assert part in probe["args"]
    for part in ("--disallowedTools WebFetch,WebSearch", "--tools Bash,Read", "--model m1", "Be brief."):
        assert part in probe["args"]


@requires_bwrap
def test_without_cgroups_the_cli_gets_the_address_space_it_needs(cli, monkeypatch):
    """Memory limited by RLIMIT_AS (a host without cgroups): 2 GB crashes the CLI (Bun) at start, so its run
    gets CLI_ADDRESS_SPACE_MB; with a cgroup the spec's limit stands."""
    from harnessrl.harness.cli_episode import CLI_ADDRESS_SPACE_MB
    from harnessrl.sandbox import cgroups

    class NoCgroups:
        def available(self) -> bool:
            return False

        def sweep_stale(self) -> int:
            return 0

    cli.install(
        f'echo "{{\\"type\\": \\"probe\\", \\"as_kb\\": \\"$(ulimit -v)\\"}}"; echo \'{result_line()}\''
    )
    monkeypatch.setattr(cgroups, "factory", NoCgroups)
    res = cli.run()
    [probe] = [e for e in res.transcript if e.get("type") == "probe"]
    assert int(probe["as_kb"]) == CLI_ADDRESS_SPACE_MB << 10


def test_a_missing_install_says_how_to_get_it(tmp_path, monkeypatch):
    from harnessrl.harness.cli_agents import CliNotInstalled, require

    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "empty"))
    with pytest.raises(
        CliNotInstalled, match=r"claude-code 2\.1\.197 is not installed .*: run `make cli-agents`"
    ):
        require(CLAUDE_CODE)


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"subtype": "error_max_turns", "is_error": True}, (RolloutStatus.OK, EpisodeEnd.TURN_BUDGET)),
        (
            {"is_error": True, "api_error_status": 400, "result": "Prompt is too long · 9000 tokens > 8191"},
            (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET),
        ),
        (
            {"is_error": True, "result": "Autocompact is thrashing: ..."},
            (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET),
        ),
        (
            {
                "is_error": True,
                "result": "API Error: Claude's response exceeded the 64 output token maximum.",
            },
            (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET),
        ),
        (
            {"is_error": True, "api_error_status": 429, "result": "API Error: 429 paused"},
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            {"is_error": True, "api_error_status": 502, "result": "API Error: 502 engine failed"},
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            {"is_error": True, "api_error_status": 404, "result": "model not found"},
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            {"is_error": True, "api_error_status": 400, "result": "API Error: 400 messages[1]: bad"},
            (RolloutStatus.FAILED, EpisodeEnd.MODEL_ERROR),
        ),
        (
            {"is_error": True, "result": "API Error: Connection error."},
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            {"subtype": "error_during_execution", "is_error": True, "result": ""},
            (RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR),
        ),
    ],
)
def test_the_result_event_names_the_cause(result, expected):
    events = parse_events("not json\n" + result_line(**result) + "\n{cut")
    assert classify("ok", 0, "", "", events)[:2] == expected


def test_specs_name_claude_codes_settings_and_where_it_can_run():
    [spec] = load_specs('[{"harness": "claude-code", "limits": {"turns": 12}, "options": {"bare": true}}]')
    assert (spec.spec.harness, spec.spec.limits["turns"], spec.spec.options) == (
        "claude-code",
        12,
        {"bare": True},
    )
    with pytest.raises(ValueError, match=r"\[0\]\.sandbox: harness claude-code runs inside the sandbox"):
        parse_specs([{"harness": "claude-code", "sandbox": "local"}])
    for where in ("podman", "kubernetes"):
        assert parse_specs([{"harness": "claude-code", "sandbox": where}])[0].spec.sandbox == where
    with pytest.raises(ValueError, match=r"unknown claude-code harness option\(s\) \['turns'\]"):
        parse_specs([{"harness": "claude-code", "options": {"turns": 3}}])
    with pytest.raises(ValueError, match="option models"):
        parse_specs([{"harness": "claude-code", "options": {"models": {"huge": "x"}}}])
    with pytest.raises(ValueError, match="set by the harness"):
        parse_specs([{"harness": "claude-code", "options": {"env": {"ANTHROPIC_BASE_URL": "http://x"}}}])
    with pytest.raises(ValueError, match="--specs: not valid JSON"):
        load_specs("[{")
