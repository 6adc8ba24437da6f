"""The search environment through the interface every stage uses: task sets from `harnessrl tasks search`
(the corpus travelling inside them), the host-side search / read / answer tools on the real BM25 index, the
spec checks (the react harness with those tools only), rewards (gold 1; empty, wrong and reward hacks 0),
and one rollout end to end through generate (gateway, ReAct harness, the tools) and verify."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from harnessrl.environments.base import Finished
from harnessrl.environments.registry import get_environment
from harnessrl.environments.search.env import EM, F1, SearchEnvironment, SearchRuntime, corpus_index
from harnessrl.harness.tools import toolset
from harnessrl.io import read_jsonl
from harnessrl.rollout.episode import plan_row, spec_for
from harnessrl.rollout.specs import parse_specs
from harnessrl.sandbox.workspace import safe_name
from harnessrl.taskset import TaskSet

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bm25s") is None, reason="bm25s not installed (the search index's library)"
)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> TaskSet:
    from harnessrl.cli import main

    out = tmp_path_factory.mktemp("search") / "train"
    assert main(["tasks", "search", "--out", str(out), "--n", "12", "--split", "train", "--seed", "3"]) == 0
    return TaskSet.open(out)


@pytest.fixture(scope="module")
def license_row(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, TaskSet]:
    from harnessrl.cli import main

    out = tmp_path_factory.mktemp("search") / "licenses"
    assert main(["tasks", "search", "--out", str(out), "--n", "1", "--kinds", "license"]) == 0
    ts = TaskSet.open(out)
    return ts.rows()[0], ts


def reward(row: dict, answer: str, name: str = EM) -> float | None:
    return SearchEnvironment().reward(row, Finished(answer, "", {}), name, None).total  # type: ignore[arg-type]


def test_task_sets_carry_their_corpus_and_split_packages(tasks: TaskSet, tmp_path: Path) -> None:
    from harnessrl.cli import main

    rows = tasks.rows()
    assert len(rows) == 12 and {r["environment"] for r in rows} == {"search"}
    [repo] = {r["repo"] for r in rows}
    assert repo.startswith("corpus/") and tasks.bundle(repo).is_file()  # the corpus is in the task set
    assert main(["tasks", "search", "--out", str(tmp_path / "test"), "--n", "12", "--split", "test"]) == 0
    package = {
        s: {r["doc_id"].split("/")[0] for r in ts.rows()}
        for s, ts in (("train", tasks), ("test", TaskSet.open(tmp_path / "test")))
    }
    assert package["train"] and package["test"] and not package["train"] & package["test"]
    for r in rows:  # every answer is verbatim in its gold passage, which the index can read
        assert all(a in corpus_index(r, tasks).read(r["doc_id"]) for a in r["answers"])


def test_bad_rows_and_specs_name_the_task(tasks: TaskSet) -> None:
    row = tasks.rows()[0]
    env = get_environment("search")
    with pytest.raises(ValueError, match=r"task 's1' \(search\): 'answers' must be a non-empty list"):
        env.check_task({**row, "instance_id": "s1", "answers": []})
    planned = plan_row(row, spec_for(row, [], 0, 0, 1), 0)  # the default: react with the corpus tools
    assert (planned.harness, planned.reward_fn, planned.spec["tools"]) == (
        "react",
        EM,
        ["search", "read", "answer"],
    )
    assert plan_row(row, parse_specs({"harness": "chat"})[0], 0).harness == "chat"  # from memory alone
    with pytest.raises(ValueError, match=r"\['read', 'search'\] run on the host's corpus and \['bash'\]"):
        parse_specs({"harness": "react", "tools": ["bash", "search", "read", "answer"]})
    with pytest.raises(ValueError, match=rf"task '{row['instance_id']}' \(search\).*add 'answer'"):
        plan_row(row, parse_specs({"harness": "react", "tools": ["search", "read"]})[0], 0)


def test_the_tools_search_and_read_the_index_on_the_host(tasks: TaskSet) -> None:
    row = next(r for r in tasks.rows() if r["kind"] != "cloze")
    runtime = SearchEnvironment().host_runtime(row, tasks)
    assert isinstance(runtime, SearchRuntime)
    tools = toolset(["search", "read", "answer"])
    hits = tools["search"].execute({"query": row["question"], "k": 10}, runtime, 10.0).content
    assert f"[{row['doc_id']}]" in hits, hits
    passage = tools["read"].execute({"doc_id": row["doc_id"]}, runtime, 10.0).content
    assert all(a in passage for a in row["answers"])
    assert tools["read"].execute({"doc_id": "nope"}, runtime, 10.0).content.startswith("Error: no passage")
    done = tools["answer"].execute({"answer": row["answers"][0]}, runtime, 10.0)
    assert done.submitted and done.answer == row["answers"][0]
    from harnessrl.harness.runtime import ToolError

    with pytest.raises(ToolError, match="no workspace"):  # no files, no commands: nothing to execute
        runtime.run_shell("ls", 5.0)


def test_gold_scores_one_empty_and_wrong_zero(license_row: tuple[dict, TaskSet]) -> None:
    row, _ = license_row
    gold = row["answers"][0]
    for answer in (gold, f"<answer>{gold}</answer>", f"I searched.\nAnswer: {gold}"):
        assert reward(row, answer) == 1.0 and reward(row, answer, F1) == 1.0
    for answer in ("", "   ", "<answer></answer>", "Proprietary-Unknown-License"):
        assert reward(row, answer) == 0.0 and reward(row, answer, F1) == 0.0
    r = SearchEnvironment().reward(row, Finished(gold, "", {}), EM, None)  # type: ignore[arg-type]
    assert r.parts == {"em": 1.0, "f1": 1.0} and gold in r.detail


def test_reward_hacks_score_zero(license_row: tuple[dict, TaskSet]) -> None:
    row, ts = license_row
    index = corpus_index(row, ts)
    passage = index.read(row["doc_id"])
    dump = "\n".join(p.text for p in index.passages[:200])
    hacks = {
        "the whole passage": passage,
        "a dump of the corpus": f"<answer>{dump}</answer>",
        "the question copied": row["question"],
        "the package name from the question": row["question"].split("package ")[1].split(" ")[0],
        "a partial string": row["answers"][0][: max(1, len(row["answers"][0]) // 2)],
        "the right answer not last": f"<answer>{row['answers'][0]}</answer> no wait <answer>GPL</answer>",
    }
    for what, answer in hacks.items():
        assert reward(row, answer) == 0.0, what
    for what in ("the whole passage", "a dump of the corpus", "the question copied"):
        assert reward(row, hacks[what], F1) == 0.0, what  # no partial credit for pasting either


def test_a_rollout_end_to_end_searches_reads_and_answers(tasks: TaskSet, fast_engine, tmp_path: Path) -> None:
    from harnessrl.rollout.generate import GenerateConfig, run_generate
    from harnessrl.rollout.model_server import ModelSource
    from harnessrl.verify.rollouts import run_verify

    row = next(r for r in tasks.rows() if r["kind"] != "cloze")

    def call(name: str, **arguments: object) -> dict:
        return {"text": f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"}

    engine = fast_engine(
        [
            call("search", query=row["question"]),
            call("read", doc_id=row["doc_id"]),
            call("answer", answer=row["answers"][0]),
        ]
    )
    config = GenerateConfig(group_size=1, instance_ids=[row["instance_id"]])
    run_generate(tasks.root, tmp_path / "gen", None, ModelSource(engine_url=engine.base_url), config)
    [rollout] = read_jsonl(tmp_path / "gen" / "rollouts.jsonl")
    assert (rollout["finish_reason"], rollout["tool_calls"], rollout["final_answer"]) == (
        "submitted",
        3,
        row["answers"][0],
    )
    name = safe_name(rollout["rollout_id"])
    transcript = json.loads((tmp_path / "gen" / "transcripts" / f"{name}.json").read_text())
    tool_replies = [m["content"] for m in transcript if m["role"] == "tool"]
    assert f"[{row['doc_id']}]" in tool_replies[0] and row["answers"][0] in tool_replies[1]
    run_verify(tasks.root, tmp_path / "gen", tmp_path / "verified")
    [verdict] = read_jsonl(tmp_path / "verified" / "rewards.jsonl")
    assert (verdict["reward"], verdict["verify_status"], verdict["reward_parts"]) == (
        1.0,
        "resolved",
        {"em": 1.0, "f1": 1.0},
    )
