"""Does training through the whole stack help, per environment? Base vs trained held-out pass@1, with intervals.

For each environment, as a user runs it: training and held-out task sets (disjoint), then `harnessrl stage rl`
(engine, recording gateway, the environment's harness, verification, GRPO, in-place weight sync; colocated
async) on the training tasks, then `harnessrl stage evaluate` of the base and the trained policy on the
held-out tasks (sampled rollouts, the paired bootstrap over tasks). Every step is the CLI in a subprocess.

- `instruction`: generated requests answered in one sentence of at least `--min-words` words holding a word of
  the request, with IFEval constraints (`--kinds`, default `placeholders`: the demo's family; docs/environments.md,
  "whole replies"), the chat harness, replies of at most `--reply-tokens` tokens, reward 1 only when a reply
  meets every constraint; trained alone, with the demo's loss (Dr. GRPO, token losses summed over a
  `--reply-tokens` horizon: pipelines/demo.py says why); held-out tasks use base requests
  the training tasks never use, half of them of the one-sentence kinds never trained: `instruction_trained_kinds_*`
  and `instruction_unseen_kinds_*` report the two apart, and `instruction_mean_reply_tokens`,
  `_length_finish_share`, `_distinct_2` what each policy's replies looked like.
- `swe`: SWE-smith-format tasks synthesized from tests/fixtures/minirepo (`--swe-source` for another repo or
  sdist), split into training and held-out tasks, our ReAct harness in bubblewrap. Reported honestly: the
  tiny model fixes no bug, so its figures are expected to stay at 0.
- `kernel`: the kernel task folders, every other one (in difficulty order) for training and the rest held
  out (`harnessrl tasks kernel --split train|test --timing quick`), the ReAct harness in bubblewrap
  (`--kernel-turns`); pass@1 counts a rollout resolved when its reward is 1 (correct and >= 2x faster).
- `search`: questions over the installed packages' documentation, training and held-out questions about
  disjoint packages (`harnessrl tasks search --split train|test`, `--search-kinds`), the ReAct harness with
  the search / read / answer tools (`--search-turns`; a reply without a tool call is the answer); exact match.
- `procedural`: reasoning-gym tasks (`--datasets`, `--difficulty`), training and held-out from different
  seeds (no training question repeated), the chat harness; the dataset's own scorer, full marks only, on the
  answer `--procedural-reward` extracts (default `procedural_exact`: the bare answer on the last line).

    .venv/bin/python benchmarks/learning_envs.py                 # every environment, ~1 h on 2 quiet cores
    .venv/bin/python benchmarks/learning_envs.py --envs instruction --steps 10
    .venv/bin/python benchmarks/learning_envs.py --smoke         # every step at its smallest (~3 min)

Last line: JSON with `<env>_base`, `<env>_trained` (held-out pass@1), `<env>_diff`, `<env>_ci_low`,
`<env>_ci_high` (the paired 95% interval of trained − base), `<env>_significant` per environment, and
`minutes`. Each environment trains its own policy from the base model (`--mixed`: one policy on the union
of the environments' training tasks, evaluated once on the union of their held-out tasks; the figures per
environment come from its own held-out tasks, each environment's rollouts under its own spec, and
`<env>_reward_per_step` is the mixed run's). `--smoke`:
`--mixed`, 1 to 4 training and 1 held-out task per environment, 1 RL step of one group of 2, 1 evaluation
rollout per task, replies (and ReAct turns) of 8 tokens, 1 turn; the figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harnessrl.io import read_jsonl

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
MINIREPO = REPO / "tests" / "fixtures" / "minirepo"
ENVS = ("instruction", "swe", "kernel", "search", "procedural")


def harnessrl(*args: str, timeout_s: float = 7200) -> str:
    """One CLI command, as a user types it; its stdout (the command fails loudly with its stderr's tail)."""
    cmd = [sys.executable, "-m", "harnessrl.cli", "--no-progress", *args]
    logger.info("$ harnessrl %s", " ".join(args))
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(
            f"harnessrl {' '.join(args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return done.stdout


def add_family_arguments(p: argparse.ArgumentParser, k: int) -> None:
    """The settings of a benchmark that trains on the demo's family (`instruction_tasks`) with the demo's loop
    and evaluates on its held-out requests (`k` rollouts per task by default)."""
    p.add_argument("--kinds", nargs="+", default=["placeholders"], help="the trained constraint kinds")
    p.add_argument("--train-tasks", type=int, default=64)
    p.add_argument("--heldout-tasks", type=int, default=40, help="half of them of kinds never trained")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-5, help="the demo's learning rate")
    p.add_argument("--reply-tokens", type=int, default=128, help="every model call's reply budget")
    p.add_argument("--min-words", type=int, default=12)
    p.add_argument("--k", type=int, default=k, help="evaluation rollouts per held-out task")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)


