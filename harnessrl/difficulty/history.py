"""The pass-rate history store: what every round learned about each task's difficulty.

Format (shared with the trainer's dynamic sampling): JSONL, one row per (round, group_id):
    {"group_id": "<instance_id>", "round": 0, "n": 4, "passes": 1}
`n` counts only rollouts that finished (rollout_status ok); crashed / timed-out rollouts are not evidence.
The "recent pass rate" of a group is sum(passes) / sum(n) over the last K rounds recorded for the group. Dynamic sampling skips groups whose recent pass rate is exactly 0 or 1.

Rewriting a round replaces that round's rows (idempotent reruns); the file is rewritten atomically.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from harnessrl.io import read_jsonl, write_jsonl


@dataclass(frozen=True)
class HistoryRow:
    group_id: str
    round: int
    n: int
    passes: int


def _parse(row: dict, where: str) -> HistoryRow:
    for key in ("group_id", "round", "n", "passes"):
        if key not in row:
            raise ValueError(f"{where}: missing field {key!r}; each row needs group_id, round, n, passes")
    try:
        parsed = HistoryRow(str(row["group_id"]), int(row["round"]), int(row["n"]), int(row["passes"]))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: round, n and passes must be integers, got {row!r}") from None
    if parsed.n < 0 or not 0 <= parsed.passes <= parsed.n:
        raise ValueError(f"{where}: need 0 <= passes <= n, got n={parsed.n} passes={parsed.passes}")
    return parsed


class PassRateHistory:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.rows: list[HistoryRow] = []
        if self.path.is_file():
            seen: set[tuple[int, str]] = set()
            for lineno, row in enumerate(read_jsonl(self.path), 1):
                parsed = _parse(row, f"{self.path}: row {lineno}")
                key = (parsed.round, parsed.group_id)
                if key in seen:
                    raise ValueError(
                        f"{self.path}: row {lineno}: duplicate (round={parsed.round}, "
                        f"group_id={parsed.group_id!r}); each round has one row per group"
                    )
                seen.add(key)
                self.rows.append(parsed)

    @property
    def rounds(self) -> list[int]:
        return sorted({r.round for r in self.rows})

    def record_round(self, round_: int, counts: Mapping[str, tuple[int, int]]) -> None:
        """Replaces round `round_` with `counts` (group_id -> (n, passes)) and saves atomically."""
        new = [HistoryRow(g, round_, int(n), int(p)) for g, (n, p) in sorted(counts.items())]
        for row in new:
            _parse(asdict(row), f"round {round_}, group {row.group_id}")
        self.rows = [r for r in self.rows if r.round != round_] + new
        self.rows.sort(key=lambda r: (r.round, r.group_id))
        write_jsonl(self.path, (asdict(r) for r in self.rows))

    def recent_pass_rates(self, last_k: int = 3, before_round: int | None = None) -> dict[str, float]:
        """group_id -> passes/n over the group's last `last_k` recorded rounds (absent when that n is 0).

        `before_round`: only rounds earlier than it count (a rerun of round r must not see its own row)."""
        if last_k < 1:
            raise ValueError("last_k must be >= 1")
        by_group: dict[str, list[HistoryRow]] = defaultdict(list)
        for r in self.rows:
            if before_round is None or r.round < before_round:
                by_group[r.group_id].append(r)
        rates = {}
        for group, rows in by_group.items():
            recent = sorted(rows, key=lambda r: r.round)[-last_k:]
            n = sum(r.n for r in recent)
            if n:
                rates[group] = sum(r.passes for r in recent) / n
        return rates

    def skip_for_dynamic_sampling(self, last_k: int = 3, before_round: int | None = None) -> set[str]:
        """Groups whose recent pass rate is 0 or 1: no learning signal under group-relative advantages."""
        return {g for g, rate in self.recent_pass_rates(last_k, before_round).items() if rate in (0.0, 1.0)}
