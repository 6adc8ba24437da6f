"""Agent Lightning's ablation of rollout-level statistics, reproduced through the whole stack on a workload whose
rollouts yield several samples.

The seed reports validation reward 35.0% with sample-level advantages, 33.1% with rollout-level advantages
only, and 38.2% with rollout-level advantages and rollout-level loss normalisation (with slower entropy
growth). Here, as a user runs it, for each seed: the demo's family (whole one-sentence replies of
`--min-words` words holding a word of the request, IFEval's placeholders constraint, `instruction_strict`),
answered by the chat harness as a self-checking agent (`options.reviews`: after its reply the agent asks
itself, in a new conversation, whether the reply follows every instruction, and rewrites it in another new
conversation unless the answer is yes) — every call a context the previous one did not sample, so the gateway
splits and a rollout yields 2 to 1 + 2 × reviews samples, as many as the model's own answers make it. Then
`harnessrl stage rl` once per setting, from the same base, seed and tasks:

  a  sample-level advantage  + seq-mean-token-mean   (each sample its own member of the group)
  b  rollout-level advantage + seq-mean-token-mean   (a rollout's samples share its advantage)
  c  rollout-level advantage + rollout-token-mean    (and each rollout weighs the same in the loss)

and one `harnessrl stage evaluate` of the base and the three trained policies on the held-out requests
(sampled, the same spec). GRPO (group mean and std, as the seed's verl runs), the demo's learning rate.

Per setting, over seeds: the held-out mean reward (pass@1 of the strict reward, each task's mean over seeds)
with the bootstrap 95% interval over tasks, the paired difference against the base with its interval, and the
policy entropy per step (the trainer's, over trained tokens); `entropy_growth` is the last step's minus the
first's, averaged over seeds. The measured samples per rollout and the share of rollouts that stayed one sample
come from the runs' `steps.jsonl`. The plot (`--plot`, default `ablation_rollout_level.png` in the run folder)
shows the held-out means with intervals and the entropy per step.

    .venv/bin/python benchmarks/ablation_rollout_level.py            # 3 settings x 3 seeds, ~75 min on 2 quiet cores
    .venv/bin/python benchmarks/ablation_rollout_level.py --seeds 0 1 2 3 4 --steps 6
    .venv/bin/python benchmarks/ablation_rollout_level.py --smoke    # 1 seed, 1 step, 2 tasks (~3 min)

Last line: JSON with `<a|b|c>_heldout_mean`, `<a|b|c>_ci_low`, `<a|b|c>_ci_high`, `<a|b|c>_diff` (against the
base, paired over tasks) with `<a|b|c>_diff_ci_low`/`_high`, `<a|b|c>_entropy_growth`, `base_heldout_mean`,
`samples_per_rollout_mean`, `single_sample_share`, `ranking` (best first), `seeds`, `minutes`. Whatever the
ranking, it is reported; `--smoke` figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.learning_envs import harnessrl, instruction_tasks
from harnessrl.evaluate.results import compare, task_scores
from harnessrl.evaluate.stats import paired_bootstrap
from harnessrl.io import read_jsonl
from harnessrl.train.modes import AdvantageLevel, LossMode

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Setting:
    name: str
    advantage_level: AdvantageLevel
    loss_mode: LossMode

    @property
    def label(self) -> str:
        return f"{self.name}: {self.advantage_level} advantage, {self.loss_mode}"


SETTINGS = (
    Setting("a", AdvantageLevel.SAMPLE, LossMode.SEQ_MEAN_TOKEN_MEAN),
    Setting("b", AdvantageLevel.ROLLOUT, LossMode.SEQ_MEAN_TOKEN_MEAN),
    Setting("c", AdvantageLevel.ROLLOUT, LossMode.ROLLOUT_TOKEN_MEAN),
)


def rl_config(setting: Setting, lr: float) -> dict[str, Any]:
    return {
        "verify_timeout_s": 60,
        "estimator": "grpo",
        "engine_dtype": "auto",
        "advantage_level": setting.advantage_level,
        "train": {"optim": {"lr": lr}, "loss_mode": setting.loss_mode},
    }


def self_checking_specs(args: argparse.Namespace) -> str:
    spec = {
        "harness": "chat",
        "reward": "instruction_strict",
        "limits": {"tokens": args.reply_tokens},
        "options": {"reviews": args.reviews},
    }
    return json.dumps([spec])


def run_seed(
    seed: int, args: argparse.Namespace, root: Path
) -> tuple[dict[str, dict], dict[str, list[dict]]]:
    """Tasks for this seed, one RL run per setting, one evaluation of all of them; each policy's evaluation
    result, and each setting's step rows."""
    args.seed = seed  # instruction_tasks draws the requests from args.seed
    train, test, _ = instruction_tasks(args, root / "tasks")
    specs = self_checking_specs(args)
    steps: dict[str, list[dict]] = {}
    policies = ["--policy", "base=base"]
    for setting in SETTINGS:
        out = root / f"rl-{setting.name}"
        config = root / f"rl-{setting.name}.json"
        config.write_text(json.dumps(rl_config(setting, args.lr)))
        if (out / "model").is_dir():  # a rerun into the same --out keeps what an earlier run finished
            logger.info("%s: trained already", out)
        else:
            harnessrl(
                "stage", "rl", "--tasks", str(train), "--out", str(out), "--mode", "colocated",
                "--steps", str(args.steps), "--batch-groups", str(args.batch_groups),
                "--group-size", str(args.group_size), "--specs", specs, "--config", str(config),
                "--seed", str(seed),
            )  # fmt: skip
        steps[setting.name] = list(read_jsonl(out / "steps.jsonl"))
        policies += ["--policy", f"{setting.name}={out / 'model'}"]
    evaluated = root / "eval" / "evaluation.json"
    if not evaluated.is_file():
        harnessrl(
            "stage", "evaluate", "--tasks", str(test), "--out", str(root / "eval"), *policies,
            "--k", str(args.k), "--specs", specs, "--concurrency", str(args.concurrency), "--seed", str(seed),
        )  # fmt: skip
    evaluation = json.loads(evaluated.read_text())
    return {r["policy"]: r for r in evaluation["results"]}, steps