def paired_figures(base: dict[str, Any], trained: dict[str, Any], key: str, seed: int) -> dict[str, float]:
    """`<key>_pass_at_1`, `<key>_diff`, `<key>_ci_low`, `<key>_ci_high`: trained − base in held-out pass@1 over
    the tasks both scored (the paired bootstrap), and `base_pass_at_1`."""
    from harnessrl.evaluate.results import compare

    c = compare(base, trained, seed=seed)
    return {
        "base_pass_at_1": c["a_pass_at_1"],
        f"{key}_pass_at_1": c["b_pass_at_1"],
        f"{key}_diff": c["diff"],
        f"{key}_ci_low": c["low"],
        f"{key}_ci_high": c["high"],
    }


def evaluated(folder: Path) -> dict[str, dict[str, Any]]:
    """Policy -> its result, from every evaluation already written under `folder`."""
    results: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*/evaluation.json")):
        results.update({r["policy"]: r for r in json.loads(path.read_text())["results"]})
    return results


def evaluate_policies(
    policies: dict[str, Path | None], specs: str, args: argparse.Namespace, tasks: Path, folder: Path
) -> dict[str, dict[str, Any]]:
    """Each policy's held-out result under `specs` (None: the base model), from `harnessrl stage evaluate`
    into `folder`: only the policies no earlier run into it evaluated run now (`--k`, `--seed` as given)."""
    missing = [name for name in policies if name not in evaluated(folder)]
    if missing:
        flags = [f"--policy={name}={policies[name] or 'base'}" for name in missing]
        harnessrl(
            "stage", "evaluate", "--tasks", str(tasks), "--out", str(folder / "+".join(missing)), *flags,
            "--k", str(args.k), "--specs", specs, "--concurrency", str(args.concurrency), "--seed", str(args.seed),
        )  # fmt: skip
    return evaluated(folder)


def instruction_tasks(args: argparse.Namespace, root: Path) -> tuple[Path, Path, str]:
    """Whole one-sentence replies (`--whole-reply`); held out: half of the trained kinds, half of the
    one-sentence kinds never trained, each tagged with its eval group."""
    from harnessrl.environments.instruction.prompts import ONE_SENTENCE_KINDS

    shape = ["--whole-reply", str(args.min_words)]
    unseen = [k for k in ONE_SENTENCE_KINDS if k not in args.kinds]
    n_unseen = args.heldout_tasks // 2 if unseen else 0
    harnessrl(
        "tasks", "instruction", "--out", str(root / "train"), "--n", str(args.train_tasks), "--split", "train",
        "--kinds", *args.kinds, *shape,
    )  # fmt: skip
    held = {"trained": (args.heldout_tasks - n_unseen, args.kinds), "unseen": (n_unseen, unseen)}
    for i, (name, (n, kinds)) in enumerate(held.items()):
        if n:
            harnessrl(
                "tasks", "instruction", "--out", str(root / f"test-{name}"), "--n", str(n), "--split", "test",
                "--seed", str(args.seed + 1 + i), "--kinds", *kinds, *shape, "--eval-group", f"{name} kinds",
            )  # fmt: skip
    parts = [str(root / f"test-{name}") for name, (n, _) in held.items() if n]
    harnessrl("tasks", "mix", "--out", str(root / "test"), *parts)
    specs = json.dumps(
        [{"harness": "chat", "reward": "instruction_strict", "limits": {"tokens": args.reply_tokens}}]
    )
    return root / "train", root / "test", specs


def swe_tasks(args: argparse.Namespace, root: Path) -> tuple[Path, Path, str]:
    from harnessrl.taskset import TaskSet, write_taskset

    n = args.train_tasks_swe + args.heldout_tasks_swe
    harnessrl("tasks", "synthesize", str(args.swe_source), "--out", str(root / "all"), "--max-tasks", str(n))
    everything = TaskSet.open(root / "all")
    rows = everything.rows()
    bundles = {r["repo"]: everything.bundle(r["repo"]) for r in rows}
    split = len(rows) - args.heldout_tasks_swe
    for name, part in (("train", rows[:split]), ("test", rows[split:])):
        write_taskset(
            root / name, part, {r["repo"]: bundles[r["repo"]] for r in part}, f"learning_envs {name}"
        )
    specs = json.dumps(
        [
            {
                "harness": "react",
                "limits": {"turns": args.swe_turns},
                "options": {"max_tokens_per_turn": args.max_tokens},
            }
        ]
    )
    return root / "train", root / "test", specs


