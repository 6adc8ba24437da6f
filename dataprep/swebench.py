"""Import SWE-bench-format rows (SWE-bench, Verified, Lite, SWE-Gym) into a task set.

A row names a GitHub repo, a `base_commit`, the fix (`patch`), the tests (`test_patch`) and FAIL_TO_PASS /
PASS_TO_PASS (JSON-encoded strings or lists). Each repo comes from a local clone, mirror or bundle (nothing
outside the package indexes is reachable here). For each row the output bundle holds branch `<instance_id>`:
one parentless commit with the tree of `base_commit` — no history, so neither the fix nor the tests (which the
upstream history holds in later commits) ever reach a rollout; `test_patch` stays in the row and verify applies
it at grading time only.

Every row that cannot be converted is kept in `rejects.jsonl` with one `ImportReject` reason and a one-line
detail; nothing is dropped silently.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from dataprep.load import normalize_row
from harnessrl.io import read_jsonl
from harnessrl.progress import track
from harnessrl.sandbox.workspace import WorkspaceError, git, git_env
from harnessrl.taskset import TaskLayout, TaskSet, bundle_name, write_taskset

logger = logging.getLogger(__name__)

SWEBENCH_REQUIRED = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
MAX_PRINTED = 20
_SHA = re.compile(r"[0-9a-fA-F]{7,64}")
_PYTEST_ID = re.compile(r"[^:\s]+\.py::\S")


class ImportReject(StrEnum):
    """Why a SWE-bench row was not converted (`reason` in rejects.jsonl)."""

    MALFORMED_ROW = "malformed_row"  # not a JSON object
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"  # wrong type, FAIL_TO_PASS not a JSON list, unknown column
    BAD_INSTANCE_ID = "bad_instance_id"  # not usable as a git branch name
    UNSUPPORTED_TEST_IDS = "unsupported_test_ids"  # not pytest node ids: verify runs pytest only
    DUPLICATE_INSTANCE_ID = "duplicate_instance_id"
    UNKNOWN_REPO = "unknown_repo"  # no local mirror given for the row's repo
    BASE_COMMIT_NOT_FOUND = "base_commit_not_found"
    PATCH_DOES_NOT_APPLY = "patch_does_not_apply"
    TEST_PATCH_DOES_NOT_APPLY = "test_patch_does_not_apply"


@dataclass
class Reject:
    where: str  # file:line or file row N
    instance_id: str | None
    reason: ImportReject
    detail: str

    def line(self) -> str:
        who = f" {self.instance_id}" if self.instance_id else ""
        return f"{self.where}{who}: {self.reason}: {self.detail}"

    def to_row(self) -> dict[str, Any]:
        return {**asdict(self), "reason": str(self.reason)}


def is_swebench_row(raw: Any) -> bool:
    return (
        isinstance(raw, dict) and isinstance(raw.get("test_patch"), str) and bool(raw["test_patch"].strip())
    )


def missing_repo_hint(repo: str) -> str:
    return (
        f"no local mirror of {repo}: pass --repo-dir {repo}=PATH (a clone, `git clone --mirror` or bundle) or "
        f"put {repo.replace('/', '__')}.git (or .bundle) in the --repos directory"
    )


def find_mirror(repo: str, repos_dir: Path | None, repo_dirs: Mapping[str, Path]) -> Path | None:
    """The clone/mirror/bundle given for `repo`: `--repo-dir repo=PATH`, else `<dir>/<owner>__<name>[.git|.bundle]`
    or `<dir>/<owner>/<name>[.git]`."""
    if repo in repo_dirs:
        path = Path(repo_dirs[repo])
        return path if path.exists() else None
    if repos_dir is None:
        return None
    flat = repo.replace("/", "__")
    for name in (f"{flat}.git", f"{flat}.bundle", flat, f"{repo}.git", repo):
        if (repos_dir / name).exists():
            return repos_dir / name
    return None


class _Mirror:
    """A scratch bare repo that borrows the objects of the given clone/mirror (or of a bundle, unpacked) and
    gets one parentless commit per task: the tree of its base_commit."""

    def __init__(self, source: Path, scratch: Path):
        self.git_dir = scratch / "out.git"
        git(["init", "-q", "--bare", "--template=", str(self.git_dir)])
        if source.is_file():  # a bundle
            unpacked = scratch / "src.git"
            git(["clone", "-q", "--mirror", str(source.resolve()), str(unpacked)])
            objects = unpacked / "objects"
        else:
            common = git(["-C", str(source), "rev-parse", "--path-format=absolute", "--git-common-dir"])
            objects = Path(common.stdout.decode().strip()) / "objects"
        (self.git_dir / "objects" / "info").mkdir(parents=True, exist_ok=True)
        (self.git_dir / "objects" / "info" / "alternates").write_text(f"{objects}\n")
        self.main: str | None = None

    def run(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None) -> str:
        return git(["--git-dir", str(self.git_dir), *args], env=env, input=input).stdout.decode()

    def tree(self, base_commit: str) -> str | None:
        try:
            return self.run("rev-parse", "--verify", "-q", f"{base_commit}^{{commit}}^{{tree}}").strip()
        except WorkspaceError:
            return None

    def apply_errors(self, tree: str, patches: list[str], scratch: Path) -> list[str]:
        """Per patch: '' when it applies to `tree` (checked against one index of it), else git's first error line."""
        index = scratch / "index"
        index.unlink(missing_ok=True)
        env = git_env(GIT_INDEX_FILE=str(index))
        self.run("read-tree", tree, env=env)
        errors = []
        for patch in patches:
            try:
                self.run(
                    "apply", "--cached", "--check", "--whitespace=nowarn", "-", input=patch.encode(), env=env
                )
                errors.append("")
            except WorkspaceError as e:
                errors.append((str(e).split("failed: ", 1)[-1].splitlines() or ["(no message)"])[0][:300])
        return errors

    def add_task(self, instance_id: str, tree: str, base_commit: str) -> None:
        sha = self.run("commit-tree", tree, "-m", f"{instance_id} at base_commit {base_commit}").strip()
        self.run("update-ref", f"refs/heads/{instance_id}", sha)
        if self.main is None:
            self.main = sha
            self.run("update-ref", "refs/heads/main", sha)

    def bundle(self, dest: Path) -> Path:
        self.run("bundle", "create", "-q", str(dest.resolve()), "--branches")
        return dest