SETTING_FLAGS = (
    "kinds", "train_tasks", "heldout_tasks", "steps", "batch_groups", "group_size", "lr", "reply_tokens",
    "min_words", "reviews", "k",
)  # fmt: skip


def same_settings_as_before(root: Path, args: argparse.Namespace, flags: tuple[str, ...]) -> None:
    """A rerun into a run folder keeps its finished runs only under the same settings (`flags`, the args that
    shape the runs): others are refused."""
    mine = {flag: getattr(args, flag) for flag in flags}
    record = root / "settings.json"
    if record.is_file():
        before = json.loads(record.read_text())
        changed = sorted(flag for flag in mine if before.get(flag) != mine[flag])
        if changed:
            named = ", ".join("--" + flag.replace("_", "-") for flag in changed)
            raise SystemExit(
                f"{root} holds runs made with other settings ({named}): give another --out, or the same "
                "settings to finish those runs"
            )
    root.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(mine))


def interval_of_mean(scores: list[float], seed: int) -> tuple[float, float]:
    """The bootstrap 95% interval of a mean over tasks (the paired bootstrap against all-zero scores)."""
    boot = paired_bootstrap([0.0] * len(scores), scores, seed=seed)
    return boot.low, boot.high


def pooled_scores(results: list[dict[str, Any]]) -> dict[str, float]:
    """Each task's pass@1, averaged over the seeds that scored it (the held-out tasks differ per seed)."""
    by_task: dict[str, list[float]] = {}
    for result in results:
        for task, score in task_scores(result).items():
            by_task.setdefault(task, []).append(score)
    return {task: sum(s) / len(s) for task, s in by_task.items()}


def as_result(policy: str, scores: dict[str, float]) -> dict[str, Any]:
    """Pooled per-task scores in the shape `compare` reads (one graded rollout resolving that fraction)."""
    return {
        "policy": policy,
        "mode": "sampled",
        "per_task": {t: {"resolved": s, "graded": 1} for t, s in scores.items()},
    }


