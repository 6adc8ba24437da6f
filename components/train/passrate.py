"""Pass-rate history for dynamic sampling (agreed format, shared with the difficulty stage).

A JSONL file, one row per (round, group_id): ``{"group_id": str, "round": int, "n": int, "passes": int}``.
The recent pass rate of a group is Σpasses / Σn over its last K recorded rounds. Groups whose recent pass
rate is exactly 0 or 1 carry no GRPO signal (every advantage is 0) and are skipped; groups with no history
are kept.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harnessrl.io import read_jsonl, write_jsonl


@dataclass(frozen=True)
class HistoryRow:
    group_id: str
    round: int
    n: int
    passes: int

    def to_row(self) -> dict:
        return {"group_id": self.group_id, "round": self.round, "n": self.n, "passes": self.passes}


def read_history(path: str | Path) -> list[HistoryRow]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for i, r in enumerate(read_jsonl(path), 1):
        try:
            row = HistoryRow(str(r["group_id"]), int(r["round"]), int(r["n"]), int(r["passes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: row {i}: a history row needs group_id, round, n, passes ({e})") from None
        if row.n < 0 or not 0 <= row.passes <= row.n:
            raise ValueError(f"{path}: row {i}: need 0 ≤ passes ≤ n, got passes={row.passes} n={row.n}")
        rows.append(row)
    return rows


def append_round(path: str | Path, rows: Iterable[HistoryRow]) -> int:
    """Adds (or replaces, for an idempotent rerun) this round's rows; atomic rewrite."""
    new = list(rows)
    keys = {(r.round, r.group_id) for r in new}
    kept = [r for r in read_history(path) if (r.round, r.group_id) not in keys]
    return write_jsonl(path, (r.to_row() for r in kept + new))


def recent_pass_rates(rows: Iterable[HistoryRow], last_k: int) -> dict[str, float]:
    """group_id → passes/n over its last `last_k` rounds (groups with n == 0 over that window are absent)."""
    if last_k < 1:
        raise ValueError("last_k must be ≥ 1")
    per_group: dict[str, dict[int, HistoryRow]] = defaultdict(dict)
    for r in rows:
        per_group[r.group_id][r.round] = r
    out = {}
    for g, by_round in per_group.items():
        window = [by_round[k] for k in sorted(by_round)[-last_k:]]
        n = sum(r.n for r in window)
        if n:
            out[g] = sum(r.passes for r in window) / n
    return out


def groups_to_skip(rates: Mapping[str, float]) -> set[str]:
    return {g for g, rate in rates.items() if rate in (0.0, 1.0)}
