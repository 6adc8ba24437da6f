"""`harnessrl demo`: the full pipeline locally on the embedded default, SmolLM2-135M on the CPU.

A SWE task set synthesized from a small real package (parse==1.22.4) → clean → validate → Best-of-N
difficulty (N=2, our ReAct harness, 2 turns of at most 32 tokens) → select. The tiny model solves none of
these, so the task-family step (`rl_family=auto`) says so and hands the RL loop an instruction-following
family instead: 64 generated requests, each answered in one whole sentence of at least 12 words that names a
word of the request and holds IFEval's "placeholders" constraint (N words in square brackets); 40 held out on
base requests the training tasks never use, half of them with constraint kinds never trained (reported apart).
The loop (colocated async: rollouts through the chat harness and the recording gateway, verification, Dr. GRPO,
in-place weight sync) runs 6 steps of 4 groups × 8 rollouts; the evaluation
compares base vs trained on the 40 held-out tasks, 4 sampled rollouts each, with a paired interval; the run
summary's first line says whether training helped, and through which harness. `--harness claude-code` (or
`codex`) runs the RL step and the evaluation through that production CLI instead (CLI_FAMILY_SPECS).
"""

from __future__ import annotations

import json
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


# The loop's settings: Dr. GRPO (group-mean baseline, no division by the group's spread) with each reply's
# token losses summed over a fixed 128-token horizon instead of averaged over the reply's own length: averaged,
# a long wrong reply is pushed down less per token than a short one, and replies grew run after run (59 -> 105
# tokens within 3 steps, 58% cut off by the budget: docs/environments.md, "The demo's family"). The engine
# samples in the format this host multiplies faster (bfloat16 on a Xeon with AMX, ~3x float32's rate; float32
# elsewhere); the trainer stays float32: in bfloat16 too (1.8x) the loop's steps took 275 s instead of 413 s,
# but the stage peaked at 4.55 GB instead of 3.87 GB.
DEMO_TRAIN_SETTINGS: dict[str, object] = {
    "optim": {"lr": 3e-5},
    "loss_mode": "seq-mean-token-sum-norm",
    "loss_scale_factor": 128,
}
DEMO_RL_SETTINGS: dict[str, object] = {
    "verify_timeout_s": 60,
    "estimator": "drgrpo",
    "engine_dtype": "auto",
    "train": DEMO_TRAIN_SETTINGS,
}
DEMO_RL_CONFIG = json.dumps(DEMO_RL_SETTINGS)


# The family the loop trains on when the SWE tasks give the tiny model no headroom: whole one-sentence replies
# of >= 12 words holding a word of the request (a short, empty, echoed or cut-off reply meets nothing), with
# IFEval's "placeholders" constraint; a reply scores 1 only when it meets all three (instruction_strict), within
# a 128-token budget 94% of the base policy's replies end within on their own. Base pass rate 0.26 on the
# held-out requests of this kind.
DEMO_FAMILY_KINDS = "placeholders"
DEMO_FAMILY_MIN_WORDS = 12
DEMO_FAMILY_SPECS = '[{"harness": "chat", "reward": "instruction_strict", "limits": {"tokens": 128}}]'
# `harnessrl demo --harness claude-code | codex`: the same family, RL step and evaluation through the production
# CLI, unchanged, in a bubblewrap sandbox (a scratch workspace: docs/environments.md), each model call held to
# the same 128-token reply budget by the gateway. Claude Code runs `bare` with no tools (the request is answered
# in its reply, its `result`). Both CLIs take the tiny model's own default system prompt in place of theirs (a
# CLI option): under Claude Code's more replies run into the budget (the first RL step: 51% of calls vs 42%),
# and Claude Code asks 3 times to continue a cut reply (4 calls for nothing); Codex's first prompt drops from
# 5.2k tokens to 1.4k (its function tools stay). A CLI rollout costs seconds of CPU on top of its model time,
# so the CLI demos evaluate 2 sampled rollouts per held-out task instead of 4.
SMOLLM_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