def summarize(per_seed: list[tuple[dict[str, dict], dict[str, list[dict]]]], seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = pooled_scores([results["base"] for results, _ in per_seed])
    out["base_heldout_mean"] = sum(base.values()) / len(base)
    for setting in SETTINGS:
        name = setting.name
        trained = pooled_scores([results[name] for results, _ in per_seed])
        scores = list(trained.values())
        out[f"{name}_heldout_mean"] = sum(scores) / len(scores)
        out[f"{name}_ci_low"], out[f"{name}_ci_high"] = interval_of_mean(scores, seed)
        paired = compare(as_result("base", base), as_result(name, trained), seed=seed)
        out[f"{name}_diff"] = paired["diff"]
        out[f"{name}_diff_ci_low"], out[f"{name}_diff_ci_high"] = paired["low"], paired["high"]
        runs = [entropies(steps[name]) for _, steps in per_seed]
        growth = [run[-1] - run[0] for run in runs if len(run) >= 2]
        out[f"{name}_entropy_growth"] = sum(growth) / len(growth) if growth else None
        out[f"{name}_entropy_per_step"] = [
            mean([run[i] for run in runs if len(run) > i]) for i in range(max(map(len, runs)))
        ]
    rows = [row for _, steps in per_seed for setting_rows in steps.values() for row in setting_rows]
    weights = [row["sampled_rollouts"] for row in rows]
    out["samples_per_rollout_mean"] = weighted([row["samples_per_rollout_mean"] for row in rows], weights)
    out["single_sample_share"] = weighted([row["single_sample_share"] for row in rows], weights)
    out["ranking"] = "".join(sorted((s.name for s in SETTINGS), key=lambda n: -out[f"{n}_heldout_mean"]))
    return out


def entropies(rows: list[dict[str, Any]]) -> list[float]:
    """The policy entropy of each step that trained (a step without a group of mixed outcomes has none)."""
    return [row["entropy"] for row in rows if row.get("entropy") is not None]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def weighted(values: list[float | None], weights: list[int]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def plot(summary: dict[str, Any], path: Path) -> None:
    from harnessrl.reports import figure_png, new_figure

    fig, axes = new_figure(3.6, ncols=2)
    means, entropy = axes[0]
    names = [s.name for s in SETTINGS]
    values = [summary[f"{n}_heldout_mean"] for n in names]
    errors = [
        [v - summary[f"{n}_ci_low"] for n, v in zip(names, values, strict=True)],
        [summary[f"{n}_ci_high"] - v for n, v in zip(names, values, strict=True)],
    ]
    means.bar(names, values, yerr=errors, capsize=6, color=["#999999", "#4c72b0", "#55a868"])
    means.axhline(summary["base_heldout_mean"], color="black", linestyle="--", label="base")
    means.set_title("held-out reward, 95% interval", fontsize=9)
    means.legend()
    for setting in SETTINGS:
        series = summary[f"{setting.name}_entropy_per_step"]
        if series:
            entropy.plot(range(1, len(series) + 1), series, "o-", label=setting.label)
            entropy.set_xticks(range(1, len(series) + 1))
    entropy.set_title("policy entropy per trained step, seeds' mean", fontsize=9)
    entropy.set_xlabel("trained step")
    if any(summary[f"{s.name}_entropy_per_step"] for s in SETTINGS):
        entropy.legend(fontsize=7)
    else:
        entropy.text(
            0.5,
            0.5,
            "no step trained: no group had\nboth outcomes, so no entropy",
            ha="center",
            va="center",
            transform=entropy.transAxes,
        )
    path.write_bytes(figure_png(fig))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--kinds", nargs="+", default=["placeholders"], help="the trained constraint kinds")
    p.add_argument("--train-tasks", type=int, default=32)
    p.add_argument("--heldout-tasks", type=int, default=24, help="half of them of kinds never trained")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--reply-tokens", type=int, default=128)
    p.add_argument("--min-words", type=int, default=12)
    p.add_argument(
        "--reviews", type=int, default=1, help="the agent's review rounds (samples: 2 to 1 + 2 x this)"
    )
    p.add_argument("--k", type=int, default=2, help="evaluation rollouts per held-out task")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--out", type=Path, help="run folder (default: a temporary one); a rerun into it keeps what is done"
    )
    p.add_argument("--plot", type=Path, help="where the plot goes (default: the run folder)")
    p.add_argument(
        "--smoke", action="store_true", help="1 seed, 1 step, 2 tasks each (the figures mean nothing)"
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.smoke:
        args.seeds, args.train_tasks, args.heldout_tasks, args.steps = [0], 2, 2, 1
        args.batch_groups, args.group_size, args.k, args.reply_tokens = 1, 2, 1, 8
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ablation-") as scratch:
        root = args.out or Path(scratch)
        same_settings_as_before(root, args, SETTING_FLAGS)
        per_seed = []
        for seed in list(args.seeds):
            per_seed.append(run_seed(seed, args, root / f"seed-{seed}"))
            logger.info("seed %d done (%.1f min)", seed, (time.perf_counter() - started) / 60)
        summary = summarize(per_seed, seed=args.seeds[0])
        figure = args.plot or root / "ablation_rollout_level.png"
        plot(summary, figure)
    for setting in SETTINGS:
        n = setting.name
        print(
            f"{setting.label}: held-out {summary[f'{n}_heldout_mean']:.3f} "
            f"[{summary[f'{n}_ci_low']:.3f}, {summary[f'{n}_ci_high']:.3f}], vs base {summary[f'{n}_diff']:+.3f} "
            f"[{summary[f'{n}_diff_ci_low']:+.3f}, {summary[f'{n}_diff_ci_high']:+.3f}], "
            f"entropy growth {summary[f'{n}_entropy_growth']}",
            flush=True,
        )
    print(
        f"base {summary['base_heldout_mean']:.3f}; samples per rollout {summary['samples_per_rollout_mean']}, "
        f"single-sample share {summary['single_sample_share']}; plot: {figure}"
        + (
            ""
            if args.out or args.plot
            else " (removed with the temporary run folder: give --plot to keep it)"
        )
    )
    summary.update(
        seeds=list(args.seeds),
        minutes=round((time.perf_counter() - started) / 60, 2),
        load_avg=os.getloadavg()[0],
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
