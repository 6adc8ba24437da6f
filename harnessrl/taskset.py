"""The task-set directory: the on-disk form every stage and CLI accepts.

    <dir>/tasks.jsonl        one SWE-smith row per line
    <dir>/repos/<name>.bundle git bundle per distinct `repo` value (name = repo with "/" -> "__")
    <dir>/manifest.json      source, counts, tool version

Two task layouts share the directory (`TaskLayout`, read off each row by `task_layout`):
- SWE-smith (no `test_patch`): branch `main` = one squashed "Initial commit"; branch `<instance_id>` =
  "Bug Patch" then "Remove F2P Tests" commits on top of main. `patch` introduces the bug.
- SWE-bench (a non-empty `test_patch`): branch `<instance_id>` = one parentless commit holding the tree of
  `base_commit`; `patch` is the fix and `test_patch` the tests, applied only at grading time (the bundle never
  holds them).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from harnessrl import __version__
from harnessrl.io import atomic_output, read_jsonl, write_jsonl

TASK_FIELDS_REQUIRED = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS", "problem_statement")
TASK_FIELDS_OPTIONAL = ("image_name", "created_at", "base_commit", "test_patch")


class TaskLayout(StrEnum):
    SWESMITH = "swesmith"  # tests present at the bug commit (branch tip~1); `patch` introduces the bug
    SWEBENCH = "swebench"  # tests come from `test_patch` at grading time; `patch` is the fix


def task_layout(row: dict) -> TaskLayout:
    return TaskLayout.SWEBENCH if (row.get("test_patch") or "").strip() else TaskLayout.SWESMITH


def bundle_name(repo: str) -> str:
    return repo.replace("/", "__") + ".bundle"


@dataclass
class TaskSet:
    root: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, root: str | Path) -> TaskSet:
        root = Path(root)
        if not (root / "tasks.jsonl").is_file():
            raise FileNotFoundError(
                f"{root}: not a task-set directory (no tasks.jsonl). Create one with "
                "`harnessrl tasks synthesize` or `harnessrl tasks import`."
            )
        manifest_path = root / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        return cls(root=root, manifest=manifest)

    @property
    def tasks_path(self) -> Path:
        return self.root / "tasks.jsonl"

    def rows(self) -> list[dict]:
        return list(read_jsonl(self.tasks_path))

    def row(self, instance_id: str) -> dict:
        for r in read_jsonl(self.tasks_path):
            if r.get("instance_id") == instance_id:
                return r
        raise KeyError(f"{self.tasks_path}: no task with instance_id {instance_id!r}")

    def bundle(self, repo: str) -> Path:
        return self.root / "repos" / bundle_name(repo)


def write_taskset(
    out: str | Path,
    rows: Iterable[dict],
    bundles: dict[str, Path],
    source: str,
    extra_manifest: dict[str, Any] | None = None,
    rejects: list[dict] | None = None,
) -> TaskSet:
    """Writes a task-set directory atomically (replacing any previous one). `bundles` maps repo -> bundle file;
    `rejects` (rows an import could not convert, each with its reason) go to `rejects.jsonl`."""
    out = Path(out)
    rows = list(rows)
    with atomic_output(out) as tmp:
        (tmp / "repos").mkdir(parents=True)
        write_jsonl(tmp / "tasks.jsonl", rows)
        if rejects is not None:
            write_jsonl(tmp / "rejects.jsonl", rejects)
        for repo, src in bundles.items():
            shutil.copyfile(src, tmp / "repos" / bundle_name(repo))
        manifest = {
            "source": source,
            "tasks": len(rows),
            "repos": sorted(bundles),
            "tool": f"harnessrl {__version__}",
            **(extra_manifest or {}),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return TaskSet.open(out)


@dataclass(frozen=True)
class MixPart:
    """One task set of a mix and how many of its tasks to take (None: all)."""

    root: Path
    take: int | None = None

    @classmethod
    def parse(cls, text: str) -> MixPart:
        """`DIR` or `DIR:N` (N of its tasks, drawn with the mix's seed)."""
        path, sep, count = text.rpartition(":")
        if sep and count.isdigit():
            return cls(Path(path), int(count))
        return cls(Path(text))


def mix_tasksets(out: str | Path, parts: Iterable[MixPart], seed: int = 0) -> TaskSet:
    """One task set holding tasks of several (of any environments: each row keeps its own, and its repo data
    — SWE bundles, the search corpus); the counts set the mix. Instance ids must not repeat across parts."""
    rows: list[dict] = []
    bundles: dict[str, Path] = {}
    taken: list[str] = []
    seen: dict[str, Path] = {}
    for part in parts:
        source = TaskSet.open(part.root)
        chosen = source.rows()
        if part.take is not None:
            if part.take > len(chosen):
                raise ValueError(f"{part.root}: asked for {part.take} tasks, it holds {len(chosen)}")
            chosen = random.Random(seed).sample(chosen, part.take)
        for row in chosen:
            iid = row["instance_id"]
            if iid in seen:
                raise ValueError(
                    f"task {iid!r} is in both {seen[iid]} and {part.root}: mix distinct task sets"
                )
            seen[iid] = part.root
            rows.append(row)
            if row.get("repo") and source.bundle(row["repo"]).is_file():
                bundles[row["repo"]] = source.bundle(row["repo"])
        taken.append(f"{part.root} ({len(chosen)})")
    return write_taskset(out, rows, bundles, f"mix of {', '.join(taken)}, seed {seed}")
