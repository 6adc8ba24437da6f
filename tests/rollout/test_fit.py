"""The one rule for what fits (rollout/fit.py): each refusal is one line naming what to run instead, a run checks
every pairing before its first rollout, and the search environment's tools reach an agent in a bubblewrap
sandbox as commands over a socket that answers those tools and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.environments.base import HostTools
from harnessrl.environments.kernel.env import task_row as kernel_row
from harnessrl.environments.kernel.tasks import load_tasks
from harnessrl.environments.registry import get_environment
from harnessrl.harness.runtime import NoToolsRuntime
from harnessrl.rollout.fit import Room, Unfit, fit, host_commands
from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.sandbox.envs import bare_env
from harnessrl.sandbox.host_tools import TOOLS_MOUNT, HostToolSocket
from harnessrl.taskset import write_taskset
from tests.environments.test_environments import ROW as INSTRUCTION_ROW
from tests.support.fixtures import requires_bwrap

KERNEL_ROW = kernel_row(load_tasks()[0])
SEARCH_ROW = {
    "instance_id": "s-1",
    "environment": "search",
    "repo": "corpus/docs",
    "problem_statement": "Which license does package yarl use?",
    "question": "Which license does package yarl use?",
    "answers": ["Apache-2.0"],
    "doc_id": "yarl/card",
    "kind": "license",
}


def room(row: dict, spec: dict) -> Room:
    [named] = parse_specs(spec)
    return fit(get_environment(row["environment"]), row, named.spec, named.name)


@pytest.mark.parametrize(
    ("row", "spec", "expected"),
    [
        (INSTRUCTION_ROW, {"harness": "chat"}, Room.NONE),
        (INSTRUCTION_ROW, {"harness": "react", "tools": ["answer"]}, Room.NONE),
        (INSTRUCTION_ROW, {"harness": "react", "tools": ["bash", "answer"]}, Room.SCRATCH_WORKSPACE),
        (INSTRUCTION_ROW, {"harness": "claude-code"}, Room.SCRATCH_WORKSPACE),
        (SEARCH_ROW, {"harness": "react", "tools": ["search", "read", "answer"]}, Room.HOST_TOOLS),
        (SEARCH_ROW, {"harness": "codex"}, Room.SCRATCH_WORKSPACE),
        (SEARCH_ROW, {"harness": "mini-swe-agent"}, Room.SCRATCH_WORKSPACE),
        (KERNEL_ROW, {"harness": "codex"}, Room.TASK_WORKSPACE),
        (KERNEL_ROW, {"harness": "react"}, Room.TASK_WORKSPACE),
    ],
)
def test_each_harness_gets_the_room_it_needs(row: dict, spec: dict, expected: Room) -> None:
    assert room(row, spec) is expected


@pytest.mark.parametrize(
    ("row", "spec", "why"),
    [
        (
            KERNEL_ROW,
            {"harness": "chat"},
            r"\(kernel\).*chat only replies: use react with bash/edit, mini-swe",
        ),
        (
            KERNEL_ROW,
            {"harness": "react", "tools": ["submit"]},
            r"cannot change files \(tools \['submit'\]\)",
        ),
        (INSTRUCTION_ROW, {"harness": "react"}, r"its `answer` tool: add 'answer' to tools"),
        (
            INSTRUCTION_ROW,
            {"harness": "react", "tools": ["search", "answer"]},
            r"\['search'\] are the search",
        ),
        (
            SEARCH_ROW,
            {"harness": "codex", "sandbox": "podman"},
            r"runs the task's image_name, and it has none",
        ),
        (
            {**SEARCH_ROW, "image_name": "img"},
            {"harness": "codex", "sandbox": "podman"},
            r"commands over a socket bound in from this host, which bubblewrap takes and podman does not yet",
        ),
        (
            SEARCH_ROW,
            {"harness": "mini-swe-agent", "sandbox": "local"},
            r"which bubblewrap takes and local does not yet",
        ),
    ],
)
def test_a_pairing_that_cannot_run_is_one_line_saying_what_to_run(row: dict, spec: dict, why: str) -> None:
    with pytest.raises(Unfit, match=why) as e:
        room(row, spec)
    assert "\n" not in str(e.value) and f"task {row['instance_id']!r}" in str(e.value)


def test_what_a_spec_decides_alone_is_refused_when_it_is_read() -> None:
    with pytest.raises(ValueError, match=r"harness claude-code runs inside the sandbox.*not local"):
        parse_specs({"harness": "claude-code", "sandbox": "local"})
    with pytest.raises(
        ValueError, match=r"\['search'\] run on the host's corpus and \['bash'\] in a sandbox"
    ):
        parse_specs({"harness": "react", "tools": ["bash", "search", "answer"]})


def test_the_rl_loop_refuses_a_pairing_before_its_first_rollout(tmp_path: Path) -> None:
    """The second spec meets the kernel task only at sample 1: refused when the workload is made."""
    from harnessrl.rl.workloads import TaskSetWorkload

    write_taskset(tmp_path / "tasks", [KERNEL_ROW], {}, "fit")
    specs = parse_specs([{"harness": "react"}, {"name": "chatty", "harness": "chat"}])
    TaskSetWorkload(tmp_path / "tasks", specs[:1], group_size=2)
    with pytest.raises(Unfit, match=r"spec 'chatty' \(harness chat\)"):
        TaskSetWorkload(tmp_path / "tasks", specs, group_size=2)


class Corpus(NoToolsRuntime):  # a tools.CorpusRuntime
    def __init__(self, workspace: Path) -> None:
        super().__init__(workspace)
        self.queries: list[str] = []

    def search_corpus(self, query: str, k: int) -> str:
        self.queries.append(query)
        return f"1. [pkg/card] {query} ({k} hits at most)"

    def read_document(self, doc_id: str) -> str:
        return f"Error: no passage {doc_id!r}" if doc_id != "pkg/card" else "the passage"


@requires_bwrap
def test_host_tools_are_commands_in_the_sandbox_that_answer_those_tools_only(tmp_path: Path) -> None:
    runtime = Corpus(tmp_path)
    search = get_environment("search")
    assert isinstance(search, HostTools)
    tools = host_commands(search)
    assert sorted(tools) == ["read", "search"]  # `answer`: an agent with its own loop ends with its message
    server = HostToolSocket(runtime, tools)
    (tmp_path / "ws").mkdir()
    sandbox = BubblewrapSandbox(tmp_path / "ws", bare_env())
    try:
        sandbox.bind_read_only(server.dir, TOOLS_MOUNT)
        run = sandbox.run(
            f"{TOOLS_MOUNT}/search which license; {TOOLS_MOUNT}/read pkg/card; {TOOLS_MOUNT}/read ../../etc/passwd;"
            f" ls {TOOLS_MOUNT}; python3 -c 'import harnessrl' 2>&1 | tail -1",
            timeout=60,
        )
        assert run.stdout.splitlines()[:4] == [
            "1. [pkg/card] which license (5 hits at most)",
            "the passage",
            "Error: no passage '../../etc/passwd'",
            "host.sock",
        ], run
        assert "No module named 'harnessrl'" in run.stdout  # nothing of the host's Python either
        assert runtime.queries == ["which license"]
        assert server.answer(json.dumps({"tool": "bash", "argv": ["id"]}).encode(), runtime).startswith(
            "Error: KeyError"
        )
        assert server.answer(b"not json", runtime).startswith("Error: JSONDecodeError")
    finally:
        sandbox.close()
        server.close()
    assert not server.dir.exists()
