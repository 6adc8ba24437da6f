"""SWE-bench-format tasks (tests/fixtures/swebench, parse 1.22.4) run and grade like SWE-bench: the agent starts
from base_commit and never sees test_patch (not in its files, not in its git objects, not in the task set's
bundle); verify applies test_patch at grading time; the gold patch resolves, an empty patch does not."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from dataprep.load import import_taskset
from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox.workspace import materialize
from harnessrl.taskset import TaskLayout, TaskSet, task_layout
from harnessrl.verify.grading import PytestOutcome, VerifyStatus
from harnessrl.verify.rollouts import run_verify
from harnessrl.verify.verifier import verify_patch
from tests.support.fixtures import SWEBENCH_EXAMPLE, requires_bwrap
from tests.support.patches import NO_FIX

MIRROR = SWEBENCH_EXAMPLE / "mirrors" / "harnessrl-examples__parse.bundle"


def first_row() -> dict:
    return next(iter(read_jsonl(SWEBENCH_EXAMPLE / "rows.jsonl")))


def one_line_fix(patch: str) -> tuple[str, str, str]:
    """(path, buggy line, fixed line) of a fix that changes exactly one line."""
    lines = patch.splitlines()
    path = next(line[len("+++ b/") :] for line in lines if line.startswith("+++ b/"))
    minus = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    plus = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    assert len(minus) == len(plus) == 1
    return path, minus[0].strip(), plus[0].strip()


def secrets(row: dict) -> list[str]:
    """What the agent must not see: the new test functions and the fixed line."""
    new_tests = re.findall(r"^\+def (test_\w+)", row["test_patch"], flags=re.M)
    assert new_tests
    return [f"def {t}(" for t in new_tests] + [one_line_fix(row["patch"])[2]]


def all_objects(git_dir: Path) -> str:
    out = subprocess.run(
        ["git", "--git-dir", str(git_dir), "cat-file", "--batch-all-objects", "--batch"],
        capture_output=True,
        check=True,
    ).stdout
    return out.decode("utf-8", errors="replace")


def tool_call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_the_agent_never_sees_test_patch_or_the_fix(tmp_path):
    row = first_row()
    data = tmp_path / "rows.jsonl"
    write_jsonl(data, [row])
    ts = import_taskset(data, SWEBENCH_EXAMPLE / "mirrors", tmp_path / "tasks", layout=TaskLayout.SWEBENCH)
    [task] = ts.rows()
    assert task_layout(task) is TaskLayout.SWEBENCH
    hidden = secrets(row)

    upstream = tmp_path / "upstream.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(MIRROR), str(upstream)], check=True)
    assert all(s in all_objects(upstream) for s in hidden)  # control: the upstream history holds them

    imported = tmp_path / "imported.git"
    subprocess.run(
        ["git", "clone", "-q", "--mirror", str(ts.bundle(task["repo"])), str(imported)], check=True
    )
    assert not [s for s in hidden if s in all_objects(imported)]

    ws = materialize(ts, task["instance_id"], tmp_path / "ws")
    files = "\n".join(
        p.read_text(errors="replace") for p in ws.rglob("*") if p.is_file() and ".git" not in p.parts
    )
    assert "class int_convert" in files  # the source is there...
    assert not [s for s in hidden if s in files]  # ...but not the new tests, nor the fix
    assert not [s for s in hidden if s in all_objects(ws / ".git")]


def test_gold_patch_resolves_and_a_patch_that_fixes_nothing_does_not(swebench_taskset):
    ts = TaskSet.open(swebench_taskset)
    row = ts.rows()[0]
    gold = verify_patch(ts, row, row["patch"], timeout_s=120)
    assert (gold.status, gold.reward, gold.f2p_fraction) == (VerifyStatus.RESOLVED, 1.0, 1.0), gold.detail
    assert all(t["outcome"] is PytestOutcome.PASSED for t in gold.tests.values())
    unfixed = verify_patch(ts, row, NO_FIX, timeout_s=120)
    assert (unfixed.status, unfixed.reward) == (VerifyStatus.UNRESOLVED, 0.0)
    # the F2P tests exist only in test_patch: they ran (and failed), so verify applied it
    assert {unfixed.tests[t]["outcome"] for t in row["FAIL_TO_PASS"]} == {PytestOutcome.FAILED}
    assert all(unfixed.tests[t]["ok"] for t in row["PASS_TO_PASS"])


def test_a_crash_is_judged_against_base_plus_test_patch(swebench_taskset, tmp_path):
    """The witness for an abnormal run is base_commit + test_patch: it completes, so the patch caused the crash."""
    from harnessrl.verify.verifier import verify_workspace

    ts = TaskSet.open(swebench_taskset)
    row = ts.rows()[2]
    ws = materialize(ts, row["instance_id"], tmp_path / "ws")
    module = ws / "parse" / "__init__.py"
    module.write_text(module.read_text() + "\nimport os\n\nos._exit(0)\n")  # at import: no summary
    r = verify_workspace(ts, row, ws, timeout_s=120)
    assert (r.status, r.reward) == (VerifyStatus.UNRESOLVED, 0.0), r.detail
    assert "the unpatched tree's run completes" in r.detail


def test_harnessrl_verify_cli_grades_a_swebench_task(swebench_taskset, tmp_path, capsys):
    """Before: the CLI demanded a SWE-smith bug commit (<id>~1) and refused every SWE-bench task."""
    from harnessrl.cli import main

    row = TaskSet.open(swebench_taskset).rows()[1]
    fix = tmp_path / "fix.diff"
    fix.write_text(row["patch"])
    rc = main(
        ["verify", "--tasks", str(swebench_taskset), "--instance", row["instance_id"], "--patch", str(fix)]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["status"] == "resolved"


@requires_bwrap
def test_a_rollout_on_a_swebench_task_runs_and_is_graded(swebench_taskset, fast_engine, tokenizer, tmp_path):
    ts = TaskSet.open(swebench_taskset)
    row = ts.rows()[0]
    path, buggy, fixed = one_line_fix(row["patch"])
    new_test = re.findall(r"^\+def (test_\w+)", row["test_patch"], flags=re.M)[0]
    look = f"grep -rn 'def {new_test}(' . ; echo GREP=$?; git log --all --oneline | wc -l"
    replies = [
        {"text": tool_call("bash", command=look)},
        {
            "text": tool_call(
                "str_replace_editor", command="str_replace", path=path, old_str=buggy, new_str=fixed
            )
        },
        {"text": tool_call("submit")},
    ]
    engine = fast_engine(replies)
    specs = parse_specs(
        [{"name": "react", "harness": "react", "sandbox": "bubblewrap", "limits": {"turns": 5}}]
    )
    out = tmp_path / "gen"
    run_generate(
        swebench_taskset,
        out,
        specs,
        ModelSource(engine_url=engine.base_url),
        GenerateConfig(group_size=1, concurrency=1, instance_ids=[row["instance_id"]]),
    )
    [rollout] = list(read_jsonl(out / "rollouts.jsonl"))
    assert rollout["rollout_status"] == "ok" and rollout["finish_reason"] == "submitted"
    transcript = json.loads((out / "transcripts" / f"{rollout['rollout_id']}.json").read_text())
    seen = next(m["content"] for m in transcript if m["role"] == "tool")
    assert "GREP=1" in seen and f"def {new_test}(" not in seen  # the new tests are not in the workspace
    assert "GREP=1\n1\n" in seen  # one commit: no history
    summary = run_verify(swebench_taskset, out, tmp_path / "verified", workers=1)
    [reward] = list(read_jsonl(tmp_path / "verified" / "rewards.jsonl"))
    assert summary["resolved"] == 1 and reward["reward"] == 1.0 and reward["verify_status"] == "resolved"