def kernel_tasks(args: argparse.Namespace, root: Path) -> tuple[Path, Path, str]:
    for split, n in (("train", args.train_tasks_kernel), ("test", args.heldout_tasks_kernel)):
        harnessrl(
            "tasks", "kernel", "--out", str(root / split), "--split", split, "--timing", "quick",
            *(["--n", str(n)] if n else []), "--seed", str(args.seed),
        )  # fmt: skip
    specs = json.dumps(
        [
            {
                "harness": "react",
                "limits": {"turns": args.kernel_turns, "tool_timeout_s": 30},
                "options": {"max_tokens_per_turn": args.max_tokens},
            }
        ]
    )
    return root / "train", root / "test", specs


def search_tasks(args: argparse.Namespace, root: Path) -> tuple[Path, Path, str]:
    kinds = ["--kinds", *args.search_kinds] if args.search_kinds else []
    for split, n, seed in (
        ("train", args.train_tasks, args.seed),
        ("test", args.heldout_tasks, args.seed + 1),
    ):
        harnessrl(
            "tasks", "search", "--out", str(root / split), "--split", split, "--n", str(n), "--seed", str(seed),
            *kinds,
        )  # fmt: skip
    specs = json.dumps(
        [
            {
                "harness": "react",
                "tools": ["search", "read", "answer"],
                "limits": {"turns": args.search_turns},
                "options": {"max_tokens_per_turn": args.max_tokens, "on_no_tool_call": "end"},
            }
        ]
    )
    return root / "train", root / "test", specs


def procedural_tasks(args: argparse.Namespace, root: Path) -> tuple[Path, Path, str]:
    common = ["--datasets", *args.datasets, "--difficulty", str(args.difficulty)]
    harnessrl(
        "tasks", "procedural", "--out", str(root / "train"), "--n", str(args.train_tasks), "--seed",
        str(args.seed), *common,
    )  # fmt: skip
    harnessrl(
        "tasks", "procedural", "--out", str(root / "test"), "--n", str(args.heldout_tasks), "--seed",
        str(args.seed + 1000), "--held-apart-from", str(root / "train"), *common,
    )  # fmt: skip
    spec = {"harness": "chat", "limits": {"tokens": args.max_tokens}, "reward": args.procedural_reward}
    return root / "train", root / "test", json.dumps([spec])


TASKS = {
    "instruction": instruction_tasks,
    "swe": swe_tasks,
    "kernel": kernel_tasks,
    "search": search_tasks,
    "procedural": procedural_tasks,
}


def merged(sets: dict[str, tuple[Path, Path, str]], root: Path) -> tuple[Path, Path, str]:
    """One training and one held-out task set holding every environment's tasks (`harnessrl tasks mix`), and
    one spec list where each environment's specs are for that environment only."""
    for i, name in enumerate(("train", "test")):
        harnessrl("tasks", "mix", "--out", str(root / name), *(str(s[i]) for s in sets.values()))
    specs = [{**spec, "environments": [env]} for env, (_, _, raw) in sets.items() for spec in json.loads(raw)]
    return root / "train", root / "test", json.dumps(specs)


