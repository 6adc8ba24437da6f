"""The evaluate stage through its CLI: two policies served by real loopback engines (the gateway tests' fast
engine, replying from a script: one fixes a task, one submits at once), real bubblewrap sandboxes, real
verify; then `--compare` on saved evaluations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.cli import main
from harnessrl.evaluate.results import SCHEMA, EvalMode, score_run
from harnessrl.io import read_jsonl
from harnessrl.taskset import TaskSet
from tests.rollout.test_generate import pick_task, single_line_fix, tool_call
from tests.support.fixtures import requires_bwrap


@requires_bwrap
@pytest.mark.slow  # ~15 s CPU, ~60 s wall on the shared machine (12 rollouts, 12 verifications)
def test_evaluate_two_policies_greedy_and_sampled_then_compare(synth_taskset, fast_engine, tmp_path, capsys):
    row = pick_task(synth_taskset)
    other = next(r for r in TaskSet.open(synth_taskset).rows() if r["patch"] != row["patch"])
    path, buggy, fixed = single_line_fix(row)
    fixer = fast_engine(
        [
            {
                "text": tool_call(
                    "str_replace_editor", command="str_replace", path=path, old_str=buggy, new_str=fixed
                )
            },
            {"text": tool_call("submit")},
        ]
    )
    idle = fast_engine([{"text": tool_call("submit")}])
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"harness": "react", "limits": {"turns": 3}}))
    out = tmp_path / "eval"
    argv = ["stage", "evaluate", "--tasks", str(synth_taskset), "--out", str(out), "--specs", str(specs)]
    argv += ["--policy", f"idle={idle.base_url}", "--policy", f"fixer={fixer.base_url}", "--k", "2"]
    argv += [
        "--mode",
        "sampled",
        "--mode",
        "greedy",
        "--instance-ids",
        row["instance_id"],
        other["instance_id"],
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["fixer/sampled"]["pass_at_1"] == 0.5 and summary["idle/sampled"]["pass_at_1"] == 0.0
    assert "fixer - idle (sampled pass@1, 2 paired tasks): +0.500" in captured.err

    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["schema"] == SCHEMA
    by = {(r["policy"], r["mode"]): r for r in evaluation["results"]}
    assert set(by) == {("idle", "sampled"), ("idle", "greedy"), ("fixer", "sampled"), ("fixer", "greedy")}
    fs, fg = by["fixer", "sampled"], by["fixer", "greedy"]
    assert (fs["rollouts"], fs["graded"], fs["resolved"]) == (4, 4, 2)
    assert (fg["rollouts"], fg["graded"], fg["resolved"]) == (2, 2, 1)  # greedy: one rollout per task
    assert fs["resolved_tasks"] == [row["instance_id"]] and fs["pass_at_k"]["2"]["value"] == 0.5
    assert by["idle", "sampled"]["finish_reasons"] == {"submitted": 4}
    assert by["idle", "greedy"]["verify_status"] == {"unresolved": 2}
    # what the replies looked like, from the gateway records: the idle policy makes one call per rollout
    assert by["fixer", "sampled"]["mean_reply_tokens"] > by["idle", "sampled"]["mean_reply_tokens"] > 0
    assert by["idle", "sampled"]["length_finish_share"] == 0.0
    # one request side by side: the task the two policies' first rollouts differ on, as verify rewarded them
    example = evaluation["example"]
    assert (example["instance_id"], example["mode"]) == (row["instance_id"], "sampled")
    assert example["request"][:200] == row["problem_statement"][:200]
    assert [(r["policy"], r["reward"] > 0) for r in example["replies"]] == [("idle", False), ("fixer", True)]
    assert "diff --git" in example["replies"][1]["answer"] and evaluation["groups"] == []
    # greedy really ran at temperature 0, through the same generate path (its rollout rows carry the spec)
    greedy_rows = list(read_jsonl(out / "runs" / "fixer" / "greedy" / "rollouts" / "rollouts.jsonl"))
    assert {r["spec"]["options"]["temperature"] for r in greedy_rows} == {0.0}
    sampled_rows = list(read_jsonl(out / "runs" / "fixer" / "sampled" / "rollouts" / "rollouts.jsonl"))
    assert all("temperature" not in r["spec"]["options"] for r in sampled_rows)

    # two tasks, one difference: the bootstrap over tasks cannot call it significant (CI [0, 1], p = 0.5)
    (cmp_sampled,) = [c for c in evaluation["comparisons"] if c["mode"] == "sampled"]
    assert (cmp_sampled["a"], cmp_sampled["b"], cmp_sampled["diff"]) == ("idle", "fixer", 0.5)
    assert (cmp_sampled["low"], cmp_sampled["high"]) == (0.0, 1.0)
    assert cmp_sampled["p_value"] == pytest.approx(0.5, abs=0.05)  # 2 x P(resampled mean <= 0) = 2 x 1/4
    assert not cmp_sampled["significant"] and cmp_sampled["b_only_resolved"] == [row["instance_id"]]

    report = (out / "report.md").read_text()
    assert "data:image/png;base64," in report and "| `fixer` | sampled | 0.500 [" in report
    assert (out / "pass_at_1.png").read_bytes().startswith(b"\x89PNG")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["fixer_greedy_pass_at_1"] == 0.5 and metrics["fixer_vs_idle_sampled_significant"] == 0.0

    e = str(out / "evaluation.json")
    argv = [
        "stage",
        "evaluate",
        "--compare",
        e,
        e,
        "--a-policy",
        "idle",
        "--b-policy",
        "fixer",
        "--mode",
        "greedy",
    ]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip()
    assert (
        line.startswith("fixer - idle (greedy pass@1, 2 paired tasks): +0.500") and "not significant" in line
    )


def _evaluation(path: Path, policy: str, resolved: int, tasks: int = 30) -> str:
    rollouts = [
        {"rollout_id": f"t{i}__r0", "instance_id": f"t{i}", "repo": "r", "finish_reason": "submitted"}
        for i in range(tasks)
    ]
    rewards = [
        {"rollout_id": f"t{i}__r0", "verify_status": "resolved" if i < resolved else "unresolved"}
        for i in range(tasks)
    ]
    result = score_run(rollouts, rewards, policy, EvalMode.GREEDY, 1)
    path.write_text(json.dumps({"schema": SCHEMA, "results": [result], "comparisons": []}))
    return str(path)


def test_compare_cli_known_significant_and_not(tmp_path, capsys):
    base = _evaluation(tmp_path / "a.json", "base", resolved=3)
    final = _evaluation(tmp_path / "b.json", "final", resolved=25)
    same = _evaluation(tmp_path / "c.json", "final", resolved=3)
    assert main(["stage", "evaluate", "--compare", base, final]) == 0
    line = capsys.readouterr().out.strip()
    assert (
        line.startswith("final - base (greedy pass@1, 30 paired tasks): +0.733") and ": significant" in line
    )
    assert main(["stage", "evaluate", "--compare", base, same, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["diff"], result["significant"], result["a"], result["b"]) == (0.0, False, "base", "final")


@pytest.mark.parametrize(
    "content, message",
    [
        ({"schema": "other/9", "results": []}, "field 'schema' is 'other/9'"),
        ({"schema": SCHEMA, "results": [{"policy": "x"}]}, "results[0] lacks ['mode', 'per_task']"),
        ("{not json", "not valid JSON"),
    ],
)
def test_compare_cli_bad_file_is_one_line(tmp_path, capsys, content, message):
    good = _evaluation(tmp_path / "a.json", "base", resolved=3)
    bad = tmp_path / "bad.json"
    bad.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["stage", "evaluate", "--compare", good, str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and message in err, err


def test_tasks_default_to_the_held_out_split_of_a_select_output(tmp_path):
    from components.evaluate.stage import resolve_tasks

    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "tasks.jsonl").write_text("")
    assert resolve_tasks(tmp_path) == tmp_path / "test"
    assert resolve_tasks(tmp_path / "test") == tmp_path / "test"  # a task-set directory stays itself


def test_an_empty_held_out_split_is_a_result_not_a_crash(tmp_path):
    """The last step of a pipeline whose held-out split came out empty must not fail the run."""
    from components.evaluate.stage import Policy, run_evaluate
    from harnessrl.evaluate.results import load_evaluation
    from harnessrl.taskset import write_taskset

    write_taskset(tmp_path / "sel" / "test", [], {}, "select")
    evaluation = run_evaluate(tmp_path / "sel", tmp_path / "out", [Policy("base"), Policy("trained")])
    assert evaluation["results"] == [] and evaluation["comparisons"] == []
    assert "no tasks to evaluate" in evaluation["note"] and "test_fraction" in evaluation["note"]
    assert json.loads((tmp_path / "out" / "evaluation.json").read_text())["note"] == evaluation["note"]
    with pytest.raises(ValueError, match="'results' is empty; nothing to compare"):
        load_evaluation(tmp_path / "out")
    assert "Nothing evaluated" in (tmp_path / "out" / "report.md").read_text()
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == {}


@pytest.mark.parametrize(
    "policy, message",
    [("nameonly", "expected NAME=SOURCE"), ("x=/no/such/dir", "/no/such/dir is not a checkpoint directory")],
)
def test_bad_policy_argument_is_one_line(synth_taskset, tmp_path, capsys, policy, message):
    argv = [
        "stage",
        "evaluate",
        "--tasks",
        str(synth_taskset),
        "--out",
        str(tmp_path / "o"),
        "--policy",
        policy,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_an_engine_that_cannot_take_weights_is_a_clear_error(fast_engine, synth_taskset, tmp_path):
    from components.evaluate.stage import Policy, run_evaluate

    server = fast_engine()  # serves completions only: no weight endpoint
    policy = Policy("final", checkpoint=str(synth_taskset), engine_url=server.base_url, push_weights=True)
    with pytest.raises(ValueError, match=f"policy 'final': the engine at {server.base_url} did not load"):
        run_evaluate(synth_taskset, tmp_path / "o", [policy])
    assert not (tmp_path / "o").exists()


@requires_bwrap
@pytest.mark.slow  # the tiny model behind a loopback engine server, two weight pushes, 2 rollouts: ~30 s
def test_one_remote_engine_serves_each_policy_after_its_weights_are_pushed(
    synth_taskset, engine, url, tmp_path
):
    import pyarrow.parquet as pq

    from components.evaluate.stage import EvaluateConfig, Policy, run_evaluate
    from harnessrl.tinymodel import tiny_model_dir

    spec = {
        "harness": "react",
        "limits": {"turns": 1},
        "options": {"max_tokens_per_turn": 8, "min_tokens_per_turn": 4},
    }
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps(spec))
    start = engine.policy_version
    policies = [Policy(n, str(tiny_model_dir()), url, push_weights=True) for n in ("base", "final")]
    config = EvaluateConfig(k=1, modes=(EvalMode.GREEDY,), max_tasks=1)
    evaluation = run_evaluate(synth_taskset, tmp_path / "o", policies, specs, config)
    assert engine.policy_version == 2 != start
    for version, name in enumerate(("base", "final"), 1):
        samples = pq.read_table(tmp_path / "o" / "runs" / name / "greedy" / "rollouts" / "samples.parquet")
        sampled = {v for row in samples.column("policy_version").to_pylist() for v in row if v >= 0}
        assert sampled == {version}, (name, sampled)  # every token of this policy came after its push
    assert evaluation["results"][1]["source"].endswith(f"(weights {tiny_model_dir()} pushed)")
