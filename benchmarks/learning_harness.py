"""Learning through each harness, and the cross-harness matrix: does a policy trained through one harness do
better through another?

As a user runs it: the demo's family (whole one-sentence replies of `--min-words` words holding a word of the
request, IFEval's placeholders constraint, `instruction_strict`; held out: half trained kinds, half one-sentence
kinds never trained), then `harnessrl stage rl` once per training harness from the same base, tasks, steps and
seed, with the demo's loss (Dr. GRPO, token losses summed over the reply budget):

  chat         one reply per rollout (the demo's harness)
  react        our ReAct loop with only the `answer` tool (a reply without a tool call is the answer), 2 turns
  claude-code  the real Claude Code CLI, `bare`, no tools, the tiny model's own system prompt (the demo's spec)
  codex        the real Codex CLI (the demo's spec)
  mixed        one run whose spec list holds all four: each group's rollouts take them round-robin (a
               per-sample harness, as Uni-Agent does)
  mixed-groups the same four dealt one per group (`spec_mix: group`): each group's baseline compares
               rollouts of one harness, so a harness's own pass rate is not part of an advantage

every model call held to `--reply-tokens` by the gateway. Then `harnessrl stage evaluate` of the base and every
trained policy *through every harness* on the held-out requests (sampled, `--k` per task, the same seed), and
the paired bootstrap over tasks of trained − base per (trained-through, evaluated-through) pair. Per harness, the
rollout-level statistics of its rollouts in the training runs (the RL runs' rollout rows and gateway journals):
samples per rollout and the share that stayed one sample, calls, rollbacks and trainable tokens rollbacks
discarded per rollout, and seconds per rollout. The plot (`--plot`, default `learning_harness.png` in the run
folder) is the matrix of trained − base with its intervals.

    .venv/bin/python benchmarks/learning_harness.py --out runs/lh           # the whole matrix (hours on 2 cores)
    .venv/bin/python benchmarks/learning_harness.py --out runs/lh --train-through chat claude-code \
        --eval-through chat claude-code                                     # a part of it; a rerun adds the rest
    .venv/bin/python benchmarks/learning_harness.py --smoke                 # mixed only, 1 step (~3 min)

A rerun into the same `--out` keeps every finished training run and evaluation (the settings must match: others
are refused), so the matrix can be filled a part at a time. The CLIs come from `make cli-agents`; a harness whose
CLI is missing is refused in one line.

Last line: JSON with `<train>__<eval>_diff`, `<train>__<eval>_ci_low` (and `_ci_high`, `_pass_at_1`) for every
pair measured, `base__<eval>_pass_at_1`, `rollout_stats` (per harness), `train_minutes` (each RL loop's own wall
time),
`minutes`. `--smoke` figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.ablation_rollout_level import same_settings_as_before
from benchmarks.learning_envs import (
    add_family_arguments,
    evaluate_policies,
    harnessrl,
    instruction_tasks,
    paired_figures,
)
from harnessrl.io import read_jsonl

logger = logging.getLogger(__name__)

HARNESSES = ("chat", "react", "claude-code", "codex")
MIXED = "mixed"
MIXED_GROUPS = "mixed-groups"
MIXES = (MIXED, MIXED_GROUPS)
CLIS = ("claude-code", "codex")
CLI_WALL_S = 900


def harness_spec(harness: str, reply_tokens: int) -> dict[str, Any]:
    """The spec each harness answers the family's requests under: the same reward and reply budget."""
    from pipelines.demo import CLI_FAMILY_SPECS

    if harness == "chat":
        return {"harness": "chat", "reward": "instruction_strict", "limits": {"tokens": reply_tokens}}
    if harness == "react":
        return {
            "harness": "react",
            "reward": "instruction_strict",
            "tools": ["answer"],
            "limits": {"turns": 2, "reply_tokens": reply_tokens},
            "options": {"max_tokens_per_turn": reply_tokens, "on_no_tool_call": "end"},
        }
    (spec,) = json.loads(CLI_FAMILY_SPECS[harness])
    # 64 rollouts in flight on 2 shared cores: a CLI rollout's wall clock is mostly its wait for the engine, and
    # the demo's 300 s killed a quarter of Codex's first wave (its 1.4k-token prompts) with other work beside it
    spec["limits"].update(reply_tokens=reply_tokens, wall_s=CLI_WALL_S)
    return spec


