"""What is Codex's own in how its episode ends (tests/harness/test_cli_episode.py has what every CLI shares): its
arguments, environment, bridge and socket, the model-call budget the bridge keeps, its failed turns' endings,
its settings as TOML, its specs. The CLI here is a stand-in script at the pinned install's place (no npm needed)
behind the real loopback bridge; tests/harness/test_codex.py runs the real one."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.codex import BRIDGE_PORT, CodexConfig, classify, http_status, model_calls, toml_value
from harnessrl.rollout.specs import load_specs, parse_specs
from harnessrl.schema import RolloutStatus
from tests.support.cli_agents import TASK, StandIn
from tests.support.fixtures import requires_bwrap

COMPLETED = json.dumps({"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 3}})


def failed_line(message: str) -> str:
    return json.dumps({"type": "turn.failed", "error": {"message": message}})


@pytest.fixture
def cli(tmp_path, monkeypatch):
    with contextlib.closing(StandIn(CodexConfig, tmp_path, monkeypatch)) as cli:
        yield cli


# a stand-in that posts to the bridge, as Codex does (its provider's base URL is the bridge's port)
POST = (
    'python3 -c "import sys, urllib.request as u\n'
    "for i in range(int(sys.argv[1])):\n"
    "    try: u.urlopen(u.Request(sys.argv[2] + '/responses', b'{}', method='POST'), timeout=5)\n"
    '    except Exception as e: print(type(e).__name__, file=sys.stderr)\n" '
)


@requires_bwrap
def test_the_cli_sees_its_task_arguments_and_the_bridge(cli):
    script = (
        "import json, os, socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {BRIDGE_PORT}), 3); bridge = True\n"
        "except OSError:\n"
        "    bridge = False\n"
        "print(json.dumps({'type': 'probe', 'stdin': sys.argv[1], 'args': sys.argv[2:], 'bridge': bridge,\n"
        "    'key': os.environ.get('HARNESSRL_API_KEY'), 'home': os.environ.get('CODEX_HOME'),\n"
        "    'dir': os.path.isdir(os.environ.get('CODEX_HOME', '')),\n"
        "    'sock': os.path.exists('/run/harnessrl/gateway.sock')}))\n"
    )
    cli.install(f'T=$(cat); python3 -c "{script}" "$T" "$@"; echo \'{COMPLETED}\'')
    res = cli.run(
        max_turns=7, model="m1", developer_instructions="Be brief.", config={"model_reasoning_effort": "low"}
    )
    assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
    [probe] = [e for e in res.transcript if e.get("type") == "probe"]
    assert probe["stdin"] == TASK.problem_statement and probe["key"] == "key"
    assert (probe["home"], probe["dir"], probe["bridge"], probe["sock"]) == ("/tmp/.codex", True, True, True)
    args = " ".join(probe["args"])
    for part in (
        "exec --json",
        "--ephemeral",
        "--dangerously-bypass-approvals-and-sandbox",
        "-m m1",
        "--strict-config",
    ):
        assert part in args
    provider = f'base_url = "http://127.0.0.1:{BRIDGE_PORT}/sessions/s-1/v1"'
    for part in (provider, 'wire_api = "responses"', 'web_search="disabled"', "analytics.enabled=false"):
        assert part in args, args
    for part in (
        "--disable multi_agent",
        'developer_instructions="Be brief."',
        'model_reasoning_effort="low"',
    ):
        assert part in args
    assert res.turns == 0  # it made no model call


@requires_bwrap
def test_the_model_call_budget_ends_the_run_before_the_next_call(cli):
    """max_turns=2: the bridge passes two model calls (the gateway is not there: they fail) and holds the third,
    stops the CLI and says so; the rollout ends ok / turn_budget with 2 turns."""
    cli.install(POST + f"5 http://127.0.0.1:{BRIDGE_PORT}/sessions/s-1/v1; sleep 60")
    t0 = time.monotonic()
    res = cli.run(max_turns=2)
    assert time.monotonic() - t0 < 30
    assert (res.status, res.finish_reason, res.turns) == (RolloutStatus.OK, EpisodeEnd.TURN_BUDGET, 2), (
        res.error
    )


@requires_bwrap
def test_an_endpoint_the_gateway_does_not_serve_is_an_infra_error(cli):
    """What the real CLI prints for a 404 (tests/harness/test_codex.py gets it from the real gateway)."""
    message = (
        "unexpected status 404 Not Found: POST /sessions/s-1/x/v1/responses: Not Found, url: http://127.0.0.1"
    )
    cli.install(f"echo '{failed_line(message)}'; exit 1")
    res = cli.run()
    assert (res.status, res.finish_reason) == (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR)
    assert res.error.startswith("the gateway does not serve what the CLI asked for (HTTP 404)")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "Codex ran out of room in the model's context window. Start a new thread or clear earlier history",
            (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET),
        ),
        (
            "Incomplete response returned, reason: max_output_tokens",
            (RolloutStatus.OK, EpisodeEnd.TOKEN_BUDGET),
        ),
        (
            "stream disconnected before completion: error sending request",
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            "unexpected status 429 Too Many Requests: paused",
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            "unexpected status 502 Bad Gateway: inference engine failed",
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
        (
            '{"type": "error", "error": {"type": "invalid_request_error", "message": "input[0]: bad"}}',
            (RolloutStatus.FAILED, EpisodeEnd.MODEL_ERROR),
        ),
        (
            "unexpected status 405 Method Not Allowed: GET",
            (RolloutStatus.INFRA_ERROR, EpisodeEnd.MODEL_ERROR),
        ),
    ],
)
def test_the_failed_turn_names_the_cause(message, expected):
    events = [{"type": "turn.started"}, {"type": "turn.failed", "error": {"message": message}}]
    assert classify("ok", 1, "", "", events)[:2] == expected


def test_the_budget_and_a_bridge_that_cannot_start_come_before_the_events():
    no_python = classify("ok", 127, "", "/bin/sh: 1: exec: python3: not found", [])
    assert (
        no_python[:2] == (RolloutStatus.INFRA_ERROR, EpisodeEnd.SANDBOX_ERROR) and "python3" in no_python[2]
    )
    from harnessrl.sandbox.loopback_bridge import BUDGET_MARK

    assert classify("ok", 0, "", BUDGET_MARK, [])[:2] == (RolloutStatus.OK, EpisodeEnd.TURN_BUDGET)
    assert http_status("no status here") is None and http_status("unexpected status 404 Not Found: x") == 404


def test_the_bridges_count_is_read_after_a_line_the_cli_left_unfinished():
    """The CLI's processes share the bridge's stderr; a line of theirs cut short must not hide the count (it did:
    CI read 0 turns where the bridge had counted 2)."""
    from harnessrl.sandbox.loopback_bridge import BUDGET_MARK, COUNT_MARK

    stderr = f"RemoteDisconnected\nRemoteDisc{COUNT_MARK} 2\nonnected\n{BUDGET_MARK}\n"
    assert model_calls(stderr) == 2 and model_calls("RemoteDisconnected\n") is None


def test_settings_are_written_as_toml():
    assert toml_value({"a": [1, "x", True]}) == '{"a" = [1, "x", true]}'
    assert toml_value('say "hi"') == '"say \\"hi\\""'


def test_specs_name_codexs_settings_and_where_it_can_run():
    [spec] = load_specs(
        '[{"harness": "codex", "limits": {"turns": 12}, "options": {"model": "gpt-5.1-codex-max"}}]'
    )
    assert (spec.spec.harness, spec.spec.limits["turns"], spec.spec.options) == (
        "codex",
        12,
        {"model": "gpt-5.1-codex-max"},
    )
    with pytest.raises(ValueError, match=r"\[0\]\.sandbox: harness codex runs inside the sandbox"):
        parse_specs([{"harness": "codex", "sandbox": "local"}])
    with pytest.raises(ValueError, match=r"unknown codex harness option\(s\) \['turns'\]"):
        parse_specs([{"harness": "codex", "options": {"turns": 3}}])
    with pytest.raises(ValueError, match="set by the harness"):
        parse_specs([{"harness": "codex", "options": {"config": {"model_providers.x.base_url": "http://x"}}}])
    with pytest.raises(ValueError, match="set by the harness"):
        parse_specs([{"harness": "codex", "options": {"env": {"CODEX_HOME": "/root"}}}])
    with pytest.raises(ValueError, match="cannot write"):
        parse_specs([{"harness": "codex", "options": {"config": {"x": None}}}])
    with pytest.raises(ValueError, match="base_instructions: expected text"):
        parse_specs([{"harness": "codex", "options": {"base_instructions": ["a"]}}])
    with pytest.raises(ValueError, match="set by the harness"):
        parse_specs([{"harness": "codex", "options": {"env": {"HARNESSRL_BASE_INSTRUCTIONS": "x"}}}])
