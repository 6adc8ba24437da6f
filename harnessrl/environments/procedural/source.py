"""Procedural reasoning tasks from reasoning-gym: task rows, answer extraction, and the dataset's own scoring.

This module owns the procedural row format and its one reader/writer:

    {"task_id": "chain_sum-d0-s3-00007", "prompt": "...", "answer": "12",
     "metadata": {"dataset": "chain_sum", "difficulty": 0, "seed": 3, "index": 7, "question": "...",
                  "entry": {...reasoning-gym's own metadata of the item...}}}

`ProceduralTask` is the typed record (`entry` stays the JSON object reasoning-gym produced: scoring hands it
back to the dataset untouched). reasoning-gym is an optional dependency, imported on first use only: without
it, generating or scoring raises `ReasoningGymMissing` with the one line that installs it; reading and writing
rows and extracting answers work without it.

- **Difficulty** is the dataset's reasoning-gym curriculum level: every attribute of the curriculum is set to
  level `difficulty` (clamped to the attribute's last level) and ranges take that level's own segment
  (`RangeAttributeMode.UPPER_BOUND`), so difficulty 0 is the curriculum's easiest setting. A dataset without
  a curriculum is refused.
- **Items**: `generate_rows(dataset, n, seed, difficulty)` builds the dataset with `seed` and size n; item i
  is reasoning-gym's item i of that seed (reasoning-gym derives it from seed + i, so it does not depend on n).
- **Prompt**: the item's question, a blank line, then `ANSWER_INSTRUCTION` (final answer between
  `<answer>` tags).
- **Extraction** (`extract_answer`): the text of the last `<answer>...</answer>` pair, stripped; with no
  complete pair, the last non-blank line of the reply, stripped (`ExtractMode.TAG_OR_LAST_LINE`, the default),
  or nothing (`ExtractMode.TAG`). A blank reply gives nothing, which every dataset scores 0.
- **Scoring** (`score_reply`): the dataset's own `score_answer(extracted, entry)`, with entry rebuilt from the
  row (question, answer, metadata.entry) and the dataset built with the row's difficulty; clamped to [0, 1].
  Some datasets give partial credit (e.g. a reply that contains the answer among other text scores
  len(answer) / len(reply)); `score == 1.0` is an exact answer.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any

from harnessrl.environments.rows import load_source_rows, write_source_rows

logger = logging.getLogger(__name__)

REASONING_GYM_REQUIREMENT = "reasoning-gym==0.1.25"
# No example answer in it: the tiny model copies an example ("<answer>42</answer>") instead of answering.
ANSWER_INSTRUCTION = "Give only your final answer between <answer> and </answer> tags."
ROW_FIELDS = ("task_id", "prompt", "answer", "metadata")
METADATA_FIELDS = ("dataset", "difficulty", "seed", "index", "question", "entry")
SHORT_DATASETS = ("chain_sum", "basic_arithmetic", "products", "spell_backward", "letter_counting")
"""Datasets whose questions and answers are a line or two at difficulty 0-1. SmolLM2-135M-Instruct scores
~0 on all of them at T=1 (exact answers <= 3% of 40-48 samples per dataset and level): too hard for it."""


class ReasoningGymMissing(ImportError):
    """reasoning-gym is not installed (generating and scoring need it)."""


class ExtractMode(StrEnum):
    TAG = "tag"  # the last <answer>...</answer>, else nothing
    TAG_OR_LAST_LINE = "tag_or_last_line"  # ... else the last non-blank line
    TAG_OR_FINAL_NUMBER = (
        "tag_or_final_number"  # ... else the reply's last number (GSM8K-style), else nothing
    )


@dataclass(frozen=True)
class ProceduralTask:
    task_id: str
    prompt: str
    answer: str
    dataset: str
    difficulty: int
    seed: int
    index: int
    question: str
    entry: Mapping[str, object]  # reasoning-gym's metadata of the item, as JSON

    def to_row(self) -> dict[str, object]:
        metadata = {
            "dataset": self.dataset,
            "difficulty": self.difficulty,
            "seed": self.seed,
            "index": self.index,
            "question": self.question,
            "entry": dict(self.entry),
        }
        return {"task_id": self.task_id, "prompt": self.prompt, "answer": self.answer, "metadata": metadata}


def _gym() -> ModuleType:
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError:
        raise ReasoningGymMissing(
            f"procedural tasks need reasoning-gym, which is not installed: pip install '{REASONING_GYM_REQUIREMENT}'"
        ) from None


def reasoning_gym_available() -> bool:
    try:
        _gym()
    except ReasoningGymMissing:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _dataset(name: str, difficulty: int, seed: int, size: int) -> Any:
    """reasoning-gym's dataset object at a curriculum level (module docstring)."""
    _gym()
    factory = importlib.import_module("reasoning_gym.factory")
    coaching = importlib.import_module("reasoning_gym.coaching.base_curriculum")
    if name not in factory.DATASETS:
        raise ValueError(
            f"dataset {name!r} is not a reasoning-gym dataset (e.g. {', '.join(SHORT_DATASETS)})"
        )
    if not factory.has_curriculum(name):
        raise ValueError(f"dataset {name!r} has no reasoning-gym curriculum, so it has no difficulty levels")
    curriculum = factory.create_curriculum(name)
    for attr_name, attr in curriculum.attributes.items():
        curriculum.set_attr_level(attr_name, min(difficulty, len(attr.levels) - 1))
    context = coaching.DefaultCurriculumContext(mode=coaching.RangeAttributeMode.UPPER_BOUND)
    config = curriculum.generate_configuration(defaults={"seed": seed, "size": size}, context=context)
    dataset_cls, _ = factory.DATASETS[name]
    return dataset_cls(config=config)