def specs_of(through: str, reply_tokens: int) -> str:
    harnesses = HARNESSES if through in MIXES else (through,)
    return json.dumps([harness_spec(h, reply_tokens) for h in harnesses])


def rl_config(through: str, reply_tokens: int, lr: float) -> dict[str, Any]:
    """The demo's loop settings (pipelines/demo.py says why), the sum-norm horizon at the reply budget."""
    from pipelines.demo import DEMO_RL_CONFIG

    config = json.loads(DEMO_RL_CONFIG)
    config["train"].update(optim={"lr": lr}, loss_scale_factor=reply_tokens)
    if through == MIXED_GROUPS:
        config["spec_mix"] = "group"
    return config


def train(through: str, args: argparse.Namespace, tasks: Path, root: Path) -> Path:
    """The policy trained through `through` (kept from an earlier run into the same folder)."""
    out = root / f"rl-{through}"
    if (out / "model").is_dir():
        logger.info("%s: trained already", out)
        return out
    config = root / f"rl-{through}.json"
    config.write_text(json.dumps(rl_config(through, args.reply_tokens, args.lr)))
    harnessrl(
        "stage", "rl", "--tasks", str(tasks), "--out", str(out), "--mode", "colocated",
        "--steps", str(args.steps), "--batch-groups", str(args.batch_groups), "--group-size", str(args.group_size),
        "--specs", specs_of(through, args.reply_tokens), "--config", str(config), "--seed", str(args.seed),
    )  # fmt: skip
    return out


def loop_minutes(run: Path) -> float:
    """The RL loop's own wall time (its last step's `wall_s`, resumed attempts included)."""
    rows = list(read_jsonl(run / "steps.jsonl"))
    return round(rows[-1]["wall_s"] / 60, 2) if rows else 0.0


@dataclass(frozen=True)
class RolloutStats:
    """What one harness's rollouts of the training runs add up to (per rollout, unless named a share)."""

    rollouts: int
    samples: float  # chains: each a sample of its own
    single_sample_share: float
    calls: float
    rollbacks: float
    discarded_trainable_tokens: float
    seconds: float


def rollout_stats(runs: list[Path]) -> dict[str, RolloutStats]:
    """Per harness, over every rollout of `runs` that made a model call."""
    from harnessrl.rl.rollout_log import journal_calls
    from harnessrl.rollout.trajectories import gateway_stats

    by_harness: dict[str, list[tuple[dict[str, Any], dict[str, int]]]] = {}
    for run in runs:
        rows = [row for path in sorted((run / "rollouts").glob("step-*.jsonl")) for row in read_jsonl(path)]
        calls = gateway_stats(journal_calls(run / "work" / "journal", {r["rollout_id"] for r in rows}))
        for row in rows:
            if row["rollout_id"] in calls:
                by_harness.setdefault(row["harness"], []).append((row, calls[row["rollout_id"]]))
    out = {}
    for harness, pairs in sorted(by_harness.items()):
        n = len(pairs)

        def mean(key: str, pairs: list[tuple[dict[str, Any], dict[str, int]]] = pairs, n: int = n) -> float:
            return round(sum(g[key] for _, g in pairs) / n, 3)

        out[harness] = RolloutStats(
            rollouts=n,
            samples=mean("chains"),
            single_sample_share=round(sum(g["chains"] == 1 for _, g in pairs) / n, 3),
            calls=mean("calls"),
            rollbacks=mean("rollbacks"),
            discarded_trainable_tokens=mean("discarded_trainable"),
            seconds=round(sum(r["wall_s"] for r, _ in pairs) / n, 2),
        )
    return out


def matrix(
    results: dict[str, dict[str, dict[str, Any]]], trained: list[str], seed: int
) -> dict[str, float | None]:
    """`<train>__<eval>_diff` / `_ci_low` / `_ci_high` / `_pass_at_1` against the base through the same harness,
    and `base__<eval>_pass_at_1`."""
    out: dict[str, float | None] = {}
    for through, by_policy in results.items():
        for name in trained:
            figures = paired_figures(by_policy["base"], by_policy[name], f"{name}__{through}", seed)
            out[f"base__{through}_pass_at_1"] = figures.pop("base_pass_at_1")
            out.update(figures)
    return out


