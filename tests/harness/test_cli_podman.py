"""The real CLI agents (Claude Code, Codex: pinned, `make cli-agents`) inside the podman sandbox: a container of
the task's environment image (the build_environments stage's), the CLI's install prefix and the task bound
read-only, the gateway through a forwarded Unix socket and nothing else (`--network none`). The same scripted
fix / wrong edit as under bubblewrap (tests/support/cli_agents.py), and a probe of what the CLI's own tools
can reach from inside the container."""

from __future__ import annotations

import pytest

from components.sft.demos import Demonstration
from harnessrl.harness.base import EpisodeEnd
from harnessrl.harness.claude_code import ClaudeCodeConfig
from harnessrl.sandbox.base import Limits
from harnessrl.sandbox.podman import PodmanSandbox
from harnessrl.schema import RolloutStatus
from tests.harness.test_claude_code import SONNET
from tests.harness.test_claude_code import fix_script as claude_fix
from tests.sandbox.podman_fixtures import requires_podman
from tests.support import codex as codex_support
from tests.support.claude_code import call, requires_claude_code
from tests.support.cli_agents import cli_rollouts, generate_two_tasks
from tests.support.codex import requires_codex

pytestmark = [requires_podman, pytest.mark.slow]

CLIS = {
    "claude-code": (requires_claude_code, claude_fix, {"tools": ["Bash", "Read", "Edit"], "models": SONNET}),
    "codex": (requires_codex, codex_support.fix_script, {"model": "gpt-5.4"}),
}


@pytest.mark.parametrize("harness", [pytest.param(name, marks=mark) for name, (mark, _, _) in CLIS.items()])
def test_generate_stage_runs_the_cli_inside_podman(harness, env_taskset, tokenizer, tmp_path, capsys):
    """`harnessrl stage generate --specs '[{"harness": ..., "sandbox": "podman"}]'` on tasks whose rows name
    their environment image: the scripted fix is resolved (reward 1), the wrong edit is not (reward 0), the
    samples hold exactly the tokens the engine sampled (generate_two_tasks checks it all)."""
    _, script, options = CLIS[harness]
    _, rows, _, _ = generate_two_tasks(
        harness, script, options, env_taskset, tokenizer, tmp_path, capsys, sandboxes=("podman", "podman")
    )
    assert {r["sandbox"] for r in rows.values()} == {"podman"}


@requires_claude_code
def test_the_clis_tools_in_podman_see_neither_host_files_nor_the_network(podman_task, tokenizer, tmp_path):
    """Claude Code's Bash tool, run by the CLI inside the container: no host file, no /root, not the gateway's
    TCP port, not the internet; its uid is the sandbox's own, not root."""
    image = podman_task.row["image_name"]
    sandboxes: list[PodmanSandbox] = []

    def podman(workspace):
        sandboxes.append(PodmanSandbox(workspace, image, Limits()))
        return sandboxes[-1]

    with cli_rollouts(ClaudeCodeConfig, podman_task, tokenizer, tmp_path, make_sandbox=podman) as rollout:
        r, engine = rollout(())
        probe = r.escape_probe()
        engine.demos[0] = Demonstration(
            podman_task.iid,
            podman_task.row["problem_statement"],
            (call("Bash", command=probe, description="Probe the sandbox"), "Done probing."),
        )
        res = r.run(podman_task, {"tools": ["Bash"], "models": SONNET})
        assert (res.status, res.finish_reason) == (RolloutStatus.OK, EpisodeEnd.SUBMITTED), res.error
        out = next(
            str(b.get("content"))
            for e in res.transcript
            if e.get("type") == "user"
            for b in e["message"]["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )
        assert "HOST-ONLY" not in out and "No such file" in out
        uid = sandboxes[-1].user.split(":")[0]
        assert f"\n{uid}\n" in f"\n{out}\n" and uid != "0"
        assert out.count("rror") >= 2, out  # both connections refused
