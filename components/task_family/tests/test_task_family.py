"""The task-family stage: `auto` trains on the selected SWE tasks only when the difficulty estimate found
headroom there, and otherwise on a generated instruction family whose held-out tasks share no base request
with the training tasks; the choice and its reason are in one line of its report and in its metrics."""

from __future__ import annotations

import json
from pathlib import Path

from components.task_family.stage import Family, read_choice, run_task_family
from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.taskset import write_taskset

SWE_ROW = {
    "instance_id": "pkg__x.1",
    "repo": "pkg/x",
    "patch": "",
    "FAIL_TO_PASS": [],
    "PASS_TO_PASS": [],
    "problem_statement": "fix it",
}


def _selection(tmp_path: Path, classes: list[str]) -> tuple[Path, Path]:
    selected = write_taskset(tmp_path / "selected", [SWE_ROW], {}, "test").root
    held_out = write_taskset(tmp_path / "held_out", [], {}, "test").root
    decisions = [{"instance_id": f"t{i}", "class": c, "split": "train"} for i, c in enumerate(classes)]
    write_jsonl(selected / "selection.jsonl", decisions)
    return selected, held_out


def test_auto_without_swe_headroom_trains_on_the_instruction_family(tmp_path: Path):
    selected, held_out = _selection(tmp_path, ["all_fail", "all_fail"])
    specs = '[{"harness": "chat", "limits": {"tokens": 16}}]'
    choice = run_task_family(
        selected,
        held_out,
        tmp_path / "out",
        n_train=6,
        n_held_out=4,
        kinds=("no_commas",),
        family_specs_json=specs,
    )
    assert (choice.family, choice.train, choice.test, choice.swe_mixed, choice.specs_json) == (
        Family.INSTRUCTION, 6, 4, 0, specs,
    )  # fmt: skip
    assert "no headroom" in choice.reason and read_choice(tmp_path / "out") == choice
    train = list(read_jsonl(tmp_path / "out" / "train" / "tasks.jsonl"))
    test = list(read_jsonl(tmp_path / "out" / "test" / "tasks.jsonl"))
    assert {r["environment"] for r in train + test} == {"instruction"}
    request = lambda r: r["problem_statement"].split(".")[0]  # noqa: E731
    assert not {request(r) for r in train} & {request(r) for r in test}
    # whole replies: a word count and a word of the request beside the trained kind; half the held-out tasks
    # draw kinds never trained, tagged so the evaluation reports them apart
    kinds = lambda r: [c["kind"] for c in r["constraints"]]  # noqa: E731
    assert all(kinds(r) == ["no_commas", "word_count", "keywords_present"] for r in train)
    groups = {r["eval_group"]: [] for r in test}
    for r in test:
        groups[r["eval_group"]].append(kinds(r)[0])
    assert set(groups["trained kinds"]) == {"no_commas"} and len(groups["unseen kinds"]) == 2
    assert "no_commas" not in groups["unseen kinds"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "SWE tasks: no headroom" in report and "Training on **instruction**: 6 tasks" in report
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["family_swe"] == 0.0


def test_auto_with_swe_headroom_passes_the_selected_tasks_through(tmp_path: Path):
    selected, held_out = _selection(tmp_path, ["mixed", "all_fail"])
    choice = run_task_family(selected, held_out, tmp_path / "out", swe_specs_json="[]")
    assert (choice.family, choice.swe_mixed, choice.train, choice.test, choice.specs_json) == (
        Family.SWE, 1, 1, 0, "[]",
    )  # fmt: skip
    assert list(read_jsonl(tmp_path / "out" / "train" / "tasks.jsonl")) == [SWE_ROW]


def test_the_family_can_be_chosen(tmp_path: Path):
    selected, held_out = _selection(tmp_path, ["mixed"])
    choice = run_task_family(
        selected, held_out, tmp_path / "out", family=Family.INSTRUCTION, n_train=2, n_held_out=2
    )
    assert (
        choice.family is Family.INSTRUCTION
        and choice.reason == "family instruction chosen by the run's settings"
    )


def test_every_generated_family_holds_out_tasks_that_share_no_source(tmp_path: Path):
    selected, held_out = _selection(tmp_path, ["mixed"])
    sources = {  # what a held-out task must not share with a training task
        Family.PROCEDURAL: lambda r: r["problem_statement"],
        Family.SEARCH: lambda r: r["doc_id"].split("/")[0],  # the package asked about
        Family.KERNEL: lambda r: r["instance_id"],
    }
    for family, source in sources.items():
        out = tmp_path / str(family)
        choice = run_task_family(selected, held_out, out, family=family, n_train=4, n_held_out=3)
        train = list(read_jsonl(out / "train" / "tasks.jsonl"))
        test = list(read_jsonl(out / "test" / "tasks.jsonl"))
        assert (choice.family, choice.train, choice.test, choice.auto) == (family, 4, 3, False)
        assert {r["environment"] for r in train + test} == {str(family)}
        assert not {source(r) for r in train} & {source(r) for r in test}, family
        assert f"Training on **{family}**" in (out / "report.md").read_text()
        flags = json.loads((out / "metrics.json").read_text())
        assert flags[f"family_{family}"] == 1.0 and flags["family_instruction"] == 0.0
