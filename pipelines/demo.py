"""`harnessrl demo`: the full pipeline locally on the embedded default.

A task set synthesized from a small real package (parse==1.22.4) → clean → validate → Best-of-N difficulty →
select → the RL loop in colocated async mode (rollouts, verification, GRPO steps, in-place weight sync) →
evaluation of base vs trained on the held-out task, with SmolLM2-135M on the CPU. Sizes are cut so it
finishes in minutes on 2 cores: 4 tasks (3 to train on, 1 held out), N=2, 2 turns of at most 32 sampled
tokens, 2 loop steps of one group each (at most 2 groups tried per step), 2 evaluation rollouts per policy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console

from pipelines.local_run import RunResult, default_run_dir, run_local

DEMO_PACKAGE = "parse==1.22.4"
SOURCES_CACHE = Path.home() / ".cache" / "harnessrl" / "sources"
REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE_REPO = REPO_ROOT / "tests" / "fixtures" / "minirepo"


def cached_sdist(requirement: str = DEMO_PACKAGE, cache: Path = SOURCES_CACHE) -> Path | None:
    """The sdist of `requirement`, downloaded once with pip into `cache`; None when offline."""
    name, version = requirement.split("==")
    pattern = f"{name}-{version}.tar.gz"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(cache),
            requirement,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = sorted(cache.glob(pattern))
    return found[0] if proc.returncode == 0 and found else None


def demo_source(console: Console, cache: Path = SOURCES_CACHE) -> Path:
    sdist = cached_sdist(cache=cache)
    if sdist is not None:
        console.print(f"source: {sdist} ({DEMO_PACKAGE} sdist, cached)", highlight=False)
        return sdist
    if FIXTURE_REPO.is_dir():
        console.print(
            f"[yellow]could not download {DEMO_PACKAGE} (offline?); using the test fixture "
            f"{FIXTURE_REPO} instead[/]",
            highlight=False,
        )
        return FIXTURE_REPO
    raise FileNotFoundError(
        f"could not download {DEMO_PACKAGE} and {FIXTURE_REPO} is missing: pass --source <repo dir or sdist>"
    )


# One harness spec for every rollout: our ReAct loop in bubblewrap, budgets sized for a CPU.
DEMO_SPECS = '[{"harness": "react", "sandbox": "bubblewrap", "limits": {"turns": 2}, "options": {"max_tokens_per_turn": 32}}]'


# The loop's budget per step: groups without reward variance are replaced, here by at most one more group.
DEMO_RL_CONFIG = '{"max_groups_per_step": 2, "verify_timeout_s": 60}'


def demo_arguments(source: Path, max_tasks: int) -> dict[str, object]:
    from harnessrl.tinymodel import tiny_model_dir

    return {
        "source_uri": str(source),
        "base_model_uri": str(tiny_model_dir()),
        "max_tasks": max_tasks,
        "seed": 0,
        "group_size": 2,
        "difficulty_n": 2,
        "k_all_fail": max_tasks,
        "test_fraction": 0.25,  # of 4 tasks: 1 held out for the evaluation, 3 to train on
        "specs_json": DEMO_SPECS,
        "mode": "colocated",
        "steps": 2,
        "batch_groups": 1,
        "config_json": DEMO_RL_CONFIG,
        "eval_k": 2,
    }


def run_demo(run_dir: str | Path | None = None, max_tasks: int = 4, source: Path | None = None) -> RunResult:
    console = Console(file=sys.stdout, soft_wrap=True)
    if source is not None and not source.exists():
        raise FileNotFoundError(f"--source {source}: no such file or directory")
    source = source or demo_source(console)
    return run_local(
        "harnessrl-full",
        demo_arguments(source, max_tasks),
        run_dir or default_run_dir("demo"),
        console=console,
    )
