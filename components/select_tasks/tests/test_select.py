from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from components.select_tasks.stage import run_select
from harnessrl.difficulty.selection import select_tasks
from harnessrl.io import write_jsonl
from harnessrl.taskset import TaskSet, write_taskset


def counts(spec: dict[str, tuple[str, int, int]]) -> list[dict]:
    return [
        {"instance_id": iid, "repo": repo, "n": 4, "n_valid": nv, "passes": p}
        for iid, (repo, nv, p) in spec.items()
    ]


def synthetic_counts(n_tasks=200, seed=1):
    import random

    rng = random.Random(seed)
    spec = {}
    for i in range(n_tasks):
        repo = f"org/repo{i % 3}"
        nv = 4 if i % 17 else rng.randint(0, 3)
        spec[f"{repo.split('/')[1]}__t{i:03d}"] = (repo, nv, rng.randint(0, nv))
    return counts(spec)


def test_select_drops_all_pass_keeps_mixed_adds_k_all_fail():
    rows = synthetic_counts()
    sel = select_tasks(rows, k_all_fail=10, test_fraction=0.2, seed=7)
    by_id = {r["instance_id"]: r for r in rows}
    kept = set(sel.train) | set(sel.test)
    assert not set(sel.train) & set(sel.test)
    for iid, r in by_id.items():
        nv, p = r["n_valid"], r["passes"]
        if nv == 0 or p == nv:
            assert iid not in kept and sel.decisions[iid]["reason"]
        elif 0 < p < nv:
            assert iid in kept
    fail_kept = [i for i in kept if by_id[i]["passes"] == 0]
    assert len(fail_kept) == 10
    c = sel.counts()
    assert c["train"] + c["test"] == c["mixed"] + 10
    # stratified: each repo's test share is its rounded fraction
    per_repo = Counter(by_id[i]["repo"] for i in kept)
    test_per_repo = Counter(by_id[i]["repo"] for i in sel.test)
    for repo, n in per_repo.items():
        assert test_per_repo[repo] == round(n * 0.2)


def test_select_is_seeded_and_order_independent():
    rows = synthetic_counts()
    a = select_tasks(rows, 5, 0.25, seed=3)
    b = select_tasks(list(reversed(rows)), 5, 0.25, seed=3)
    c = select_tasks(rows, 5, 0.25, seed=4)
    assert (a.train, a.test) == (b.train, b.test)
    assert (a.train, a.test) != (c.train, c.test)


def test_select_k_larger_than_available_and_bad_params():
    rows = counts({"a": ("r", 4, 0), "b": ("r", 4, 2)})
    sel = select_tasks(rows, k_all_fail=1000, test_fraction=0.0, seed=0)
    assert sel.train == ["a", "b"] and sel.test == []
    with pytest.raises(ValueError, match="test_fraction"):
        select_tasks(rows, 0, 1.5, 0)


def _bundle(tmp: Path, name: str) -> Path:
    repo = tmp / f"src_{name}"
    repo.mkdir()
    (repo / "a.py").write_text("x = 1\n")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    for cmd in (
        ["init", "-q", "-b", "main"],
        ["add", "."],
        ["commit", "-qm", "Initial commit"],
        ["bundle", "create", "-q", str(tmp / f"{name}.bundle"), "--all"],
    ):
        subprocess.run(["git", *cmd], cwd=repo, check=True, env=env, capture_output=True)
    return tmp / f"{name}.bundle"


def test_run_select_writes_task_sets_plot_and_report(tmp_path):
    rows = synthetic_counts(n_tasks=30)
    tasks = [
        {
            "instance_id": r["instance_id"],
            "repo": r["repo"],
            "patch": "",
            "FAIL_TO_PASS": ["t"],
            "PASS_TO_PASS": [],
            "problem_statement": "fix",
        }
        for r in rows
    ]
    bundles = {repo: _bundle(tmp_path, repo.replace("/", "_")) for repo in {r["repo"] for r in rows}}
    write_taskset(tmp_path / "tasks", tasks, bundles, source="test")
    write_jsonl(tmp_path / "pass_counts.jsonl", rows)
    out = tmp_path / "selected"
    metrics = run_select(
        tmp_path / "tasks", tmp_path / "pass_counts.jsonl", out, k_all_fail=2, test_fraction=0.3, seed=0
    )
    train, test = TaskSet.open(out / "train"), TaskSet.open(out / "test")
    assert len(train.rows()) == metrics["train"] and len(test.rows()) == metrics["test"]
    assert metrics["train"] + metrics["test"] == metrics["mixed"] + 2
    for ts in (train, test):
        for repo in {r["repo"] for r in ts.rows()}:
            assert ts.bundle(repo).is_file()
    png = (out / "pass_rate_hist.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    report = (out / "report.md").read_text()
    assert "data:image/png;base64," in report and f"**{metrics['train']} train**" in report
    decisions = [json.loads(x) for x in (out / "selection.jsonl").read_text().splitlines()]
    assert len(decisions) == 30
    # rerun is idempotent
    assert run_select(tmp_path / "tasks", tmp_path / "pass_counts.jsonl", out, 2, 0.3, 0) == metrics


def test_run_select_rejects_counts_from_another_task_set(tmp_path):
    bundle = _bundle(tmp_path, "r")
    write_taskset(
        tmp_path / "tasks",
        [
            {
                "instance_id": "a",
                "repo": "r",
                "patch": "",
                "FAIL_TO_PASS": [],
                "PASS_TO_PASS": [],
                "problem_statement": "",
            }
        ],
        {"r": bundle},
        "t",
    )
    write_jsonl(tmp_path / "pc.jsonl", counts({"zzz": ("r", 4, 1)}))
    with pytest.raises(ValueError, match="not in"):
        run_select(tmp_path / "tasks", tmp_path / "pc.jsonl", tmp_path / "out")
    write_jsonl(tmp_path / "pc.jsonl", [{"instance_id": "a", "repo": "r", "passes": 1}])
    with pytest.raises(ValueError, match="row 1: missing field 'n_valid'"):
        run_select(tmp_path / "tasks", tmp_path / "pc.jsonl", tmp_path / "out")


def test_select_cli_and_clear_error(tmp_path, capsys):
    from harnessrl.cli import main

    rows = synthetic_counts(n_tasks=12)
    tasks = [
        {
            "instance_id": r["instance_id"],
            "repo": r["repo"],
            "patch": "",
            "FAIL_TO_PASS": ["t"],
            "PASS_TO_PASS": [],
            "problem_statement": "fix",
        }
        for r in rows
    ]
    bundles = {repo: _bundle(tmp_path, repo.replace("/", "_")) for repo in {r["repo"] for r in rows}}
    write_taskset(tmp_path / "tasks", tasks, bundles, source="test")
    (tmp_path / "est").mkdir()
    write_jsonl(tmp_path / "est" / "pass_counts.jsonl", rows)
    code = main(
        [
            "stage",
            "select",
            "--tasks",
            str(tmp_path / "tasks"),
            "--estimates",
            str(tmp_path / "est"),
            "--out",
            str(tmp_path / "sel"),
            "--k-all-fail",
            "1",
            "--test-fraction",
            "0.5",
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["train"] + printed["test"] == printed["mixed"] + min(1, printed["all_fail"])
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "x", "repo": "r", "n_valid": 2}\n')
    code = main(
        [
            "stage",
            "select",
            "--tasks",
            str(tmp_path / "tasks"),
            "--estimates",
            str(tmp_path / "bad.jsonl"),
            "--out",
            str(tmp_path / "sel2"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "bad.jsonl: row 1: missing field 'passes'" in err and "Traceback" not in err
