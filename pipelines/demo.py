"""`harnessrl demo`: the full pipeline locally on the embedded default, SmolLM2-135M on the CPU.

A SWE task set synthesized from a small real package (parse==1.22.4) → clean → validate → Best-of-N
difficulty (N=2, our ReAct harness, 2 turns of at most 32 tokens) → select. The tiny model solves none of
these, so the task-family step (`rl_family=auto`) says so and hands the RL loop an instruction-following
family instead: 64 generated requests with IFEval's "no commas" constraint; 40 held out on base requests the
training tasks never use, half of them with constraint kinds never trained (reported apart). The loop
(colocated async: rollouts through the chat harness and the recording gateway, verification, GRPO, in-place
weight sync) runs 6 steps of 4 groups × 8 rollouts; the evaluation
compares base vs trained on the 40 held-out tasks, 4 sampled rollouts each, with a paired interval; the run
summary's first line says whether training helped.
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


# The loop's settings: GRPO at a learning rate that moves the tiny model within a few steps.
DEMO_RL_CONFIG = '{"verify_timeout_s": 60, "train": {"optim": {"lr": 3e-5}}}'

# The family the loop trains on when the SWE tasks give the tiny model no headroom: requests with IFEval's
# "no commas" constraint, answered in one reply of <= 48 tokens. Known to teach a shortcut as well: most base
# replies run past 48 tokens, and a reply the budget cuts off earns 0 (the on-task guard), so part of what the
# policy learns is to finish early — the run summary shows it (reply tokens and the share cut off, per step
# and per policy). The family without it (whole one-sentence replies of >= 12 words holding a word of the
# request, family_min_words=12, 128 tokens) did not learn within the demo's 6 steps yet (docs/environments.md).
DEMO_FAMILY_KINDS = "no_commas"
DEMO_FAMILY_MIN_WORDS = 0
DEMO_FAMILY_SPECS = '[{"harness": "chat", "limits": {"tokens": 48}}]'


def demo_arguments(source: Path, max_tasks: int) -> dict[str, object]:
    from harnessrl.tinymodel import tiny_model_dir

    return {
        "source_uri": str(source),
        "base_model_uri": str(tiny_model_dir()),
        "max_tasks": max_tasks,
        "seed": 0,
        "difficulty_n": 2,
        "k_all_fail": max_tasks,
        "test_fraction": 0.25,  # of 4 tasks: 1 held out for the evaluation, 3 to train on
        "specs_json": DEMO_SPECS,
        "rollout_concurrency": 16,
        "rl_family": "auto",
        "family_train_tasks": 64,
        "family_held_out_tasks": 40,
        "family_kinds": DEMO_FAMILY_KINDS,
        "family_min_words": DEMO_FAMILY_MIN_WORDS,
        "family_specs_json": DEMO_FAMILY_SPECS,
        "mode": "colocated",
        "steps": 6,
        "batch_groups": 4,
        "group_size": 8,
        "config_json": DEMO_RL_CONFIG,
        "eval_k": 4,
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
