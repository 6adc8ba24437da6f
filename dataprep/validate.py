"""Great Expectations 1.x suite for a task set (ephemeral context, pandas datasource).

List-typed columns (FAIL_TO_PASS / PASS_TO_PASS) are checked through helper columns computed first
(`n_fail_to_pass`, `tests_are_lists`, `f2p_p2p_disjoint`), since GX expectations work on scalar values.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_json, atomic_write_text, read_jsonl
from harnessrl.taskset import TASK_FIELDS_REQUIRED, TaskSet

logger = logging.getLogger(__name__)

UNIFIED_DIFF = r"(?s)^(?:diff --git |--- ).*\n@@ -\d"
INSTANCE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"  # usable as a git branch name
REPO = r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$"
ISO_DATE = r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?$"
MAX_EXAMPLES = 5


class ValidationFailed(Exception):
    """The suite failed; str(e) is the readable summary."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.summary())


@dataclass
class ExpectationOutcome:
    expectation: str
    column: str
    success: bool
    unexpected_count: int = 0
    examples: list[str] = field(default_factory=list)  # instance ids (or observed values) that failed


@dataclass
class ValidationReport:
    tasks: str
    n_rows: int
    success: bool
    outcomes: list[ExpectationOutcome]

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def metrics(self) -> dict[str, float]:
        return {
            "validation_success": float(self.success),
            "rows": float(self.n_rows),
            "expectations_evaluated": float(len(self.outcomes)),
            "expectations_failed": float(len(self.failed)),
        }

    def summary(self) -> str:
        if self.success:
            return f"{self.tasks}: all {len(self.outcomes)} expectations passed on {self.n_rows} rows"
        lines = [
            f"{self.tasks}: {len(self.failed)} of {len(self.outcomes)} expectations failed "
            f"on {self.n_rows} rows:"
        ]
        for o in self.failed:
            where = f" on {o.column}" if o.column else ""
            ex = f" e.g. {', '.join(o.examples)}" if o.examples else ""
            lines.append(f"  - {o.expectation}{where}: {o.unexpected_count} row(s){ex}")
        lines.append("Fix the rows (or run `harnessrl stage clean` first); full results in gx_results.json.")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = [
            "## Validate (Great Expectations)",
            "",
            f"{'✅ passed' if self.success else '❌ failed'}: {len(self.outcomes) - len(self.failed)}/"
            f"{len(self.outcomes)} expectations on **{self.n_rows}** rows.",
            "",
            "| expectation | column | result | unexpected | examples |",
            "|---|---|---|---:|---|",
        ]
        for o in self.outcomes:
            ex = ", ".join(f"`{e}`" for e in o.examples)
            lines.append(
                f"| {o.expectation} | {o.column or '—'} | {'✅' if o.success else '❌'} | "
                f"{o.unexpected_count} | {ex} |"
            )
        return "\n".join(lines) + "\n"


_HUNK_START = re.compile(r"\n@@ -\d")


def _patch_head(patch: Any) -> Any:
    """The patch up to and including its first hunk header: all UNIFIED_DIFF looks at."""
    if not isinstance(patch, str):
        return patch
    m = _HUNK_START.search(patch)
    return patch[: m.end()] if m else patch[:2000]


def _is_test_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, str) and t for t in v)


def _disjoint_test_lists(f2p: Any, p2p: Any) -> bool:
    """Both are test lists and no test is in both (False when either is not a list of test ids)."""
    if not isinstance(f2p, list) or not isinstance(p2p, list):
        return False
    return _is_test_list(f2p) and _is_test_list(p2p) and set(f2p).isdisjoint(p2p)


def validation_frame(rows: list[dict]):
    """The DataFrame the suite runs on: the rows' columns, with `patch` cut after its first hunk header and
    FAIL_TO_PASS / PASS_TO_PASS replaced by their lengths (None stays None, a non-list becomes -1), plus
    helper columns for the list checks. GX pickles and hashes the whole frame for every batch, so handing
    it 300 MB of diffs and 1.5 M test ids at SWE-smith scale costs minutes and gigabytes for nothing."""
    import pandas as pd

    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    data: dict[str, list] = {
        c: [r.get(c) for r in rows] for c in columns if c not in ("FAIL_TO_PASS", "PASS_TO_PASS", "patch")
    }
    if "patch" in columns:
        data["patch"] = [_patch_head(r.get("patch")) for r in rows]
    f2p = [r.get("FAIL_TO_PASS") for r in rows]
    p2p = [r.get("PASS_TO_PASS") for r in rows]
    for name, values in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)):
        if name in columns:
            data[name] = [None if v is None else len(v) if isinstance(v, list) else -1 for v in values]
    data["tests_are_lists"] = [_is_test_list(a) and _is_test_list(b) for a, b in zip(f2p, p2p, strict=True)]
    data["n_fail_to_pass"] = [len(a) if isinstance(a, list) else -1 for a in f2p]
    data["f2p_p2p_disjoint"] = [_disjoint_test_lists(a, b) for a, b in zip(f2p, p2p, strict=True)]
    return pd.DataFrame(data)