def max_difficulty(dataset: str) -> int:
    """The highest level any attribute of the dataset's curriculum has (higher difficulties clamp to it)."""
    _gym()
    factory = importlib.import_module("reasoning_gym.factory")
    if not factory.has_curriculum(dataset):
        raise ValueError(
            f"dataset {dataset!r} has no reasoning-gym curriculum, so it has no difficulty levels"
        )
    return max(len(a.levels) - 1 for a in factory.create_curriculum(dataset).attributes.values())


def _json_object(value: object, what: str) -> dict[str, object]:
    try:
        copied = json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what} is not JSON ({e}); this dataset cannot be stored as rows") from None
    if not isinstance(copied, dict):
        raise ValueError(f"{what} must be a JSON object, got {value!r}")
    return copied


def generate_rows(dataset: str, n: int, seed: int, difficulty: int = 0) -> list[ProceduralTask]:
    """n tasks of a reasoning-gym dataset at a difficulty (module docstring)."""
    if n < 0 or difficulty < 0:
        raise ValueError(f"n and difficulty must be >= 0, got n={n}, difficulty={difficulty}")
    ds = _dataset(dataset, difficulty, seed, max(n, 1))
    tasks: list[ProceduralTask] = []
    for i in range(n):
        item = ds[i]
        question, answer = str(item["question"]), str(item["answer"])
        tasks.append(
            ProceduralTask(
                task_id=f"{dataset}-d{difficulty}-s{seed}-{i:05d}",
                prompt=f"{question.rstrip()}\n\n{ANSWER_INSTRUCTION}",
                answer=answer,
                dataset=dataset,
                difficulty=difficulty,
                seed=seed,
                index=i,
                question=question,
                entry=_json_object(item.get("metadata", {}), f"{dataset} item {i} metadata"),
            )
        )
    return tasks


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?![\d])")  # 13, -4, 1,024, 2.5 (a trailing period is not its)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def extract_answer(reply: str, mode: ExtractMode = ExtractMode.TAG_OR_LAST_LINE) -> str | None:
    """The answer a reply gives (module docstring), or None."""
    tagged = _ANSWER_TAG.findall(reply)
    if tagged:
        return tagged[-1].strip()
    if ExtractMode(mode) == ExtractMode.TAG:
        return None
    if ExtractMode(mode) == ExtractMode.TAG_OR_FINAL_NUMBER:
        numbers = _NUMBER.findall(reply)
        return numbers[-1].replace(",", "") if numbers else None
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else None


