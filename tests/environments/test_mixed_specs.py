"""Task sets that mix environments: each spec says which environments it is for, each task takes the specs
for its own environment (round-robin), and a task no spec is for runs under its environment's default; the
select stage splits such a set, each row keeping its data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harnessrl.environments.kernel.env import task_row as kernel_row
from harnessrl.environments.kernel.tasks import load_tasks
from harnessrl.io import write_jsonl
from harnessrl.rollout.episode import plan_row, spec_for
from harnessrl.rollout.specs import parse_specs
from harnessrl.schema import HarnessName
from harnessrl.taskset import TaskSet, write_taskset
from tests.environments.test_environments import ROW as INSTRUCTION_ROW

KERNEL_ROW = kernel_row(load_tasks()[0])
SWE_ROW = {"instance_id": "repo__1", "repo": "o/r", "problem_statement": "fix it"}


def test_each_task_takes_the_specs_for_its_environment() -> None:
    specs = parse_specs(
        [
            {"name": "chat", "harness": "chat", "limits": {"tokens": 16}, "environments": ["instruction"]},
            {
                "name": "react-a",
                "harness": "react",
                "limits": {"turns": 2},
                "environments": ["kernel", "swe"],
            },
            {"name": "react-b", "harness": "react", "limits": {"turns": 3}, "environments": ["kernel"]},
        ]
    )
    assert [spec_for(INSTRUCTION_ROW, specs, 0, k, 2).name for k in range(2)] == ["chat", "chat"]
    assert [spec_for(KERNEL_ROW, specs, 1, k, 2).name for k in range(2)] == ["react-a", "react-b"]
    assert spec_for(SWE_ROW, specs, 2, 0, 2).name == "react-a"
    planned = plan_row(INSTRUCTION_ROW, spec_for(INSTRUCTION_ROW, specs, 0, 0, 2), 0)
    assert (planned.harness, planned.spec["limits"]["tokens"]) == (HarnessName.CHAT, 16)


def test_a_task_no_spec_is_for_runs_under_its_default_and_specs_for_all_still_fit() -> None:
    only_kernel = parse_specs({"harness": "react", "environments": ["kernel"]})
    assert spec_for(INSTRUCTION_ROW, only_kernel, 0, 0, 1).spec.harness is HarnessName.CHAT  # its default
    for_all = parse_specs({"harness": "chat"})
    assert spec_for(KERNEL_ROW, for_all, 0, 0, 1).spec.harness is HarnessName.CHAT


@pytest.mark.parametrize(
    "environments, message",
    [
        (
            ["kernal"],
            r"harness spec\[0\]\.environments: unknown environment\(s\) \['kernal'\]; built-in: swe",
        ),
        ("kernel", r"harness spec\[0\]\.environments: expected a list of environment names"),
    ],
)
def test_bad_environments_are_one_line_errors(environments: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_specs({"harness": "react", "environments": environments})
    parse_specs({"harness": "react", "environments": ["myproject.qa:QAEnvironment"]})  # custom: by path


@pytest.mark.skipif(importlib.util.find_spec("bm25s") is None, reason="bm25s not installed")
def test_select_splits_a_mixed_task_set_and_carries_the_search_corpus(tmp_path: Path) -> None:
    """The difficulty stages' selection on kernel + search tasks: rows without a repo need no data file,
    search rows keep their corpus (the task set's repo data) in both splits."""
    from components.select_tasks.stage import run_select
    from harnessrl.cli import main
    from harnessrl.environments.search.env import corpus_index

    assert main(["tasks", "search", "--out", str(tmp_path / "s"), "--n", "6"]) == 0
    search = TaskSet.open(tmp_path / "s")
    rows = [*search.rows(), *(kernel_row(t) for t in load_tasks()[:6])]
    repo = search.rows()[0]["repo"]
    write_taskset(tmp_path / "mixed", rows, {repo: search.bundle(repo)}, "mixed")
    counts = [
        {"instance_id": r["instance_id"], "repo": str(r.get("repo") or ""), "n_valid": 4, "passes": 1 + i % 3}
        for i, r in enumerate(rows)
    ]
    write_jsonl(tmp_path / "counts.jsonl", counts)
    run_select(tmp_path / "mixed", tmp_path / "counts.jsonl", tmp_path / "sel", test_fraction=0.5)
    for split in ("train", "test"):
        part = TaskSet.open(tmp_path / "sel" / split)
        envs = {r["environment"] for r in part.rows()}
        assert envs == {"kernel", "search"}, (split, envs)
        row = next(r for r in part.rows() if r["environment"] == "search")
        assert corpus_index(row, part).read(row["doc_id"])


def test_tasks_mix_takes_n_of_each_set_with_its_repo_data_and_refuses_shared_ids(
    tmp_path: Path, capsys
) -> None:
    from harnessrl.cli import main
    from harnessrl.environments.procedural.env import write_procedural_taskset
    from harnessrl.environments.search.env import SearchSplit, write_search_taskset

    search = write_search_taskset(tmp_path / "search", 4, 0, SearchSplit.TRAIN)
    procedural = write_procedural_taskset(tmp_path / "procedural", 6, 0)
    assert (
        main(["tasks", "mix", "--out", str(tmp_path / "mix"), str(search.root), f"{procedural.root}:2"]) == 0
    )
    assert "6 tasks (procedural 2, search 4)" in capsys.readouterr().out
    mixed = TaskSet.open(tmp_path / "mix")
    rows = mixed.rows()
    assert [r["environment"] for r in rows] == ["search"] * 4 + ["procedural"] * 2
    assert {r["instance_id"] for r in rows[4:]} <= {r["instance_id"] for r in procedural.rows()}
    corpus = rows[0]["repo"]
    assert mixed.bundle(corpus).read_bytes() == search.bundle(corpus).read_bytes()  # the corpus travels
    again = tmp_path / "again"
    main(["tasks", "mix", "--out", str(again), str(search.root), f"{procedural.root}:2"])
    assert TaskSet.open(again).rows() == rows  # the same seed draws the same tasks
    bad = str(tmp_path / "bad")
    assert main(["tasks", "mix", "--out", bad, str(search.root), str(search.root)]) != 0
    assert f"{rows[0]['instance_id']!r} is in both" in capsys.readouterr().err  # one line naming the task
    assert main(["tasks", "mix", "--out", bad, f"{procedural.root}:7"]) != 0
    assert "asked for 7 tasks, it holds 6" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_the_loop_deals_specs_inside_each_group_or_one_per_group(tmp_path: Path) -> None:
    """`spec_mix: sample` (the default) mixes a run's specs inside every group, as the generate stage does;
    `spec_mix: group` gives every rollout of a group the spec its position in the data order picks, so a
    group's baseline compares one harness. Each is checked against every task before the first rollout."""
    from harnessrl.cli import main
    from harnessrl.rl.config import RLConfig
    from harnessrl.rl.workloads import RolloutPlan, TaskSetWorkload
    from harnessrl.rollout.fit import Unfit
    from harnessrl.schema import SpecMix

    assert main(["tasks", "instruction", "--out", str(tmp_path / "t"), "--n", "3"]) == 0
    specs = parse_specs(
        [
            {"name": "a", "harness": "chat", "limits": {"tokens": 16}},
            {"name": "b", "harness": "react", "tools": ["answer"], "limits": {"turns": 2}},
        ]
    )

    def dealt(mix: SpecMix) -> list[list[str]]:
        workload = TaskSetWorkload(tmp_path / "t", specs, group_size=3, spec_mix=mix)
        task = workload.task_ids()[0]
        return [
            [workload.spec_of(RolloutPlan(f"{g}-{k}", f"{task}@g{g}", task, k, g, 0)).name for k in range(3)]
            for g in range(3)
        ]

    # sample: the task's rollouts round-robin, whatever the group; group: one spec a group, by its position
    assert dealt(SpecMix.SAMPLE) == [["a", "b", "a"]] * 3
    assert dealt(SpecMix.GROUP) == [["a"] * 3, ["b"] * 3, ["a"] * 3]
    assert RLConfig.from_dict({"spec_mix": "group"}).spec_mix is SpecMix.GROUP
    assert "spec_mix" not in RLConfig().hashed_settings()  # runs from before the setting still resume
    with pytest.raises(ValueError, match="spec_mix must be one of"):
        RLConfig(spec_mix="task")  # pyright: ignore[reportArgumentType]
    # react without `answer` cannot answer an instruction task. With one task and groups of one, mixing inside
    # groups only ever deals it spec a; one spec per group deals it c at the second group: refused at once
    assert main(["tasks", "instruction", "--out", str(tmp_path / "one"), "--n", "1"]) == 0
    no_answer = parse_specs([specs[0].to_row(), {"name": "c", "harness": "react", "limits": {"turns": 2}}])
    TaskSetWorkload(tmp_path / "one", no_answer, group_size=1, spec_mix=SpecMix.SAMPLE)
    with pytest.raises(Unfit, match="'c'"):
        TaskSetWorkload(tmp_path / "one", no_answer, group_size=1, spec_mix=SpecMix.GROUP)
