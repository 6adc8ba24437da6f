"""The demo's estimate-difficulty step before and after the local engine's speed work, side by side in one run.

The step is run as `make demo` runs it (its tasks, N=2, the demo's harness spec; `harnessrl stage
estimate-difficulty`, one fresh process per run, the in-step local engine) from two trees, alternating:

  - `baseline`: a git worktree of `--baseline-rev` (default: the last commit before the engine gained its
    prefix cache, packed steps and speculative decoding; its settings: 4 rollouts in flight, every patch
    verified by a test run);
  - `baseline-same-settings` (unless `--skip-same-settings`): the baseline tree at today's 8 rollouts in
    flight, which separates what the engine gained from what the settings did;
  - `current`: this checkout, with its defaults.

Tasks: the demo's (4 tasks synthesized from the parse sdist, then cleaned), or `--tasks DIR`. Each run reports
its wall time, the generate phase's wall, model seconds per turn and rollouts/hour. Last line: one JSON object
with `difficulty_step_speedup` (median step wall, baseline / current), `generate_speedup`,
`model_s_per_turn_speedup`, `rollouts_per_hour_speedup`, the same-settings ratios, and the load they ran under.

    .venv/bin/python benchmarks/demo_steps.py [--baseline-rev REV] [--repeats 2] [--tasks DIR]
        [--skip-same-settings] [--smoke]

Needs the repository's history (a shallow clone lacks the baseline commit: `git fetch --unshallow`).
`--smoke`: every arm once on one task synthesized from tests/fixtures/minirepo (unless `--tasks`), 1 rollout
of 1 turn x 8 tokens (seconds per arm; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REV = "70f75d2"  # the engine before its prefix cache (one process, one request per forward pass)
DEMO_N = 2
DEMO_MAX_TASKS = 4
SMOKE_SPECS = '[{"harness": "react", "sandbox": "bubblewrap", "limits": {"turns": 1}, "options": {"max_tokens_per_turn": 8}}]'


@dataclass
class Arm:
    name: str
    tree: Path
    extra_args: tuple[str, ...] = ()


def demo_tasks(work: Path, smoke: bool = False) -> Path:
    """The demo's task set: synthesized from the demo's sdist (as `harnessrl demo` does), then cleaned;
    `smoke`: one task, from the test fixture the demo falls back to offline."""
    from rich.console import Console

    from dataprep.clean import run_clean_stage
    from dataprep.synthesize import synthesize_taskset
    from pipelines.demo import FIXTURE_REPO, demo_source

    source = FIXTURE_REPO if smoke else demo_source(Console(stderr=True))
    synthesize_taskset(source, work / "synthesized", max_tasks=1 if smoke else DEMO_MAX_TASKS, seed=0)
    run_clean_stage(work / "synthesized", work / "clean")
    return work / "clean" / "kept"


def add_worktree(rev: str, path: Path) -> None:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(path), rev],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"cannot check out the baseline {rev!r} ({proc.stderr.strip()}); a shallow clone lacks it: "
            "run `git fetch --unshallow`, or pass --baseline-rev"
        )


def run_step(
    arm: Arm, tasks: Path, out: Path, specs: Path, n: int = DEMO_N, max_tasks: int = DEMO_MAX_TASKS
) -> dict:
    env = {**os.environ, "PYTHONPATH": str(arm.tree)}
    command = [
        sys.executable,
        "-m",
        "harnessrl.cli",
        "-q",
        "stage",
        "estimate-difficulty",
        "--tasks",
        str(tasks),
        "--out",
        str(out),
        "--n",
        str(n),
        "--specs",
        str(specs),
        "--max-tasks",
        str(max_tasks),
        *arm.extra_args,
    ]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=arm.tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{arm.name}: the step failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    generated = json.loads((out / "rollouts" / "metrics.json").read_text())
    turns = [s["model_s_per_turn"] for s in generated["by_spec"].values()]
    return {
        "arm": arm.name,
        "wall_s": round(wall, 2),
        "generate_wall_s": round(metrics["generate_wall_s"], 2),
        "verify_wall_s": metrics["verify_wall_s"],
        "model_s_per_turn": round(statistics.mean(turns), 3),
        "rollouts_per_hour": round(metrics["rollouts_per_hour"], 1),
        "rollouts": metrics["rollouts"],
        "load": round(load, 2),
    }


def check_imports_from(tree: Path) -> None:
    """The child process must import harnessrl from `tree`, not from the editable install of this checkout."""
    proc = subprocess.run(
        [sys.executable, "-c", "import harnessrl; print(harnessrl.__file__)"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
    )
    if not Path(proc.stdout.strip()).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: harnessrl is imported from {proc.stdout.strip()}, not from the tree")


def ratio(runs: list[dict], base: str, new: str, key: str, higher_is_better: bool = False) -> float:
    b = statistics.median(r[key] for r in runs if r["arm"] == base)
    n = statistics.median(r[key] for r in runs if r["arm"] == new)
    return round(n / b if higher_is_better else b / n, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each arm, alternating")
    ap.add_argument("--tasks", type=Path, help="task-set dir (default: the demo's 4 tasks, built here)")
    ap.add_argument("--skip-same-settings", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="every arm once: 1 task, 1 rollout of 1 turn x 8 tokens (seconds)",
    )
    args = ap.parse_args()
    if args.smoke:
        args.repeats = 1
    n, max_tasks = (1, 1) if args.smoke else (DEMO_N, DEMO_MAX_TASKS)

    from harnessrl.progress import track
    from pipelines.demo import DEMO_SPECS

    with tempfile.TemporaryDirectory(prefix="harnessrl-demo-steps-") as tmp:
        work = Path(tmp)
        baseline = work / "baseline"
        add_worktree(args.baseline_rev, baseline)
        try:
            check_imports_from(baseline)
            tasks = args.tasks or demo_tasks(work, args.smoke)
            specs = work / "specs.json"
            specs.write_text(SMOKE_SPECS if args.smoke else DEMO_SPECS)
            arms = [Arm("baseline", baseline)]
            if not args.skip_same_settings:
                arms.append(Arm("baseline-same-settings", baseline, ("--concurrency", "8")))
            arms.append(Arm("current", ROOT))
            plan = [(rep, arm) for rep in range(args.repeats) for arm in arms]
            runs = []
            for rep, arm in track(plan, "estimate-difficulty runs", len(plan)):
                run = run_step(arm, tasks, work / f"out-{arm.name}-{rep}", specs, n, max_tasks)
                runs.append(run)
                print(json.dumps(run), file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=False
            )

    print(f"{'arm':24s} {'step s':>8s} {'generate s':>11s} {'model s/turn':>13s} {'rollouts/h':>11s}")
    for run in runs:
        print(
            f"{run['arm']:24s} {run['wall_s']:8.1f} {run['generate_wall_s']:11.1f} "
            f"{run['model_s_per_turn']:13.2f} {run['rollouts_per_hour']:11.0f}"
        )
    headline: dict[str, object] = {
        "difficulty_step_speedup": ratio(runs, "baseline", "current", "wall_s"),
        "generate_speedup": ratio(runs, "baseline", "current", "generate_wall_s"),
        "model_s_per_turn_speedup": ratio(runs, "baseline", "current", "model_s_per_turn"),
        "rollouts_per_hour_speedup": ratio(runs, "baseline", "current", "rollouts_per_hour", True),
    }
    if not args.skip_same_settings:
        headline |= {
            "same_settings_step_speedup": ratio(runs, "baseline-same-settings", "current", "wall_s"),
            "same_settings_model_s_per_turn_speedup": ratio(
                runs, "baseline-same-settings", "current", "model_s_per_turn"
            ),
        }
    for arm in {run["arm"] for run in runs}:
        headline[f"{arm.replace('-', '_')}_step_s"] = statistics.median(
            r["wall_s"] for r in runs if r["arm"] == arm
        )
    headline |= {
        "baseline_rev": args.baseline_rev,
        "repeats": args.repeats,
        "loads": [r["load"] for r in runs],
    }
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
