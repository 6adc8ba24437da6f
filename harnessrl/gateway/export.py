"""Export: journal records -> `records.parquet` (one row per call) and `samples.parquet` (`Sample` rows)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from harnessrl.io import atomic_output

from .enums import Selection
from .journal import JournalReport, read_journal
from .records import Record
from .samples import build_samples, call_rows

logger = logging.getLogger(__name__)


def write_parquet(rows: list[dict[str, Any]], path: str | os.PathLike) -> Path:
    path = Path(path)
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    with atomic_output(path) as tmp:
        pq.write_table(table, tmp)
    return path


def export(
    records: Iterable[Record],
    out_dir: str | os.PathLike,
    selection: Selection | str = Selection.ALL,
    session_id: str | None = None,
    rollout_id: str | None = None,
) -> dict[str, Any]:
    """Writes `records.parquet` (one row per call) and `samples.parquet` (Sample rows) under out_dir."""
    records = list(records)
    out = Path(out_dir)
    calls = call_rows(records, session_id, rollout_id)
    samples = [s.to_row() for s in build_samples(records, selection, session_id, rollout_id)]
    write_parquet(calls, out / "records.parquet")
    write_parquet(samples, out / "samples.parquet")
    return {"records": len(calls), "samples": len(samples), "out_dir": str(out)}


def export_journal(
    journal: str | os.PathLike,
    out_dir: str | os.PathLike,
    selection: Selection | str = Selection.ALL,
    session_id: str | None = None,
    rollout_id: str | None = None,
    salvage: bool = False,
) -> dict[str, Any]:
    """`export` of a journal file or directory; the result says what the read left out (`journal`).
    Without `salvage` a corrupt line stops it (JournalCorruptError naming the line)."""
    report = JournalReport()
    records = list(read_journal(journal, salvage, report))
    if report.repaired or report.duplicates:
        logger.warning("%s", report.summary())
    return {**export(records, out_dir, selection, session_id, rollout_id), "journal": report.as_dict()}
