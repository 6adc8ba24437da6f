"""Cleaning rules for SWE-smith task rows: empty problem statements, missing repo bundles or task branches,
more than 200 tests (a task that large costs minutes per verification and is rarely a single bug), empty
FAIL_TO_PASS, unparsable patches and duplicates.

Every rejected row keeps all of its reasons; `n_in == n_kept + n_rejected` always.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

from dataprep.gitrepo import GitError, bundle_heads
from dataprep.load import load_rows
from harnessrl.io import atomic_output, atomic_write_bytes, write_jsonl
from harnessrl.progress import track
from harnessrl.taskset import TaskSet, write_taskset

logger = logging.getLogger(__name__)


class RejectReason(StrEnum):
    """Why a row is rejected, in the order the rules are checked (`reject_reasons` of rejected.jsonl)."""

    EMPTY_PROBLEM_STATEMENT = "empty_problem_statement"
    MISSING_REPO_BUNDLE = "missing_repo_bundle"
    MISSING_TASK_BRANCH = "missing_task_branch"
    TOO_MANY_TESTS = "too_many_tests"
    EMPTY_F2P = "empty_fail_to_pass"
    UNPARSABLE_PATCH = "unparsable_patch"
    DUPLICATE_INSTANCE_ID = "duplicate_instance_id"
    DUPLICATE_PATCH = "duplicate_patch"


@dataclass
class CleanParams:
    max_tests: int = 200  # F2P + P2P above this -> rejected
    require_f2p: bool = True
    require_problem_statement: bool = True
    min_problem_statement_chars: int = 1  # after stripping whitespace
    check_branches: bool = True  # the task branch must exist in the repo bundle (read once per bundle)
    drop_duplicates: bool = True  # same instance_id, or same (repo, patch) as an earlier row
    require_parsable_patch: bool = True


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patch_problem(patch: str) -> str | None:
    """Why `patch` is not a well-formed unified diff (file headers, hunk line counts), or None."""
    if not patch.strip():
        return "empty patch"
    lines = patch.split("\n")
    if lines[-1] != "":
        return f"line {len(lines)}: no newline at the end (git apply: corrupt patch); truncated?"
    lines.pop()
    old_left = new_left = 0
    files = hunks = 0
    for n, line in enumerate(lines, 1):
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag == " " or line == "":
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            elif tag == "\\":
                continue
            else:
                return f"line {n}: hunk ends before its header's line counts are reached"
            if old_left < 0 or new_left < 0:
                return f"line {n}: hunk is longer than its header says"
            continue
        if line.startswith("@@"):
            m = _HUNK.match(line)
            if m is None:
                return f"line {n}: malformed hunk header {line[:40]!r}"
            if not files:
                return f"line {n}: hunk before any '+++' file header"
            old_left = 1 if m[2] is None else int(m[2])
            new_left = 1 if m[4] is None else int(m[4])
            hunks += 1
        elif line.startswith("+++ "):
            files += 1
        elif line[:1] in "+ " and line or (line.startswith("-") and not line.startswith("--- ")):
            return f"line {n}: diff content outside any hunk"
    if old_left > 0 or new_left > 0:
        return "patch ends inside a hunk (truncated?)"
    if not hunks:
        return "no '@@' hunk: not a unified diff"
    return None


@dataclass
class CleanReport:
    n_in: int = 0
    n_kept: int = 0
    n_rejected: int = 0
    reasons: Counter[RejectReason] = field(default_factory=Counter)  # reason -> rows carrying it
    params: CleanParams = field(default_factory=CleanParams)

    def metrics(self) -> dict[str, float]:
        out = {
            "rows_in": float(self.n_in),
            "rows_kept": float(self.n_kept),
            "rows_rejected": float(self.n_rejected),
        }
        out.update({f"rejected_{r}": float(self.reasons.get(r, 0)) for r in RejectReason})
        return out

    def markdown(self) -> str:
        lines = [
            "## Clean",
            "",
            f"**{self.n_in}** rows in → **{self.n_kept}** kept + **{self.n_rejected}** "
            f"rejected ({'reconciles' if self.n_in == self.n_kept + self.n_rejected else 'MISMATCH'}).",
            "",
            "| reason | rows | share of input |",
            "|---|---:|---:|",
        ]
        for r in RejectReason:
            n = self.reasons.get(r, 0)
            lines.append(f"| `{r}` | {n} | {100 * n / max(self.n_in, 1):.1f}% |")
        lines += [
            "",
            "A rejected row can carry several reasons; each is counted.",
            "",
            "Parameters: " + ", ".join(f"`{k}={v}`" for k, v in asdict(self.params).items()),
            "",
        ]
        return "\n".join(lines)


def reject_reasons(rows: list[dict], ts: TaskSet, params: CleanParams) -> list[list[RejectReason]]:
    """Reasons per row (empty list = kept)."""
    heads: dict[str, set[str] | None] = {}  # repo -> branch names, None when there is no usable bundle
    seen_ids: set[str] = set()
    seen_patches: set[tuple[str, str]] = set()
    out: list[list[RejectReason]] = []
    for row in track(rows, "clean", min_total=1000):
        reasons: list[RejectReason] = []
        if (
            params.require_problem_statement
            and len((row.get("problem_statement") or "").strip()) < params.min_problem_statement_chars
        ):
            reasons.append(RejectReason.EMPTY_PROBLEM_STATEMENT)
        if params.check_branches:
            repo = row["repo"]
            if repo not in heads:
                bundle = ts.bundle(repo)
                try:
                    heads[repo] = bundle_heads(bundle) if bundle.is_file() else None
                except GitError:
                    heads[repo] = None
            if heads[repo] is None:
                reasons.append(RejectReason.MISSING_REPO_BUNDLE)
            elif row["instance_id"] not in heads[repo]:
                reasons.append(RejectReason.MISSING_TASK_BRANCH)
        if len(row["FAIL_TO_PASS"]) + len(row["PASS_TO_PASS"]) > params.max_tests:
            reasons.append(RejectReason.TOO_MANY_TESTS)
        if params.require_f2p and not row["FAIL_TO_PASS"]:
            reasons.append(RejectReason.EMPTY_F2P)
        if params.require_parsable_patch and patch_problem(row["patch"]) is not None:
            reasons.append(RejectReason.UNPARSABLE_PATCH)
        if params.drop_duplicates:
            key = (row["repo"], row["patch"])
            if row["instance_id"] in seen_ids:
                reasons.append(RejectReason.DUPLICATE_INSTANCE_ID)
            if row["patch"].strip() and key in seen_patches:  # also for an exact duplicate: all reasons kept
                reasons.append(RejectReason.DUPLICATE_PATCH)
            seen_ids.add(row["instance_id"])
            seen_patches.add(key)
        out.append(reasons)
    return out


def clean_taskset(
    tasks: Path,
    kept_out: Path,
    rejected_out: Path,
    params: CleanParams | None = None,
) -> CleanReport:
    """Writes the kept rows as a task set (`kept_out`, same bundles) and the rejected rows with their
    `reject_reasons` as JSONL (`rejected_out`)."""
    params = params or CleanParams()
    ts = TaskSet.open(tasks)
    rows = load_rows(ts.tasks_path, allow_extra=True)
    all_reasons = reject_reasons(rows, ts, params)
    kept = [r for r, why in zip(rows, all_reasons, strict=True) if not why]
    rejected = [{**r, "reject_reasons": why} for r, why in zip(rows, all_reasons, strict=True) if why]
    repos = {r["repo"] for r in kept}
    bundles = {repo: ts.bundle(repo) for repo in sorted(repos) if ts.bundle(repo).is_file()}
    report = CleanReport(
        n_in=len(rows),
        n_kept=len(kept),
        n_rejected=len(rejected),
        reasons=Counter(code for why in all_reasons for code in why),
        params=params,
    )
    logger.info("%s: kept %d of %d rows (%d rejected)", ts.tasks_path, len(kept), len(rows), len(rejected))
    write_jsonl(rejected_out, rejected)
    write_taskset(
        kept_out,
        kept,
        bundles,
        source=f"clean:{tasks}",
        extra_manifest={
            "clean": {"params": asdict(params), "metrics": report.metrics(), "input_manifest": ts.manifest}
        },
    )
    return report


def plot_reasons(report: CleanReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    counts = [report.reasons.get(r, 0) for r in RejectReason]
    ax.barh([r.value for r in RejectReason], counts, color="#c0504d")
    ax.set_xlabel("rejected rows")
    ax.set_title(f"clean: {report.n_kept} kept / {report.n_rejected} rejected of {report.n_in}")
    ax.invert_yaxis()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())


def run_clean_stage(tasks: Path, out_dir: Path, params: CleanParams | None = None) -> CleanReport:
    """The clean stage's artifacts in one directory (written atomically):
    kept/ (task set), rejected.jsonl, metrics.json, report.md, reasons.png."""
    with atomic_output(out_dir) as tmp:
        tmp.mkdir(parents=True)
        report = clean_taskset(tasks, tmp / "kept", tmp / "rejected.jsonl", params)
        (tmp / "metrics.json").write_text(json.dumps(report.metrics(), indent=2, sort_keys=True) + "\n")
        (tmp / "report.md").write_text(report.markdown())
        plot_reasons(report, tmp / "reasons.png")
    return report
