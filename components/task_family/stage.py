"""`task-family` stage: the tasks the RL loop trains on and the evaluation holds out.

`swe` passes the selected SWE tasks and their held-out split through. `instruction` generates an
instruction-following family (harnessrl.environments.instruction): `n_train` tasks from one half of the base
requests and `n_held_out` from the other half, so the held-out tasks test the skill, not memory of a request.
`auto` (the demo's choice) trains on the SWE tasks when the difficulty estimate found headroom there (a task
the policy sometimes solves: "mixed"), and otherwise on the instruction family, saying so in one line.

Output directories: train/ and test/ task sets, family.json (the choice, its reason, the rollout spec the
family runs under), report.md, metrics.json.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from harnessrl.io import atomic_output, atomic_write_json, atomic_write_text, read_jsonl


class Family(StrEnum):
    AUTO = "auto"
    SWE = "swe"
    INSTRUCTION = "instruction"


@dataclass(frozen=True)
class FamilyChoice:
    family: Family
    reason: str  # one line: why this family
    specs_json: str  # the harness spec the family's rollouts run under ("": the environment's default)
    train: int
    test: int
    swe_mixed: int  # SWE tasks the policy sometimes solved (headroom)


def swe_headroom(selected: Path) -> int:
    """Selected SWE tasks classed `mixed` (the policy passed some of their rollouts, not all)."""
    decisions = selected / "selection.jsonl"
    if not decisions.is_file():
        return 0
    return sum(
        1 for row in read_jsonl(decisions) if row.get("class") == "mixed" and row.get("split") == "train"
    )


def run_task_family(
    selected: Path,
    held_out: Path,
    out: Path,
    *,
    family: Family = Family.AUTO,
    n_train: int = 64,
    n_held_out: int = 40,
    kinds: tuple[str, ...] = (),
    seed: int = 0,
    swe_specs_json: str = "",
    family_specs_json: str = "",
) -> FamilyChoice:
    from harnessrl.environments.instruction.env import PromptSplit, write_instruction_taskset

    family = Family(family)
    mixed = swe_headroom(selected)
    if family is Family.AUTO:
        family = Family.SWE if mixed else Family.INSTRUCTION
        reason = (
            f"SWE tasks: {mixed} with headroom (the policy solved some of their rollouts); training on them"
            if mixed
            else "SWE tasks: no headroom (the policy solved none of their estimated rollouts, so GRPO has no "
            "signal there); training on the instruction-following family instead"
        )
    else:
        reason = f"family {family} chosen by the run's settings"
    with atomic_output(out) as tmp:
        if family is Family.SWE:
            shutil.copytree(selected, tmp / "train")
            shutil.copytree(held_out, tmp / "test")
            specs = swe_specs_json
        else:
            chosen = kinds or None
            write_instruction_taskset(tmp / "train", n_train, seed, PromptSplit.TRAIN, kinds=chosen)
            write_instruction_taskset(tmp / "test", n_held_out, seed + 1, PromptSplit.TEST, kinds=chosen)
            specs = family_specs_json
        train = sum(1 for _ in read_jsonl(tmp / "train" / "tasks.jsonl"))
        test = sum(1 for _ in read_jsonl(tmp / "test" / "tasks.jsonl"))
        choice = FamilyChoice(family, reason, specs, train, test, mixed)
        atomic_write_json(tmp / "family.json", asdict(choice))
        atomic_write_json(tmp / "metrics.json", metrics(choice))
        atomic_write_text(tmp / "report.md", report(choice, kinds))
    return choice


def metrics(choice: FamilyChoice) -> dict[str, float]:
    return {
        "family_swe": float(choice.family is Family.SWE),
        "train": float(choice.train),
        "test": float(choice.test),
        "swe_mixed": float(choice.swe_mixed),
    }


def report(choice: FamilyChoice, kinds: tuple[str, ...]) -> str:
    lines = [
        "# Task family",
        "",
        f"{choice.reason}.",
        "",
        f"Training on **{choice.family}**: {choice.train} tasks; held out for the evaluation: {choice.test}.",
    ]
    if choice.family is Family.INSTRUCTION:
        lines += [
            "",
            "Instruction-following tasks with programmatically verifiable constraints "
            f"({', '.join(kinds) if kinds else 'every kind'}); the held-out tasks use base requests the "
            "training tasks never use. Reward: the share of constraints the reply meets.",
        ]
    if choice.specs_json:
        lines += ["", f"Rollout spec: `{choice.specs_json}`"]
    return "\n".join(lines) + "\n"


def read_choice(out: Path) -> FamilyChoice:
    raw = json.loads((out / "family.json").read_text())
    raw["family"] = Family(raw["family"])
    return FamilyChoice(**raw)
