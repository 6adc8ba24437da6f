"""`build_environments` stage: the task set with every row naming its environment image (`image_name`).

    run_build_environments(tasks, out, policy=ImagePolicy.AUTO) -> metrics

Per repo, `harnessrl.sandbox.images.ensure_env_image` builds (once; cached by repo commit and requirements)
an image with the repo's `main` tree at /workspace and its dependencies + pytest installed, the same recipe as
the bubblewrap venvs (the mounted /workspace is importable). Which image a row gets (`ImagePolicy`):

- auto:  the row's own `image_name` when that image is in the local store, else the repo's built image;
- build: always the built image;
- keep:  the row's own `image_name` as it is (a cluster that pulls SWE-smith / SWE-bench images); rows
         without one get the built image.

Output directory: tasks/ (the task set, `image_name` per row), images.jsonl (instance_id, repo, image_name,
source built | task), report.md, metrics.json.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from enum import StrEnum
from pathlib import Path

from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, write_jsonl
from harnessrl.sandbox import images
from harnessrl.taskset import TaskSet, write_taskset

logger = logging.getLogger(__name__)


class ImagePolicy(StrEnum):
    AUTO = "auto"
    BUILD = "build"
    KEEP = "keep"


class ImageSource(StrEnum):
    BUILT = "built"
    TASK = "task"


def _own_image(row: dict, policy: ImagePolicy) -> str | None:
    own = row.get("image_name") or None
    if own is None or policy is ImagePolicy.BUILD:
        return None
    if policy is ImagePolicy.KEEP:
        return own
    return own if images.podman_problem() is None and images.image_exists(own) else None


def run_build_environments(
    tasks: str | Path, out: str | Path, policy: ImagePolicy = ImagePolicy.AUTO
) -> dict:
    taskset = TaskSet.open(tasks)
    rows = taskset.rows()
    chosen: dict[str, tuple[str, ImageSource]] = {}
    for row in rows:
        own = _own_image(row, policy)
        if own is not None:
            chosen[row["instance_id"]] = (own, ImageSource.TASK)
    to_build = sorted({r["repo"] for r in rows if r["instance_id"] not in chosen})
    if to_build and (problem := images.podman_problem()) is not None:
        raise RuntimeError(
            f"build_environments: {len(to_build)} repo(s) need an image built ({to_build[:3]}) but {problem}; "
            "run where podman works, or give the rows image_name and use policy keep"
        )
    built: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for repo in to_build:
        started = time.monotonic()
        built[repo] = images.ensure_env_image(taskset, repo)
        seconds[repo] = round(time.monotonic() - started, 1)
        logger.info("%s: %s (%.0f s)", repo, built[repo], seconds[repo])
    records = []
    for row in rows:
        image, source = chosen.get(row["instance_id"]) or (built[row["repo"]], ImageSource.BUILT)
        row["image_name"] = image
        records.append(
            {"instance_id": row["instance_id"], "repo": row["repo"], "image_name": image, "source": source}
        )
    sources = Counter(r["source"] for r in records)
    metrics = {
        "tasks": len(rows),
        "repos": len({r["repo"] for r in rows}),
        "images_built": len(built),
        "rows_with_built_image": sources.get(ImageSource.BUILT, 0),
        "rows_with_own_image": sources.get(ImageSource.TASK, 0),
        "build_seconds": round(sum(seconds.values()), 1),
        "policy": str(policy),
    }
    repos = sorted({r["repo"] for r in rows})
    with atomic_output(out) as tmp:
        tmp.mkdir(parents=True)
        write_taskset(
            tmp / "tasks",
            rows,
            {repo: taskset.bundle(repo) for repo in repos},
            source=f"build_environments({taskset.root})",
            extra_manifest={"environment_images": dict(sorted(built.items())), "image_policy": str(policy)},
        )
        write_jsonl(tmp / "images.jsonl", records)
        atomic_write_json(tmp / "metrics.json", metrics)
        atomic_write_text(tmp / "report.md", _report(records, built, seconds, metrics))
    return metrics


def _report(records: list[dict], built: dict[str, str], seconds: dict[str, float], metrics: dict) -> str:
    lines = [
        "# Environment images",
        "",
        f"{metrics['tasks']} task(s) over {metrics['repos']} repo(s): {metrics['images_built']} image(s) "
        f"built or found cached here, {metrics['rows_with_own_image']} row(s) kept their own image "
        f"(policy `{metrics['policy']}`).",
        "",
        "| repo | image | seconds |",
        "|---|---|---|",
        *(f"| {repo} | `{image}` | {seconds[repo]} |" for repo, image in sorted(built.items())),
    ]
    own = [r for r in records if r["source"] == ImageSource.TASK]
    if own:
        lines += ["", "| task | own image |", "|---|---|"]
        lines += [f"| {r['instance_id']} | `{r['image_name']}` |" for r in own[:50]]
    return "\n".join(lines) + "\n"
