"""Every environment hosts every harness (rollout/fit.py): one rollout of each environment x harness through
the generate stage — the real gateway, the real CLIs, real bubblewrap sandboxes — driven by a scripted engine
(tests/support/claude_code.py: not a model) that does the task right as that harness does it, then the verify
stage. The reward is the environment's own for that work (1.0: a fix resolved, the kernel's gold solution, an
answer that meets the request). A pairing that cannot run is refused before any rollout, in one line naming
what to run instead. docs/environments.md shows this matrix."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from components.sft.demos import Demonstration, ScriptedEngineServer
from harnessrl.environments.kernel.tasks import TASKS_DIR
from harnessrl.io import read_jsonl
from harnessrl.rollout.fit import Unfit
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox.host_tools import TOOLS_MOUNT
from harnessrl.taskset import TaskSet, write_taskset
from harnessrl.tinymodel import tiny_model_dir
from harnessrl.verify.rollouts import run_verify
from tests.environments.test_environments import CITY, CITY_ANSWER
from tests.support.claude_code import CliScriptEngine, call, requires_claude_code
from tests.support.cli_agents import one_line_change
from tests.support.codex import requires_codex
from tests.support.fixtures import requires_bwrap

pytestmark = [requires_bwrap, pytest.mark.slow]

ENVIRONMENTS = ("swe", "kernel", "instruction", "search", "procedural")
HARNESSES = ("chat", "react", "mini-swe-agent", "claude-code", "codex")
REFUSED = {  # (environment, harness) -> the one line that says why
    ("swe", "chat"): r"graded on what the agent leaves in its workspace, and chat only replies: use react",
    ("kernel", "chat"): r"graded on what the agent leaves in its workspace, and chat only replies: use react",
}
SPECS = {  # harness -> its spec in the answer-graded environments (tools that can answer)
    "chat": {"harness": "chat", "limits": {"tokens": 64}},
    "react": {"harness": "react", "tools": ["bash", "answer"], "limits": {"turns": 4}},
    "mini-swe-agent": {"harness": "mini-swe-agent", "limits": {"turns": 4}},
    "claude-code": {"harness": "claude-code", "options": {"bare": True, "tools": ["Bash", "Read", "Edit"]}},
    "codex": {"harness": "codex", "options": {"model": "gpt-5.1-codex-max"}},
}
WORKSPACE_SPECS = {**SPECS, "react": {"harness": "react", "limits": {"turns": 4}}}  # bash, edit, submit
SEARCH_REACT = {"harness": "react", "tools": ["search", "read", "answer"], "limits": {"turns": 4}}


@dataclass(frozen=True)
class Cell:
    """A task set of one task and what doing it right is: a shell command that changes the workspace (workspace-
    graded environments) or the answer to give (answer-graded ones)."""

    taskset: Path
    task: dict
    command: str = ""
    answer: str = ""


def mswea(command: str) -> str:
    return f"THOUGHT: next step.\n\n```mswea_bash_command\n{command}\n```"


def script(harness: str, cell: Cell, environment: str) -> tuple[str, ...]:
    """The replies of an agent that does the task right through `harness`."""
    if cell.command:  # change the workspace, then finish
        return {
            "chat": ("I cannot change files.",),
            "react": (call("bash", command=cell.command), call("submit")),
            "mini-swe-agent": (mswea(cell.command), mswea("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")),
            "claude-code": (call("Bash", command=cell.command, description="Do the task"), "Done."),
            "codex": (call("exec_command", cmd=cell.command), "Done."),
        }[harness]
    look = "cat TASK.md"  # the scratch workspace holds the task
    if environment == "search":  # the corpus: react's own tool, a command in the sandbox for the rest
        look = f"{TOOLS_MOUNT}/search {shlex.quote(cell.task['question'])}"
    submit = f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat <<'EOF'\n{cell.answer}\nEOF"
    react_look = (
        call("search", query=cell.task["question"]) if environment == "search" else call("bash", command=look)
    )
    return {
        "chat": (cell.answer,),
        "react": (react_look, call("answer", answer=cell.answer)),
        "mini-swe-agent": (mswea(look), mswea(submit)),
        "claude-code": (
            call("Bash", command=look, description="Look"),
            cell.answer,
        ),
        "codex": (call("exec_command", cmd=look), cell.answer),
    }[harness]


@pytest.fixture(scope="module")
def cells(synth_taskset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Cell]:
    from harnessrl.cli import main

    root = tmp_path_factory.mktemp("matrix")
    swe = next(r for r in TaskSet.open(synth_taskset).rows() if one_line_change(r["patch"]))
    path, fixed, bug = one_line_change(swe["patch"]) or ("", "", "")  # the bug patch's "+" line is the bug
    fix = f"import pathlib; p = pathlib.Path({path!r}); p.write_text(p.read_text().replace({bug!r}, {fixed!r}, 1))"
    swe_set = write_taskset(
        root / "swe", [swe], {swe["repo"]: TaskSet.open(synth_taskset).bundle(swe["repo"])}, "m"
    ).root
    assert (
        main(["tasks", "kernel", "--out", str(root / "kernel"), "--names", "prefix_sum", "--timing", "quick"])
        == 0
    )
    gold = (TASKS_DIR / "prefix_sum" / "gold.py").read_text()
    assert main(["tasks", "search", "--out", str(root / "search"), "--n", "1"]) == 0
    assert main(["tasks", "procedural", "--out", str(root / "procedural"), "--n", "1"]) == 0
    write_taskset(root / "instruction", [CITY], {}, "matrix")
    search, procedural = (TaskSet.open(root / n).rows()[0] for n in ("search", "procedural"))
    return {
        "swe": Cell(swe_set, swe, command=f"python3 -c {json.dumps(fix)}"),
        "kernel": Cell(
            root / "kernel",
            TaskSet.open(root / "kernel").rows()[0],
            command=f"cat > solution.py <<'EOF'\n{gold}EOF",
        ),
        "instruction": Cell(root / "instruction", CITY, answer=CITY_ANSWER),
        "search": Cell(root / "search", search, answer=search["answers"][0]),
        "procedural": Cell(root / "procedural", procedural, answer=str(procedural["answer"])),
    }


CLI_MARKS = {"claude-code": requires_claude_code, "codex": requires_codex}


@pytest.mark.parametrize(
    ("environment", "harness"),
    [
        pytest.param(e, h, id=f"{e}-{h}", marks=[CLI_MARKS[h]] if h in CLI_MARKS else [])
        for e in ENVIRONMENTS
        for h in HARNESSES
    ],
)
def test_one_rollout_of_every_environment_through_every_harness(
    environment: str, harness: str, cells: dict[str, Cell], tokenizer, tmp_path: Path
) -> None:
    cell = cells[environment]
    raw = (WORKSPACE_SPECS if cell.command else SPECS)[harness]
    if (environment, harness) == ("search", "react"):
        raw = SEARCH_REACT
    specs = parse_specs({**raw, "limits": {**raw.get("limits", {}), "wall_s": 180}})
    demo = Demonstration(
        cell.task["instance_id"], cell.task["problem_statement"], script(harness, cell, environment)
    )
    engine = CliScriptEngine([demo], tokenizer, tiny_model_dir())
    with ScriptedEngineServer(engine) as url:
        generate = lambda: run_generate(  # noqa: E731
            cell.taskset, tmp_path / "gen", specs, ModelSource(engine_url=url), GenerateConfig(group_size=1)
        )
        if (environment, harness) in REFUSED:
            with pytest.raises(Unfit, match=REFUSED[environment, harness]):
                generate()
            assert not (tmp_path / "gen" / "rollouts.jsonl").exists()  # refused before any rollout
            return
        generate()
    [rollout] = read_jsonl(tmp_path / "gen" / "rollouts.jsonl")
    assert (rollout["environment"], rollout["harness"], rollout["rollout_status"]) == (
        environment,
        harness,
        "ok",
    ), rollout
    if environment == "search" and harness != "chat":  # the corpus answered, and the agent saw it
        records = pq.read_table(tmp_path / "gen" / "records.parquet").to_pylist()
        last = max(records, key=lambda r: r["started_at"])
        assert f"[{cell.task['doc_id']}]" in tokenizer.decode(last["prompt_ids"])
    run_verify(cell.taskset, tmp_path / "gen", tmp_path / "verified")
    [verdict] = read_jsonl(tmp_path / "verified" / "rewards.jsonl")
    assert (verdict["status"], verdict["reward"]) == ("ok", 1.0), (verdict, rollout)