def _check_row(raw: Any, where: str, allow_extra: bool) -> tuple[dict | None, Reject | None]:
    iid = raw.get("instance_id") if isinstance(raw, dict) else None
    iid = iid if isinstance(iid, str) else None
    if not isinstance(raw, dict):
        return None, Reject(
            where, None, ImportReject.MALFORMED_ROW, f"expected a JSON object, got {type(raw).__name__}"
        )
    missing = [f for f in SWEBENCH_REQUIRED if f not in raw]
    if missing:
        detail = f"missing field(s) {', '.join(missing)} (SWE-bench rows need {', '.join(SWEBENCH_REQUIRED)})"
        return None, Reject(where, iid, ImportReject.MISSING_FIELD, detail)
    problems: list[str] = []
    row = normalize_row(raw, where, problems, allow_extra)
    if row is None:
        detail = "; ".join(p.removeprefix(f"{where}: ") for p in problems)
        return None, Reject(where, iid, ImportReject.BAD_FIELD, detail)
    if not isinstance(row["base_commit"], str) or not _SHA.fullmatch(row["base_commit"]):
        detail = f"base_commit: expected a hex commit sha, got {row['base_commit']!r:.60}"
        return None, Reject(where, iid, ImportReject.BAD_FIELD, detail)
    if not row["test_patch"].strip():
        return None, Reject(where, iid, ImportReject.BAD_FIELD, "test_patch: empty (no tests to grade with)")
    odd = next((t for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"] if not _PYTEST_ID.match(t)), None)
    if odd is not None or not row["FAIL_TO_PASS"]:
        detail = (
            f"test id {odd!r:.80} is not a pytest node id (<file>.py::<name>); verify runs pytest, so repos "
            "graded by their own runner (django's runtests, sympy's bin/test) cannot be graded here"
            if odd is not None
            else "FAIL_TO_PASS is empty: nothing to grade"
        )
        return None, Reject(where, iid, ImportReject.UNSUPPORTED_TEST_IDS, detail)
    return row, None


def _valid_branch(name: str) -> bool:
    return name != "main" and git(["check-ref-format", f"refs/heads/{name}"], check=False).returncode == 0


@dataclass
class SwebenchImport:
    rows: list[dict]
    rejects: list[Reject]
    bundles: dict[str, Path]
    missing_repos: dict[str, str]

    def reasons(self) -> dict[str, int]:
        return dict(sorted(Counter(str(r.reason) for r in self.rejects).items()))


def convert_rows(
    raw_rows: Iterable[tuple[str, Any]],
    reader_problems: list[str],
    repos_dir: Path | None,
    repo_dirs: Mapping[str, Path],
    scratch: Path,
    *,
    allow_extra: bool = False,
) -> SwebenchImport:
    """Checked rows and one bundle per repo (in `scratch`), and a Reject for every row that failed."""
    rejects: list[Reject] = []
    accepted: list[tuple[str, dict]] = []
    seen: set[str] = set()
    for where, raw in raw_rows:
        row, reject = _check_row(raw, where, allow_extra)
        if reject is None and row is not None:
            iid = row["instance_id"]
            if iid in seen:
                reject = Reject(where, iid, ImportReject.DUPLICATE_INSTANCE_ID, "an earlier row has this id")
            elif not _valid_branch(iid):
                reject = Reject(where, iid, ImportReject.BAD_INSTANCE_ID, "not usable as a git branch name")
            else:
                seen.add(iid)
                accepted.append((where, row))
        if reject is not None:
            rejects.append(reject)
    # lines the reader could not parse at all: the problem text starts with its file:line
    rejects += [
        Reject(p.split(": ", 1)[0], None, ImportReject.MALFORMED_ROW, p.split(": ", 1)[-1])
        for p in reader_problems
    ]

    by_repo: dict[str, list[tuple[str, dict]]] = {}
    for where, row in accepted:
        by_repo.setdefault(row["repo"], []).append((where, row))
    rows_ok: set[str] = set()
    bundles: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for repo in track(sorted(by_repo), "import SWE-bench repos"):
        source = find_mirror(repo, repos_dir, repo_dirs)
        if source is None:
            missing[repo] = missing_repo_hint(repo)
            rejects += [
                Reject(w, r["instance_id"], ImportReject.UNKNOWN_REPO, missing[repo])
                for w, r in by_repo[repo]
            ]
            continue
        work = scratch / repo.replace("/", "__")
        work.mkdir()
        try:
            mirror = _Mirror(source, work)
        except WorkspaceError as e:
            missing[repo] = f"{source}: not a git clone, mirror or bundle ({e})"
            rejects += [
                Reject(w, r["instance_id"], ImportReject.UNKNOWN_REPO, missing[repo])
                for w, r in by_repo[repo]
            ]
            continue
        for where, row in by_repo[repo]:
            reject = _add_task(mirror, row, where, source, work)
            if reject is None:
                rows_ok.add(row["instance_id"])
            else:
                rejects.append(reject)
        if mirror.main is not None:
            bundles[repo] = mirror.bundle(scratch / bundle_name(repo))
    rows = [r for _, r in accepted if r["instance_id"] in rows_ok]
    return SwebenchImport(rows, rejects, bundles, missing)


def _add_task(mirror: _Mirror, row: dict, where: str, source: Path, work: Path) -> Reject | None:
    iid, base = row["instance_id"], row["base_commit"]
    tree = mirror.tree(base)
    if tree is None:
        detail = (
            f"base_commit {base} is not in the mirror of {row['repo']} ({source}); "
            "update the mirror (git fetch) or check the row"
        )
        return Reject(where, iid, ImportReject.BASE_COMMIT_NOT_FOUND, detail)
    checks = (
        ("patch", ImportReject.PATCH_DOES_NOT_APPLY),
        ("test_patch", ImportReject.TEST_PATCH_DOES_NOT_APPLY),
    )
    errors = mirror.apply_errors(tree, [row[field] for field, _ in checks], work)
    for (field, reason), error in zip(checks, errors, strict=True):
        if error:
            return Reject(where, iid, reason, f"{field} does not apply at base_commit {base[:12]}: {error}")
    mirror.add_task(iid, tree, base)
    return None


def import_swebench(
    data: Path,
    raw_rows: Iterable[tuple[str, Any]],
    reader_problems: list[str],
    out: Path,
    *,
    repos_dir: Path | None,
    repo_dirs: Mapping[str, Path],
    allow_extra: bool = False,
) -> TaskSet:
    """Writes the task set (tasks.jsonl, one bundle per repo, rejects.jsonl, manifest["import"])."""
    with tempfile.TemporaryDirectory(prefix="harnessrl-swebench-") as tmp:
        result = convert_rows(
            raw_rows, reader_problems, repos_dir, repo_dirs, Path(tmp), allow_extra=allow_extra
        )
        logger.info("%s: %d rows converted, %d rejected", data, len(result.rows), len(result.rejects))
        ts = write_taskset(
            out,
            result.rows,
            result.bundles,
            source=f"import:{data}",
            extra_manifest={
                "import": {
                    "format": str(TaskLayout.SWEBENCH),
                    "data": str(data),
                    "repos": str(repos_dir) if repos_dir else None,
                    "repo_dirs": {k: str(v) for k, v in sorted(repo_dirs.items())},
                    "missing_repos": result.missing_repos,
                    "converted": len(result.rows),
                    "rejected": len(result.rejects),
                    "rejected_by_reason": result.reasons(),
                }
            },
            rejects=[r.to_row() for r in result.rejects],
        )
    return ts


def reject_lines(ts: TaskSet, limit: int = MAX_PRINTED) -> list[str]:
    """One line per rejected row (the first `limit`), then where the rest are."""
    path = ts.root / "rejects.jsonl"
    rows = list(read_jsonl(path)) if path.is_file() else []
    lines = [
        Reject(r["where"], r["instance_id"], ImportReject(r["reason"]), r["detail"]).line()
        for r in rows[:limit]
    ]
    if len(rows) > limit:
        lines.append(f"... and {len(rows) - limit} more in {path}")
    return lines