def score_answer(task: ProceduralTask, answer: str | None) -> float:
    """The dataset's own score of an extracted answer, in [0, 1] (0 for None)."""
    if answer is None:
        return 0.0
    ds = _dataset(task.dataset, task.difficulty, 0, 1)  # scoring reads the config, never the items
    entry = {"question": task.question, "answer": task.answer, "metadata": dict(task.entry)}
    value = float(ds.score_answer(answer, entry))
    return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0


def score_reply(task: ProceduralTask, reply: str, mode: ExtractMode = ExtractMode.TAG_OR_LAST_LINE) -> float:
    return score_answer(task, extract_answer(reply, mode))


# ---- rows: read and write -------------------------------------------------------------------------------


def task_from_row(row: object, where: str) -> ProceduralTask:
    """A task from one row; a ValueError starts with `where` and names the task and field."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object {{{', '.join(ROW_FIELDS)}}}, got {row!r}")
    label = f"{where} (task {row['task_id']!r})" if isinstance(row.get("task_id"), str) else where
    for name in ROW_FIELDS:
        if name not in row:
            raise ValueError(f"{label}: missing field {name!r} (a row has {', '.join(ROW_FIELDS)})")
    unknown = sorted(set(row) - set(ROW_FIELDS))
    if unknown:
        raise ValueError(f"{label}: unknown field {unknown[0]!r} (a row has {', '.join(ROW_FIELDS)})")
    for name in ("task_id", "prompt", "answer"):
        if not isinstance(row[name], str) or (name != "answer" and not row[name].strip()):
            raise ValueError(f"{label}: field {name!r} must be a string (non-blank), got {row[name]!r}")
    meta = row["metadata"]
    if not isinstance(meta, dict):
        raise ValueError(f"{label}: field 'metadata' must be an object with {', '.join(METADATA_FIELDS)}")
    missing = [f for f in METADATA_FIELDS if f not in meta]
    if missing:
        raise ValueError(f"{label}: field 'metadata.{missing[0]}' is missing")
    checks: list[tuple[str, bool, str]] = [
        ("dataset", isinstance(meta["dataset"], str) and bool(meta["dataset"]), "a dataset name"),
        ("question", isinstance(meta["question"], str), "a string"),
        ("entry", isinstance(meta["entry"], dict), "an object"),
    ]
    checks += [
        (f, isinstance(meta[f], int) and not isinstance(meta[f], bool) and meta[f] >= 0, "an integer >= 0")
        for f in ("difficulty", "seed", "index")
    ]
    for name, ok, expected in checks:
        if not ok:
            raise ValueError(f"{label}: field 'metadata.{name}' must be {expected}, got {meta[name]!r}")
    return ProceduralTask(
        task_id=row["task_id"],
        prompt=row["prompt"],
        answer=row["answer"],
        dataset=meta["dataset"],
        difficulty=meta["difficulty"],
        seed=meta["seed"],
        index=meta["index"],
        question=meta["question"],
        entry=meta["entry"],
    )


def load_rows(path: str | Path) -> list[ProceduralTask]:
    """Every task of a JSONL file of rows, validated; task ids must be unique."""
    return load_source_rows(path, task_from_row)


def write_rows(path: str | Path, tasks: Iterable[ProceduralTask]) -> int:
    """Writes the tasks as JSONL rows (atomically); returns how many."""
    return write_source_rows(path, tasks)