def build_suite(gx, columns: set[str]):
    # each expectation from the module that defines it (the package re-exports them without __all__)
    from great_expectations.expectations.core.expect_column_value_lengths_to_be_between import (
        ExpectColumnValueLengthsToBeBetween,
    )
    from great_expectations.expectations.core.expect_column_values_to_be_between import (
        ExpectColumnValuesToBeBetween,
    )
    from great_expectations.expectations.core.expect_column_values_to_be_in_set import (
        ExpectColumnValuesToBeInSet,
    )
    from great_expectations.expectations.core.expect_column_values_to_be_of_type import (
        ExpectColumnValuesToBeOfType,
    )
    from great_expectations.expectations.core.expect_column_values_to_be_unique import (
        ExpectColumnValuesToBeUnique,
    )
    from great_expectations.expectations.core.expect_column_values_to_match_regex import (
        ExpectColumnValuesToMatchRegex,
    )
    from great_expectations.expectations.core.expect_column_values_to_not_be_null import (
        ExpectColumnValuesToNotBeNull,
    )
    from great_expectations.expectations.core.expect_table_columns_to_match_set import (
        ExpectTableColumnsToMatchSet,
    )
    from great_expectations.expectations.core.expect_table_row_count_to_be_between import (
        ExpectTableRowCountToBeBetween,
    )

    suite = gx.ExpectationSuite(name="swesmith_tasks")
    add = suite.add_expectation
    add(ExpectTableRowCountToBeBetween(min_value=1))
    add(ExpectTableColumnsToMatchSet(column_set=list(TASK_FIELDS_REQUIRED), exact_match=False))
    for col in TASK_FIELDS_REQUIRED:
        add(ExpectColumnValuesToNotBeNull(column=col))
    for col in ("instance_id", "repo", "patch", "problem_statement"):
        add(ExpectColumnValuesToBeOfType(column=col, type_="str"))
    add(ExpectColumnValuesToBeUnique(column="instance_id"))
    add(ExpectColumnValuesToMatchRegex(column="instance_id", regex=INSTANCE_ID))
    add(ExpectColumnValuesToMatchRegex(column="repo", regex=REPO))
    add(ExpectColumnValuesToMatchRegex(column="patch", regex=UNIFIED_DIFF))
    add(ExpectColumnValueLengthsToBeBetween(column="problem_statement", min_value=1))
    add(ExpectColumnValuesToBeInSet(column="tests_are_lists", value_set=[True]))
    add(ExpectColumnValuesToBeBetween(column="n_fail_to_pass", min_value=1))
    add(ExpectColumnValuesToBeInSet(column="f2p_p2p_disjoint", value_set=[True]))
    if "created_at" in columns:
        add(ExpectColumnValuesToMatchRegex(column="created_at", regex=ISO_DATE))  # dateutil: 10x slower
    return suite


def _outcome(result, columns: set[str]) -> ExpectationOutcome:
    cfg = result.expectation_config
    res = result.result or {}
    column = cfg.kwargs.get("column", "")
    if column and column not in columns:
        return ExpectationOutcome(
            expectation=cfg.type, column=column, success=False, examples=["the column is missing"]
        )
    examples: list[str] = []
    for item in res.get("partial_unexpected_index_list") or []:
        if isinstance(item, dict) and item.get("instance_id") is not None:
            examples.append(str(item["instance_id"]))
    if not examples and not result.success:
        details = res.get("details", {}).get("mismatched", {}).get("missing")
        examples = [f"missing column {c}" for c in details or []] or (
            [f"observed {res['observed_value']}"] if "observed_value" in res else []
        )
    exc = getattr(result, "exception_info", None) or {}
    if exc.get("raised_exception"):
        msg = str(exc.get("exception_message") or "error").splitlines()[0]
        examples = [f"could not run: {msg[:100]}"]
    seen: list[str] = []
    for e in examples:
        if e not in seen:
            seen.append(e)
    return ExpectationOutcome(
        expectation=cfg.type,
        column=column,
        success=bool(result.success),
        unexpected_count=int(res.get("unexpected_count") or 0),
        examples=seen[:MAX_EXAMPLES],
    )


def validate_frame(df, label: str = "tasks") -> tuple[ValidationReport, dict]:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch_def = (
        context.data_sources.add_pandas("tasks")
        .add_dataframe_asset("rows")
        .add_batch_definition_whole_dataframe("all")
    )
    suite = context.suites.add(build_suite(gx, set(df.columns)))
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    has_ids = "instance_id" in df.columns and df["instance_id"].notna().any()
    result = batch.validate(
        suite,
        result_format={
            "result_format": "SUMMARY",
            "partial_unexpected_count": 20,
            **({"unexpected_index_column_names": ["instance_id"]} if has_ids else {}),
        },
    )
    outcomes = [_outcome(r, set(df.columns)) for r in result.results]
    report = ValidationReport(tasks=label, n_rows=len(df), success=bool(result.success), outcomes=outcomes)
    return report, json.loads(json.dumps(result.to_json_dict(), default=str))


def validate_taskset(tasks: Path, out_dir: Path, *, raise_on_failure: bool = True) -> ValidationReport:
    """Validates tasks.jsonl of a task set; writes out_dir/gx_results.json, metrics.json and report.md.
    Raises ValidationFailed (after writing them) when the suite fails and `raise_on_failure`."""
    ts = TaskSet.open(tasks)
    frame = validation_frame(list(read_jsonl(ts.tasks_path)))  # the full rows are freed right away
    report, gx_json = validate_frame(frame, str(ts.tasks_path))
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "gx_results.json", gx_json)
    atomic_write_json(out_dir / "metrics.json", report.metrics())
    atomic_write_text(out_dir / "report.md", report.markdown())
    logger.info("%s", report.summary().splitlines()[0])
    if raise_on_failure and not report.success:
        raise ValidationFailed(report)
    return report