def plot(figures: dict[str, Any], trained: list[str], evals: list[str], path: Path) -> None:
    from harnessrl.reports import figure_png, new_figure

    fig, axes = new_figure(1.2 + 0.7 * len(trained))
    ax = axes[0][0]
    grid = [[figures[f"{t}__{e}_diff"] for e in evals] for t in trained]
    image = ax.imshow(grid, cmap="RdBu", vmin=-0.5, vmax=0.5, aspect="auto")
    for i, t in enumerate(trained):
        for j, e in enumerate(evals):
            text = f"{figures[f'{t}__{e}_diff']:+.2f}\n[{figures[f'{t}__{e}_ci_low']:+.2f}, {figures[f'{t}__{e}_ci_high']:+.2f}]"
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(evals)), [f"{e}\n(base {figures[f'base__{e}_pass_at_1']:.2f})" for e in evals])
    ax.set_yticks(range(len(trained)), trained)
    ax.set_xlabel("evaluated through")
    ax.set_ylabel("trained through")
    ax.set_title("held-out pass@1, trained − base, paired 95% interval", fontsize=9)
    fig.colorbar(image, ax=ax)
    path.write_bytes(figure_png(fig))


SETTING_FLAGS = (
    "kinds", "train_tasks", "heldout_tasks", "steps", "batch_groups", "group_size", "lr", "reply_tokens",
    "min_words", "k", "seed",
)  # fmt: skip


def main() -> None:
    from harnessrl.harness.cli_agents import skip_reason

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-through", nargs="+", choices=[*HARNESSES, *MIXES], default=[*HARNESSES, *MIXES])
    p.add_argument("--eval-through", nargs="+", choices=HARNESSES, default=list(HARNESSES))
    add_family_arguments(p, k=2)
    p.add_argument(
        "--out", type=Path, help="run folder (default: a temporary one); a rerun into it keeps what is done"
    )
    p.add_argument("--plot", type=Path, help="where the plot goes (default: the run folder)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="trained through mixed only, 1 step of one group of 4, 1 held-out task (the figures mean nothing)",
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.smoke:
        args.train_through, args.train_tasks, args.heldout_tasks, args.steps = [MIXED], 1, 1, 1
        args.batch_groups, args.group_size, args.k, args.reply_tokens = 1, 4, 1, 8
    used = set(args.eval_through) | {
        h for t in args.train_through for h in (HARNESSES if t in MIXES else [t])
    }
    missing = [why for cli in CLIS if cli in used and (why := skip_reason(cli)) is not None]
    if missing:
        raise SystemExit("; ".join(missing))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="learning-harness-") as scratch:
        root = args.out or Path(scratch)
        same_settings_as_before(root, args, SETTING_FLAGS)
        train_tasks, test_tasks, _ = instruction_tasks(args, root / "tasks")
        runs = {through: train(through, args, train_tasks, root) for through in args.train_through}
        policies: dict[str, Path | None] = {"base": None, **{t: run / "model" for t, run in runs.items()}}
        results = {
            e: evaluate_policies(
                policies, specs_of(e, args.reply_tokens), args, test_tasks, root / f"eval-{e}"
            )
            for e in args.eval_through
        }
        figures: dict[str, Any] = matrix(results, list(runs), args.seed)
        stats = rollout_stats(list(runs.values()))
        figure = args.plot or root / "learning_harness.png"
        plot(figures, list(runs), list(args.eval_through), figure)
        minutes = {t: loop_minutes(run) for t, run in runs.items()}
    for t in runs:
        cells = ", ".join(
            f"{e} {figures[f'{t}__{e}_diff']:+.3f} [{figures[f'{t}__{e}_ci_low']:+.3f}, {figures[f'{t}__{e}_ci_high']:+.3f}]"
            for e in args.eval_through
        )
        print(f"trained through {t} ({minutes[t]} min), vs base evaluated through: {cells}", flush=True)
    print(
        "base pass@1: " + ", ".join(f"{e} {figures[f'base__{e}_pass_at_1']:.3f}" for e in args.eval_through)
    )
    for harness, s in stats.items():
        print(f"{harness} rollouts: {s}")
    print(f"plot: {figure}" + ("" if args.out or args.plot else " (removed with the temporary run folder)"))
    figures.update(
        rollout_stats={h: asdict(s) for h, s in stats.items()},
        train_minutes=minutes,
        minutes=round((time.perf_counter() - started) / 60, 2),
        load_avg=os.getloadavg()[0],
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
