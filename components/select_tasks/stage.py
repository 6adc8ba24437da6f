"""`select` stage: drop all-pass tasks, keep mixed ones, add K all-fail, split train/test by repo.

Output directory: train/ and test/ task sets, selection.jsonl (one decision per task), pass_rate_hist.png,
report.md, metrics.json.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from harnessrl.difficulty.selection import (
    DifficultyClass,
    Selection,
    Split,
    plot_pass_rate_histogram,
    read_pass_counts,
    select_tasks,
)
from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, write_jsonl
from harnessrl.taskset import TaskSet, write_taskset


def run_select(
    tasks: str | Path,
    pass_counts_path: str | Path,
    out: str | Path,
    k_all_fail: int = 0,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> dict:
    """Writes <out>/{train,test}/ task sets, selection.jsonl, pass_rate_hist.png, report.md, metrics.json."""
    taskset = TaskSet.open(tasks)
    counts = read_pass_counts(pass_counts_path)
    rows = {r["instance_id"]: r for r in taskset.rows()}
    missing = [r["instance_id"] for r in counts if r["instance_id"] not in rows]
    if missing:
        raise ValueError(
            f"{pass_counts_path}: {len(missing)} task(s) not in {taskset.tasks_path}, "
            f"e.g. {missing[:3]}; pass counts and tasks must come from the same task set"
        )
    sel = select_tasks(counts, k_all_fail, test_fraction, seed)
    metrics = {
        **sel.counts(),
        "tasks_estimated": len(counts),
        "seed": seed,
        "test_fraction": test_fraction,
        "k_all_fail": k_all_fail,
    }
    with atomic_output(out) as tmp:
        for split, ids in ((Split.TRAIN, sel.train), (Split.TEST, sel.test)):
            split_rows = [rows[i] for i in ids]
            repos = sorted({r["repo"] for r in split_rows if r.get("repo")})  # rows without one: no data
            write_taskset(
                tmp / split,
                split_rows,
                {repo: taskset.bundle(repo) for repo in repos},
                source=f"select({taskset.root})",
                extra_manifest={"split": split, "seed": seed},
            )
        write_jsonl(tmp / "selection.jsonl", sel.decisions.values())
        plot_pass_rate_histogram(counts, tmp / "pass_rate_hist.png")
        atomic_write_json(tmp / "metrics.json", metrics)
        atomic_write_text(tmp / "report.md", _report(metrics, sel, (tmp / "pass_rate_hist.png").read_bytes()))
    return metrics


def _report(metrics: dict, sel: Selection, png: bytes) -> str:
    from harnessrl.reports import code, embed_png

    per_repo: dict[str, Counter] = defaultdict(Counter)
    for d in sel.decisions.values():
        per_repo[d["repo"]][d.get("split", "dropped")] += 1
    lines = [
        "# Task selection",
        "",
        f"Estimated {metrics['tasks_estimated']} tasks: {metrics[DifficultyClass.MIXED]} mixed, "
        f"{metrics[DifficultyClass.ALL_PASS]} all-pass (dropped), {metrics[DifficultyClass.ALL_FAIL]} all-fail "
        f"({metrics['all_fail_kept']} kept, K={metrics['k_all_fail']}), "
        f"{metrics[DifficultyClass.NO_VALID_ROLLOUTS]} without finished rollouts (dropped).",
        "",
        f"Split (seed {metrics['seed']}, test fraction {metrics['test_fraction']}, stratified by repo): "
        f"**{metrics['train']} train**, **{metrics['test']} test**.",
        "",
        embed_png(png, "pass-rate histogram"),
        "",
        "| repo | train | test | dropped |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {code(repo)} | {c['train']} | {c['test']} | {c['dropped']} |"
        for repo, c in sorted(per_repo.items())
    ]
    return "\n".join(lines) + "\n"
