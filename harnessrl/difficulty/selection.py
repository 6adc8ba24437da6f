"""Task selection from Best-of-N pass counts: drop all-pass, keep mixed, add K all-fail, split train/test
(seeded, stratified by repo), and plot the pass-rate histogram.

Pass-count rows (written by `estimate_difficulty`, one per task):
    {"instance_id", "repo", "n", "n_valid", "passes", "excluded": {reason: count}}
`n_valid` counts finished rollouts (rollout_status ok); a task with n_valid == 0 is not classified.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from harnessrl.io import read_jsonl


class DifficultyClass(StrEnum):
    """A task's class from its Best-of-N pass count (also the metric names of these counts)."""

    ALL_PASS = "all_pass"  # no learning signal: dropped
    MIXED = "mixed"  # kept
    ALL_FAIL = "all_fail"  # K of them kept
    NO_VALID_ROLLOUTS = "no_valid_rollouts"  # no finished rollout to judge: dropped


class Split(StrEnum):
    TRAIN = "train"
    TEST = "test"


def classify(n_valid: int, passes: int) -> DifficultyClass:
    if n_valid <= 0:
        return DifficultyClass.NO_VALID_ROLLOUTS
    if passes == n_valid:
        return DifficultyClass.ALL_PASS
    if passes == 0:
        return DifficultyClass.ALL_FAIL
    return DifficultyClass.MIXED


def read_pass_counts(path: str | Path) -> list[dict]:
    rows = []
    for i, row in enumerate(read_jsonl(path), 1):
        for key in ("instance_id", "repo", "n_valid", "passes"):
            if key not in row:
                raise ValueError(
                    f"{path}: row {i}: missing field {key!r} (pass counts come from "
                    "`harnessrl stage estimate-difficulty`)"
                )
        if not 0 <= int(row["passes"]) <= int(row["n_valid"]):
            raise ValueError(f"{path}: row {i} ({row['instance_id']}): need 0 <= passes <= n_valid")
        rows.append(row)
    return rows


@dataclass
class Selection:
    train: list[str] = field(default_factory=list)
    test: list[str] = field(default_factory=list)
    decisions: dict[str, dict] = field(default_factory=dict)  # instance_id -> {class, pass_rate, kept, ...}

    def counts(self) -> dict[str, int]:
        classes = Counter(d["class"] for d in self.decisions.values())
        kept_all_fail = [
            d for d in self.decisions.values() if d["class"] == DifficultyClass.ALL_FAIL and d["kept"]
        ]
        return {
            **{c.value: classes[c] for c in DifficultyClass},
            "all_fail_kept": len(kept_all_fail),
            Split.TRAIN.value: len(self.train),
            Split.TEST.value: len(self.test),
        }


def select_tasks(pass_counts: list[dict], k_all_fail: int, test_fraction: float, seed: int) -> Selection:
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if k_all_fail < 0:
        raise ValueError(f"k_all_fail must be >= 0, got {k_all_fail}")
    rng = random.Random(seed)
    sel = Selection()
    repo_of: dict[str, str] = {}
    by_class: dict[DifficultyClass, list[str]] = defaultdict(list)
    for row in sorted(pass_counts, key=lambda r: r["instance_id"]):
        iid, n_valid, passes = row["instance_id"], int(row["n_valid"]), int(row["passes"])
        cls = classify(n_valid, passes)
        repo_of[iid] = row["repo"]
        by_class[cls].append(iid)
        sel.decisions[iid] = {
            "instance_id": iid,
            "repo": row["repo"],
            "class": cls,
            "n_valid": n_valid,
            "passes": passes,
            "pass_rate": passes / n_valid if n_valid else None,
            "kept": False,
        }
    all_fail = by_class[DifficultyClass.ALL_FAIL]
    fail_kept = set(rng.sample(all_fail, min(k_all_fail, len(all_fail))))
    kept = by_class[DifficultyClass.MIXED] + sorted(fail_kept)
    reasons = {
        DifficultyClass.ALL_PASS: "all rollouts passed: no learning signal",
        DifficultyClass.NO_VALID_ROLLOUTS: "no finished rollouts to judge",
        DifficultyClass.ALL_FAIL: f"all rollouts failed and not among the {k_all_fail} all-fail tasks kept",
    }
    for iid, d in sel.decisions.items():
        if iid not in kept:
            d["reason"] = reasons[d["class"]]
    per_repo: dict[str, list[str]] = defaultdict(list)
    for iid in kept:
        per_repo[repo_of[iid]].append(iid)
    for repo in sorted(per_repo):
        ids = sorted(per_repo[repo])
        rng.shuffle(ids)
        n_test = round(len(ids) * test_fraction)
        for i, iid in enumerate(ids):
            split = Split.TEST if i < n_test else Split.TRAIN
            (sel.test if split is Split.TEST else sel.train).append(iid)
            sel.decisions[iid].update(kept=True, split=split)
    sel.train.sort()
    sel.test.sort()
    return sel


def plot_pass_rate_histogram(
    pass_counts: list[dict], path: Path, title: str = "Best-of-N pass rate per task"
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [int(r["passes"]) / int(r["n_valid"]) for r in pass_counts if int(r["n_valid"]) > 0]
    ns = sorted({int(r["n_valid"]) for r in pass_counts if int(r["n_valid"]) > 0})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = max(ns[-1] + 1 if ns else 5, 5)
    ax.hist(rates, bins=bins, range=(0, 1), color="#4878cf", edgecolor="white")
    ax.set_xlabel("pass rate (passes / finished rollouts)")
    ax.set_ylabel("tasks")
    ax.set_title(f"{title} ({len(rates)} tasks)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
