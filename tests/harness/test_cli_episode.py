"""How a CLI agent's episode that goes wrong ends, alike for every CLI harness (harnessrl/harness/cli_episode.py):
a CLI that exits non-zero, hangs or floods its output in the real bubblewrap sandbox, a CLI not installed, a
runtime that cannot host an agent. The CLI is a stand-in script at the pinned install's place (no npm;
tests/support/cli_agents.py); tests/harness/test_claude_code_failures.py and test_codex_failures.py have what
differs per CLI. Every ending has a status that names the cause, infra or agent: never a silent 0, never a hung
worker."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from harnessrl.harness import claude_code, codex
from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.cli_agents import PINNED
from harnessrl.harness.cli_episode import CliHarness
from harnessrl.harness.runtime import LocalSubprocessRuntime
from harnessrl.schema import RolloutStatus
from tests.support.cli_agents import ENDPOINT, TASK, StandIn
from tests.support.fixtures import requires_bwrap

# per CLI: the line its episode ends with (Claude Code's says it took 7 turns), the turns counted after a flood
# cut the middle of its output (the CLI's own count; Codex's: the bridge's), what a CLI without that line lacks
ENDINGS = {
    "claude-code": (
        json.dumps(
            {"type": "result", "subtype": "success", "is_error": False, "result": "done", "num_turns": 7}
        ),
        7,
        "a result event",
    ),
    "codex": (json.dumps({"type": "turn.completed", "usage": {"output_tokens": 3}}), 0, "finishing its turn"),
}


@pytest.fixture(params=[claude_code.ClaudeCodeConfig, codex.CodexConfig], ids=lambda c: c.tool)
def cli(request, tmp_path, monkeypatch):
    with contextlib.closing(StandIn(request.param, tmp_path, monkeypatch)) as cli:
        yield cli


@requires_bwrap
def test_a_cli_that_exits_nonzero_without_finishing_fails_the_rollout(cli):
    cli.install('echo "boom: cannot start" >&2; exit 3')
    res = cli.run()
    assert (res.status, res.finish_reason) == (RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR)
    assert res.error == f"the CLI exited 3 without {ENDINGS[cli.config.tool][2]}: boom: cannot start"


@requires_bwrap
def test_a_cli_that_hangs_is_killed_at_the_wall_clock(cli):
    cli.install("sleep 600 & sleep 600")
    t0 = time.monotonic()
    res = cli.run(wall_s=3.0)
    assert time.monotonic() - t0 < 20
    assert (res.status, res.finish_reason) == (RolloutStatus.TIMEOUT, EpisodeEnd.WALL_TIME)
    assert "wall-clock" in res.error


@requires_bwrap
@pytest.mark.parametrize("finished", [True, False])
def test_a_flood_of_output_is_capped(cli, finished):
    """60 MB of output: the harness keeps a capped head and tail; the closing event is in the tail."""
    last, turns, without = ENDINGS[cli.config.tool]
    cli.install("head -c 60000000 /dev/zero | tr '\\0' x; echo" + (f"; echo '{last}'" if finished else ""))
    res = cli.run()
    if finished:
        assert (res.status, res.finish_reason, res.turns) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED, turns)
    else:
        assert (res.status, res.finish_reason) == (RolloutStatus.FAILED, EpisodeEnd.HARNESS_ERROR)
        assert f"without {without}" in res.error
    assert len(json.dumps(res.transcript)) < 1 << 20


@requires_bwrap
def test_without_the_cli_installed_the_rollout_is_an_infra_error(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "empty"))
    res = cli.run()
    assert (res.status, res.finish_reason) == (RolloutStatus.INFRA_ERROR, EpisodeEnd.SETUP_ERROR)
    tool = cli.config.tool
    assert f"{tool} {PINNED[tool][1]} is not installed" in res.error and "run `make cli-agents`" in res.error


def test_it_runs_only_inside_a_sandbox_that_can_host_an_agent(cli, tmp_path):
    res = CliHarness(cli.config()).run(TASK, ENDPOINT, LocalSubprocessRuntime(tmp_path))
    assert (res.status, res.finish_reason) == (RolloutStatus.INFRA_ERROR, EpisodeEnd.SETUP_ERROR)
    assert "(bubblewrap, podman, kubernetes); LocalSubprocessRuntime cannot" in res.error


def test_sandbox_outcomes_come_first():
    for classify in (claude_code.classify, codex.classify):
        assert classify("sandbox_error", None, "bwrap: no", "", [])[:2] == (
            RolloutStatus.INFRA_ERROR,
            EpisodeEnd.SANDBOX_ERROR,
        )
        assert classify("resource_limit", None, "memory limit", "", [])[:2] == (
            RolloutStatus.FAILED,
            EpisodeEnd.HARNESS_ERROR,
        )
