"""Does training help on SWE-format tasks? The tiny model, base → sft (cold start) → RL, measured.

Tasks: SWE-smith-format tasks synthesized from a real package (default: the `parse` sdist the demo uses,
dataprep/synthesize.py), in an easy tier: each problem statement also names the file and the function the bug
is in. They are split into training tasks and held-out tasks.

Stages (the project's own code throughout):
- base: the policy as given (default: the tiny embedded SmolLM2-135M);
- sft: `components.sft.stage.run_sft` on the training tasks (scripted demonstrations of the gold fixes through
  the real harness, gateway and sandbox; NLL on the sampled tokens);
- rl: rounds of generate → verify → `round.run_train` (GRPO) on the training tasks, starting from sft. This is
  the train stage's round loop; the continuous RL stage (`harnessrl stage rl`) is not used here.
After each stage every task is evaluated with `components.evaluate.stage.run_evaluate` (k sampled rollouts per
task, verify-graded): pass@1 with its Wilson 95% interval (harnessrl.evaluate.stats) and the valid-tool-call
rate (model turns that called a tool with valid arguments / all model turns), on training and held-out tasks.

    nice -n 5 .venv/bin/python benchmarks/learning_swe.py                    # full size: a quiet machine, ~1 h
    nice -n 5 .venv/bin/python benchmarks/learning_swe.py --train-tasks 4 --heldout-tasks 2 --k 2 \
        --rl-rounds 1 --group-size 4                                         # reduced
    .venv/bin/python benchmarks/learning_swe.py --smoke                      # every stage at its smallest

Last line: JSON with toolcall_rate_base, toolcall_rate_sft, pass1_base, pass1_sft, pass1_rl, pass1_rl_ci_low
(pass@1 on the training tasks) and the held-out numbers. `--smoke`: tasks from tests/fixtures/minirepo (unless
`--source`), 1 training + 1 held-out task, 1 evaluation rollout each, 3 turns of 16 tokens (the scripted sft
demonstrations of those tasks: 3 turns of up to 128), 1 sft epoch, 1 RL round of a group of 2, output in a
temporary folder (unless `--out`); the figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from components.evaluate.stage import EvaluateConfig, Policy, run_evaluate
from components.sft.stage import SftConfig, run_sft
from harnessrl.evaluate.stats import wilson_interval
from harnessrl.harness.base import TurnError
from harnessrl.io import read_jsonl
from harnessrl.rollout.generate import GenerateConfig, run_generate
from harnessrl.rollout.model_server import ModelSource
from harnessrl.rollout.specs import NamedSpec, parse_specs
from harnessrl.taskset import TaskSet, write_taskset
from harnessrl.tinymodel import tiny_model_dir
from harnessrl.train.round import TrainConfig, run_train
from harnessrl.train.trainer import OptimConfig, TrainerConfig
from harnessrl.verify.rollouts import run_verify

HUNK_FUNCTION = re.compile(r"^@@ [^@]* @@ (?:async )?(?:def|class) (\w+)", re.MULTILINE)
PATCH_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)


def easy_statement(row: dict) -> str:
    """The synthesized statement plus where the bug is (the easy tier): the file and the function or class
    the change is in (from the patch's hunk header)."""
    files = PATCH_FILE.findall(row["patch"])
    funcs = HUNK_FUNCTION.findall(row["patch"])
    where = f"The bug is in `{files[0]}`" if files else "The bug is in the source"
    where += f", in `{funcs[0]}`." if funcs else "."
    return row["problem_statement"].rstrip() + "\n\n" + where + "\n"


def make_tasks(source: Path, out: Path, n_train: int, n_heldout: int, seed: int) -> tuple[Path, Path, Path]:
    """Synthesizes n_train + n_heldout tasks; writes all/, train/ and heldout/ task sets (easy tier)."""
    from dataprep.synthesize import synthesize_taskset

    synth = synthesize_taskset(source, out / "synth", max_tasks=n_train + n_heldout, seed=seed)
    rows = [{**r, "problem_statement": easy_statement(r)} for r in synth.rows()]
    if len(rows) < n_train + 1:
        raise SystemExit(f"synthesis produced {len(rows)} tasks; need at least {n_train + 1}")
    bundles = {r["repo"]: synth.bundle(r["repo"]) for r in rows}
    sets = {"all": rows, "train": rows[:n_train], "heldout": rows[n_train:]}
    for name, subset in sets.items():
        write_taskset(out / name, subset, {r["repo"]: bundles[r["repo"]] for r in subset}, str(source))
    return out / "all", out / "train", out / "heldout"


def harness_specs(turns: int, max_tokens_per_turn: int) -> list[NamedSpec]:
    """The one harness spec every stage runs: ReAct in bubblewrap."""
    return parse_specs(
        [
            {
                "harness": "react",
                "sandbox": "bubblewrap",
                "limits": {"turns": turns},
                "options": {"max_tokens_per_turn": max_tokens_per_turn},
            }
        ]
    )


def toolcall_counts(rollouts: list[dict]) -> tuple[int, int]:
    """(model turns with a valid tool call, model turns): a turn without a tool call, or whose arguments did
    not parse or fit the tool's schema, is not valid."""
    turns = sum(int(r.get("turns") or 0) for r in rollouts)
    bad = sum(
        int((r.get("harness_errors") or {}).get(e, 0))
        for r in rollouts
        for e in (TurnError.NO_TOOL_CALL, TurnError.MALFORMED_ARGS)
    )
    return max(turns - bad, 0), turns


def evaluate(
    name: str, policy: Path, tasks: Path, split: dict[str, set[str]], out: Path, specs: list, args
) -> dict[str, Any]:
    """pass@1 (Wilson 95%) and valid-tool-call rate of one policy on each split."""
    t0 = time.monotonic()
    cfg = EvaluateConfig(k=args.k, concurrency=args.concurrency, seed=args.seed, verify_workers=2)
    evaluation = run_evaluate(tasks, out / f"eval-{name}", [Policy(name, str(policy))], specs, cfg)
    (result,) = evaluation["results"]
    rollouts = list(
        read_jsonl(out / f"eval-{name}" / "runs" / name / result["mode"] / "rollouts" / "rollouts.jsonl")
    )
    scores: dict[str, Any] = {"seconds": round(time.monotonic() - t0, 1)}
    for part, ids in split.items():
        per_task = [t for i, t in result["per_task"].items() if i in ids]
        graded, resolved = sum(t["graded"] for t in per_task), sum(t["resolved"] for t in per_task)
        valid, turns = toolcall_counts([r for r in rollouts if r["instance_id"] in ids])
        low, high = wilson_interval(resolved, graded)
        scores[part] = {
            "pass1": resolved / graded if graded else None,
            "ci": [low, high],
            "resolved": resolved,
            "graded": graded,
            "toolcall_rate": valid / turns if turns else None,
            "turns": turns,
        }
    print(f"[{name}] {json.dumps(scores)}  load {os.getloadavg()[0]:.1f}", flush=True)
    return scores


def rl_rounds(sft_model: Path, train: Path, out: Path, specs: list, args) -> Path:
    policy = sft_model
    for r in range(1, args.rl_rounds + 1):
        d = out / "rl" / f"round-{r}"
        run_generate(
            train,
            d / "rollouts",
            specs,
            ModelSource(checkpoint=str(policy)),
            GenerateConfig(
                group_size=args.group_size, concurrency=args.concurrency, seed=args.seed * 100 + r
            ),
        )
        verify = run_verify(train, d / "rollouts", d / "verified", workers=2)
        cfg = TrainConfig(
            train=TrainerConfig(optim=OptimConfig(lr=args.rl_lr), seed=args.seed),
            groups_per_step=args.rl_groups_per_step,
            epochs=args.rl_epochs,
        )
        summary = run_train(d / "rollouts", d / "verified", policy, d / "train", cfg)
        print(
            f"[rl round {r}] resolved {verify['resolved']}/{verify['graded']}, steps {summary.get('steps')}, "
            f"groups trained {summary.get('groups_trained')}  load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        if summary.get("steps"):
            policy = d / "train" / "model"
    return policy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="repo dir or sdist (default: the demo's parse==1.22.4 sdist)")
    p.add_argument("--out", help="run folder (default: runs/learning_swe; --smoke: a temporary one)")
    p.add_argument("--policy", help="base policy (default: the tiny embedded model)")
    p.add_argument("--train-tasks", type=int, default=8)
    p.add_argument("--heldout-tasks", type=int, default=4)
    p.add_argument("--k", type=int, default=4, help="evaluation rollouts per task")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens-per-turn", type=int, default=192)
    p.add_argument(
        "--sft-max-tokens-per-turn",
        type=int,
        help="token cap of the scripted sft demonstrations' turns (default: --max-tokens-per-turn)",
    )
    p.add_argument("--sft-epochs", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--rl-rounds", type=int, default=3)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--rl-lr", type=float, default=1e-5)
    p.add_argument("--rl-epochs", type=int, default=1)
    p.add_argument("--rl-groups-per-step", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--smoke", action="store_true", help="every stage at its smallest (the figures mean nothing)"
    )
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HARNESSRL_PROGRESS", "0")
    if args.smoke:
        # the scripted sft demonstrations must fit: 3 turns (view, edit, submit), replies of up to ~115 tokens
        args.train_tasks, args.heldout_tasks, args.k, args.turns, args.max_tokens_per_turn = 1, 1, 1, 3, 16
        args.sft_max_tokens_per_turn = 128
        args.sft_epochs, args.rl_rounds, args.rl_groups_per_step = 1, 1, 1
        args.group_size, args.concurrency = 2, 2
    if args.out is not None:
        run(args, Path(args.out))
    elif args.smoke:
        with tempfile.TemporaryDirectory(prefix="learning-swe-") as tmp:
            run(args, Path(tmp))
    else:
        run(args, Path("runs/learning_swe"))


def run(args: argparse.Namespace, out: Path) -> None:
    started = time.monotonic()
    if args.source:
        source = Path(args.source)
    elif args.smoke:
        from pipelines.demo import FIXTURE_REPO

        source = FIXTURE_REPO
    else:
        from pipelines.demo import cached_sdist

        found = cached_sdist()
        if found is None:
            raise SystemExit("no parse sdist (offline?): pass --source <repo dir or sdist>")
        source = found
    print(f"machine load {os.getloadavg()}, cpus {os.cpu_count()}, args {vars(args)}", flush=True)
    all_tasks, train, heldout = make_tasks(
        source, out / "tasks", args.train_tasks, args.heldout_tasks, args.seed
    )
    split = {
        "train": {r["instance_id"] for r in TaskSet.open(train).rows()},
        "heldout": {r["instance_id"] for r in TaskSet.open(heldout).rows()},
    }
    print(f"tasks: {len(split['train'])} train, {len(split['heldout'])} held out", flush=True)
    specs = harness_specs(args.turns, args.max_tokens_per_turn)
    sft_specs = specs
    if args.sft_max_tokens_per_turn is not None:
        sft_specs = harness_specs(args.turns, args.sft_max_tokens_per_turn)
    base = Path(args.policy) if args.policy else tiny_model_dir()
    results = {"base": evaluate("base", base, all_tasks, split, out, specs, args)}
    sft_cfg = SftConfig.from_dict(
        {
            "epochs": args.sft_epochs,
            "groups_per_step": 2,
            "train": {"optim": {"lr": args.sft_lr}, "seed": args.seed},
        }
    )
    t0 = time.monotonic()
    sft = run_sft(train, base, out / "sft", sft_cfg, specs=sft_specs)
    print(f"[sft] {json.dumps(sft, default=str)} in {time.monotonic() - t0:.0f}s", flush=True)
    results["sft"] = evaluate("sft", out / "sft" / "model", all_tasks, split, out, specs, args)
    rl_model = rl_rounds(out / "sft" / "model", train, out, specs, args)
    results["rl"] = evaluate("rl", rl_model, all_tasks, split, out, specs, args)

    print(
        "\n| stage | train pass@1 [95% CI] | train tool-call rate | held-out pass@1 [95% CI] | held-out tool-call rate |"
    )
    print("|---|---|---:|---|---:|")
    for stage, s in results.items():
        cells = []
        for part in ("train", "heldout"):
            x = s[part]
            p1 = (
                "n/a"
                if x["pass1"] is None
                else f"{x['pass1']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}] ({x['resolved']}/{x['graded']})"
            )
            rate = "n/a" if x["toolcall_rate"] is None else f"{x['toolcall_rate']:.3f} ({x['turns']} turns)"
            cells += [p1, rate]
        print(f"| {stage} | " + " | ".join(cells) + " |")
    final = {
        "toolcall_rate_base": results["base"]["train"]["toolcall_rate"],
        "toolcall_rate_sft": results["sft"]["train"]["toolcall_rate"],
        "pass1_base": results["base"]["train"]["pass1"],
        "pass1_sft": results["sft"]["train"]["pass1"],
        "pass1_rl": results["rl"]["train"]["pass1"],
        "pass1_rl_ci_low": results["rl"]["train"]["ci"][0],
        "heldout_pass1_base": results["base"]["heldout"]["pass1"],
        "heldout_pass1_sft": results["sft"]["heldout"]["pass1"],
        "heldout_pass1_rl": results["rl"]["heldout"]["pass1"],
        "heldout_toolcall_rate_sft": results["sft"]["heldout"]["toolcall_rate"],
        "wall_s": round(time.monotonic() - started, 1),
        "load_avg": os.getloadavg()[0],
    }
    print(json.dumps(final))


if __name__ == "__main__":
    main()