def measure(envs: list[str], args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Trains one policy on the environments' training tasks (one environment, or all of them mixed) and
    evaluates it against the base model on their held-out tasks; the figures of each environment come from
    its own held-out tasks."""
    from harnessrl.evaluate.results import compare

    sets = {env: TASKS[env](args, root / env / "tasks") for env in envs}
    train, test, specs = sets[envs[0]] if len(envs) == 1 else merged(sets, root / "tasks")
    rl = root / "rl"
    config = root / "rl.json"
    settings: dict[str, Any] = {"train": {"optim": {"lr": args.lr}}, "verify_timeout_s": 60}
    if envs == ["instruction"]:  # one reply per rollout, at most --reply-tokens: the demo's loss
        settings.update(estimator="drgrpo", engine_dtype="auto")
        settings["train"].update(loss_mode="seq-mean-token-sum-norm", loss_scale_factor=args.reply_tokens)
    config.write_text(json.dumps(settings))
    harnessrl(
        "stage", "rl", "--tasks", str(train), "--out", str(rl), "--mode", "colocated", "--steps", str(args.steps),
        "--batch-groups", str(args.batch_groups), "--group-size", str(args.group_size), "--specs", specs,
        "--config", str(config), "--seed", str(args.seed),
    )  # fmt: skip
    harnessrl(
        "stage", "evaluate", "--tasks", str(test), "--out", str(root / "eval"), "--policy", "base=base",
        "--policy", f"trained={rl / 'model'}", "--k", str(args.k), "--specs", specs,
        "--concurrency", str(args.concurrency), "--seed", str(args.seed),
    )  # fmt: skip
    evaluation = json.loads((root / "eval" / "evaluation.json").read_text())
    by_policy = {r["policy"]: r for r in evaluation["results"]}
    steps = [json.loads(line) for line in (rl / "steps.jsonl").read_text().splitlines()]
    out: dict[str, Any] = {}
    for env, (_, env_test, _) in sets.items():
        rows = list(read_jsonl(env_test / "tasks.jsonl"))
        # the environment's held-out tasks, and each eval group of them apart (instruction: trained and unseen kinds)
        parts = {env: {r["instance_id"] for r in rows}}
        for r in rows:
            if r.get("eval_group"):
                parts.setdefault(f"{env}_{r['eval_group'].replace(' ', '_')}", set()).add(r["instance_id"])
        for name, ids in parts.items():
            base, trained = (
                {**by_policy[p], "per_task": {i: t for i, t in by_policy[p]["per_task"].items() if i in ids}}
                for p in ("base", "trained")
            )
            c = compare(base, trained, seed=args.seed)
            out.update(
                {
                    f"{name}_base": c["a_pass_at_1"],
                    f"{name}_trained": c["b_pass_at_1"],
                    f"{name}_diff": c["diff"],
                    f"{name}_ci_low": c["low"],
                    f"{name}_ci_high": c["high"],
                    f"{name}_significant": bool(c["significant"]),
                }
            )
        out[f"{env}_reward_per_step"] = [s.get("reward_all_mean") for s in steps]
        for figure in ("mean_reply_tokens", "length_finish_share", "distinct_2"):
            out[f"{env}_{figure}"] = {r["policy"]: r.get(figure) for r in evaluation["results"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", nargs="+", choices=ENVS, default=list(ENVS))
    p.add_argument("--kinds", nargs="+", default=["placeholders"], help="instruction: constraint kinds")
    p.add_argument("--train-tasks", type=int, default=64)
    p.add_argument("--heldout-tasks", type=int, default=40)
    p.add_argument("--train-tasks-swe", type=int, default=3)
    p.add_argument("--heldout-tasks-swe", type=int, default=2)
    p.add_argument("--swe-source", type=Path, default=MINIREPO)
    p.add_argument("--swe-turns", type=int, default=3)
    p.add_argument("--train-tasks-kernel", type=int, default=0, help="kernel: 0 = every training task")
    p.add_argument("--heldout-tasks-kernel", type=int, default=0, help="kernel: 0 = every held-out task")
    p.add_argument("--kernel-turns", type=int, default=4)
    p.add_argument("--search-turns", type=int, default=3)
    p.add_argument("--search-kinds", nargs="+", help="search: question kinds (default all)")
    p.add_argument("--datasets", nargs="+", default=["basic_arithmetic"], help="procedural: datasets")
    p.add_argument("--difficulty", type=int, default=0, help="procedural: curriculum level")
    p.add_argument(
        "--procedural-reward",
        default="procedural_exact",
        choices=["procedural_exact", "procedural_tagged", "procedural_number"],
        help="procedural: the reward (docs/environments.md)",
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch-groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--max-tokens", type=int, default=48, help="swe, kernel, search: tokens per turn")
    p.add_argument("--reply-tokens", type=int, default=128, help="instruction: the reply budget")
    p.add_argument("--min-words", type=int, default=12, help="instruction: words a whole reply has at least")
    p.add_argument("--k", type=int, default=4, help="evaluation rollouts per held-out task")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="run folder (default: a temporary one)")
    p.add_argument(
        "--mixed", action="store_true", help="one policy trained on every environment's tasks at once"
    )
    p.add_argument(
        "--smoke", action="store_true", help="every step at its smallest, --mixed (the figures mean nothing)"
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.smoke:
        args.train_tasks, args.heldout_tasks, args.train_tasks_swe, args.heldout_tasks_swe = 4, 2, 1, 1
        args.train_tasks_kernel, args.heldout_tasks_kernel = 1, 1
        args.steps, args.batch_groups, args.group_size, args.k, args.max_tokens = 1, 1, 2, 1, 8
        args.reply_tokens = 8
        args.swe_turns = args.kernel_turns = args.search_turns = 1
        args.mixed = True
    started = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="learning-envs-") as scratch:
        root = args.out or Path(scratch)
        runs = [list(args.envs)] if args.mixed else [[env] for env in args.envs]
        for envs in runs:
            t0 = time.perf_counter()
            results.update(measure(envs, args, root / "-".join(envs)))
            for env in envs:
                print(
                    f"{env}: held-out pass@1 base {results[f'{env}_base']:.3f} -> trained {results[f'{env}_trained']:.3f}, "
                    f"diff {results[f'{env}_diff']:+.3f} [{results[f'{env}_ci_low']:+.3f}, {results[f'{env}_ci_high']:+.3f}] "
                    f"({time.perf_counter() - t0:.0f} s for {'+'.join(envs)})",
                    flush=True,
                )
    results.update(minutes=round((time.perf_counter() - started) / 60, 2), load_avg=os.getloadavg()[0])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