# Claude Code's rollouts get a context window of the request and one reply (its first prompts: 171-192 tokens,
# + 128): its own request to continue a cut reply (the cut reply and a ~51-token "resume" note appended) does
# not fit, and the CLI ends as it does on any full context, after one model call instead of four. A cut reply
# scores 0 either way (its continuations' answers did too: 11 of 11 measured), but the continuations were most
# of the tokens the engine sampled and the trainer computed (an evaluation of 80: 9,216 of 12,962 sampled).
CLAUDE_CODE_WINDOW = 336


def _cli_spec(harness: str, options: dict[str, object], context_tokens: int | None = None) -> str:
    limits: dict[str, object] = {"reply_tokens": 128, "turns": 2, "wall_s": 300}
    if context_tokens is not None:
        limits["context_tokens"] = context_tokens
    return json.dumps(
        [{"harness": harness, "reward": "instruction_strict", "options": options, "limits": limits}]
    )


CLI_FAMILY_SPECS = {
    "claude-code": _cli_spec(
        "claude-code", {"bare": True, "tools": [], "system_prompt": SMOLLM_SYSTEM_PROMPT}, CLAUDE_CODE_WINDOW
    ),
    "codex": _cli_spec("codex", {"model": "gpt-5.1-codex-max", "base_instructions": SMOLLM_SYSTEM_PROMPT}),
}
CLI_EVAL_K = 2
# The CLI demos' loop: the chat demo's settings, but 32 rollouts in flight (one step's: each waiting CLI process
# costs CPU beside the engine, and 64 at once spent ~45 s each starting on 2 cores), and the trainer keeping
# each layer's activations instead of recomputing them (one forward less: a step of the Claude Code demo's
# shape 57 s instead of 70 s on 2 cores, ~0.5 GB more at its peak). 5 steps instead of 6 did not teach it
# enough: held-out +0.037 [-0.075, +0.150] in one run.
CLI_RL_CONFIG = json.dumps(
    {
        **DEMO_RL_SETTINGS,
        "concurrency": 32,
        "train": {**DEMO_TRAIN_SETTINGS, "activation_checkpointing": False},
    }
)
HARNESSES = ("chat", *CLI_FAMILY_SPECS)


def demo_arguments(source: Path, max_tasks: int, harness: str = "chat") -> dict[str, object]:
    from harnessrl.tinymodel import tiny_model_dir

    cli = harness in CLI_FAMILY_SPECS
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
        "family_specs_json": CLI_FAMILY_SPECS[harness] if cli else DEMO_FAMILY_SPECS,
        "mode": "colocated",
        "steps": 6,
        "batch_groups": 4,
        "group_size": 8,
        "config_json": CLI_RL_CONFIG if cli else DEMO_RL_CONFIG,
        "eval_k": CLI_EVAL_K if cli else 4,
    }


def run_demo(
    run_dir: str | Path | None = None,
    max_tasks: int = 4,
    source: Path | None = None,
    harness: str = "chat",
) -> RunResult:
    """`harness`: the harness the RL step and the evaluation run through (chat, or a CLI that must be
    installed: `make cli-agents`)."""
    from harnessrl.harness.cli_agents import skip_reason

    console = Console(file=sys.stdout, soft_wrap=True)
    if harness not in HARNESSES:
        raise ValueError(f"--harness {harness!r}: one of {', '.join(HARNESSES)}")
    if source is not None and not source.exists():
        raise FileNotFoundError(f"--source {source}: no such file or directory")
    if harness in CLI_FAMILY_SPECS and (why := skip_reason(harness)) is not None:
        raise FileNotFoundError(f"--harness {harness}: {why}")
    source = source or demo_source(console)
    return run_local(
        "harnessrl-full",
        demo_arguments(source, max_tasks, harness),
        run_dir or default_run_dir("demo" if harness == "chat" else f"demo-{harness}"),
        console=console,
    )
