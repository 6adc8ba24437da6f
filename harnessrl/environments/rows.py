"""Task rows of an environment's own source format as JSONL: one validating reader and one writer.

Each environment owns its row format (a typed record with `task_id` and `to_row()`, and a parser that names
the file, line and field of anything wrong); reading and writing the file is the same for all of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from harnessrl.io import atomic_write_text


class SourceRow(Protocol):
    @property
    def task_id(self) -> str: ...

    def to_row(self) -> dict[str, object]: ...


RowT = TypeVar("RowT", bound=SourceRow)


def load_source_rows(path: str | Path, parse: Callable[[object, str], RowT]) -> list[RowT]:
    """Every row of a JSONL file, parsed by `parse(row, "file:line")`; blank lines skipped, task ids unique."""
    tasks: list[RowT] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: malformed JSON ({e.msg}); each line must be one row object") from None
        task = parse(row, where)
        if task.task_id in seen:
            raise ValueError(
                f"{where}: duplicate task_id {task.task_id!r} (first on line {seen[task.task_id]})"
            )
        seen[task.task_id] = number
        tasks.append(task)
    return tasks


def write_source_rows(path: str | Path, tasks: Iterable[SourceRow]) -> int:
    """Writes the tasks as JSONL rows (atomically); returns how many."""
    lines = [json.dumps(t.to_row(), ensure_ascii=False) for t in tasks]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)
