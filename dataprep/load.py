"""Load SWE-smith / SWE-bench rows from JSONL, JSON, Parquet or a HF `datasets.save_to_disk` directory.

Rows come back normalized: FAIL_TO_PASS / PASS_TO_PASS as lists of str (SWE-bench stores them as JSON
strings), `created_at` as an ISO string. Every problem in the file is collected first and reported together
(file:line or file row N, the field, and the fix) in one `DataError`; nothing is written on error.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dataprep.gitrepo import GitError, git
from harnessrl.progress import track
from harnessrl.taskset import (
    TASK_FIELDS_OPTIONAL,
    TASK_FIELDS_REQUIRED,
    TaskLayout,
    TaskSet,
    bundle_name,
    write_taskset,
)

# Columns of SWE-bench (and its Verified split) that carry no task semantics here but are kept verbatim.
KNOWN_EXTRA_FIELDS = ("hints_text", "version", "environment_setup_commit", "difficulty")
KNOWN_FIELDS = frozenset(TASK_FIELDS_REQUIRED + TASK_FIELDS_OPTIONAL + KNOWN_EXTRA_FIELDS)
TEST_LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
STRING_FIELDS = ("instance_id", "repo", "patch")
OPTIONAL_STRING_FIELDS = ("image_name", "base_commit", "test_patch") + KNOWN_EXTRA_FIELDS
MAX_LISTED = 30


class DataError(ValueError):
    """Input data with problems; `problems` lists each one as 'where: field: what is wrong (fix)'."""

    def __init__(self, problems: list[str], source: str | Path = ""):
        self.problems = list(problems)
        head = (
            f"{len(self.problems)} problem(s) in {source}:" if source else f"{len(self.problems)} problem(s):"
        )
        listed = [f"  - {p}" for p in self.problems[:MAX_LISTED]]
        if len(self.problems) > MAX_LISTED:
            listed.append(f"  … and {len(self.problems) - MAX_LISTED} more (DataError.problems has all)")
        super().__init__("\n".join([head, *listed]))


# ---------------------------------------------------------------- readers: yield (where, raw row)


def _read_json_lines(path: Path, problems: list[str]) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(
                    f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno}); "
                    "each line must be one JSON object"
                )


def _read_json_array(path: Path, problems: list[str]) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        problems.append(f"{path}:{e.lineno}: malformed JSON ({e.msg}); expected a JSON array of row objects")
        return
    if not isinstance(data, list):
        problems.append(f"{path}: expected a JSON array of row objects, got {type(data).__name__}")
        return
    for i, row in enumerate(data):
        yield f"{path} row {i}", row


def _read_arrow_table(table, where: str) -> Iterator[tuple[str, Any]]:
    for i, row in enumerate(table.to_pylist()):
        yield f"{where} row {i}", row


def _read_parquet(path: Path, problems: list[str]) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        problems.append(f"{path}: not a readable Parquet file ({e})")
        return
    yield from _read_arrow_table(table, str(path))


def _hf_arrow_files(split_dir: Path) -> list[Path]:
    state = json.loads((split_dir / "state.json").read_text())
    return [split_dir / f["filename"] for f in state.get("_data_files", [])]


def _read_hf_dir(path: Path, problems: list[str]) -> Iterator[tuple[str, Any]]:
    """A `Dataset.save_to_disk` dir (state.json + *.arrow) or a `DatasetDict` one (dataset_dict.json)."""
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        split_dirs = [path / s for s in splits]
    else:
        split_dirs = [path]
    for split_dir in split_dirs:
        try:
            files = _hf_arrow_files(split_dir)
        except (OSError, json.JSONDecodeError) as e:
            problems.append(
                f"{split_dir}: not a datasets `save_to_disk` directory ({e}); "
                "it needs state.json and its .arrow files"
            )
            continue
        for arrow in files:
            try:
                with pa.memory_map(str(arrow)) as source:
                    table = pa.ipc.open_stream(source).read_all()
            except (OSError, pa.ArrowInvalid) as e:
                problems.append(f"{arrow}: unreadable Arrow file ({e})")
                continue
            yield from _read_arrow_table(table, str(arrow))


def raw_rows(path: Path, problems: list[str]) -> Iterator[tuple[str, Any]]:
    if path.is_dir():
        if (path / "tasks.jsonl").is_file():
            return _read_json_lines(path / "tasks.jsonl", problems)
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return _read_hf_dir(path, problems)
        raise DataError(
            [
                f"{path}: directory is neither a task set (tasks.jsonl) nor a HF datasets export "
                "(state.json / dataset_dict.json from `save_to_disk`)"
            ]
        )
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    if suffix in (".jsonl", ".ndjson"):
        return _read_json_lines(path, problems)
    if suffix == ".json":
        head = path.open(encoding="utf-8").read(1).lstrip()
        return _read_json_array(path, problems) if head == "[" else _read_json_lines(path, problems)
    if suffix in (".parquet", ".pq"):
        return _read_parquet(path, problems)
    raise DataError(
        [
            f"{path}: unsupported file type {suffix or '(none)'}; use .jsonl, .json, .parquet or a "
            "HF `save_to_disk` directory"
        ]
    )


# ---------------------------------------------------------------- normalization


def _test_list(value: Any, where: str, name: str, problems: list[str]) -> list[str] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            problems.append(
                f"{where}: {name}: a string that is not a JSON list ({value[:60]!r}); "
                "give a list of pytest node ids"
            )
            return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, str) for t in value):
        problems.append(
            f"{where}: {name}: expected a list of test ids (str), got {type(value).__name__}"
            f" {str(value)[:60]!r}"
        )
        return None
    return list(value)


def normalize_row(raw: Any, where: str, problems: list[str], allow_extra: bool = False) -> dict | None:
    """The row with canonical types, or None after appending its problems."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected an object with SWE-smith fields, got {type(raw).__name__}")
        return None
    before = len(problems)
    row = dict(raw)
    for name in TASK_FIELDS_REQUIRED:
        if name not in row:
            problems.append(f"{where}: missing field {name!r} (required: {', '.join(TASK_FIELDS_REQUIRED)})")
    if not allow_extra:
        for name in sorted(set(row) - KNOWN_FIELDS):
            problems.append(
                f"{where}: unknown field {name!r}; remove or rename it "
                "(or allow extra fields: --allow-extra-fields)"
            )
    for name in STRING_FIELDS:
        if name in row and (not isinstance(row[name], str) or (name != "patch" and not row[name].strip())):
            problems.append(f"{where}: {name}: expected a non-empty string, got {row[name]!r:.60}")
    if "problem_statement" in row:
        if row["problem_statement"] is None:
            row["problem_statement"] = ""  # empty statements are a cleaning rule, not a load error
        elif not isinstance(row["problem_statement"], str):
            problems.append(
                f"{where}: problem_statement: expected a string, got "
                f"{type(row['problem_statement']).__name__}"
            )
    for name in TEST_LIST_FIELDS:
        if name in row:
            row[name] = _test_list(row[name], where, name, problems)
    for name in OPTIONAL_STRING_FIELDS:
        if row.get(name) is not None and not isinstance(row[name], str):
            problems.append(f"{where}: {name}: expected a string or null, got {type(row[name]).__name__}")
    created = row.get("created_at")
    if isinstance(created, dt.datetime | dt.date):
        row["created_at"] = created.isoformat()
    elif created is not None and not isinstance(created, str):
        problems.append(f"{where}: created_at: expected an ISO date string, got {type(created).__name__}")
    return row if len(problems) == before else None


def normalize_rows(
    raw_rows: Iterable[tuple[str, Any]], problems: list[str], allow_extra: bool = False
) -> list[dict]:
    rows = []
    for where, raw in raw_rows:
        row = normalize_row(raw, where, problems, allow_extra)
        if row is not None:
            rows.append(row)
    return rows


def load_rows(path: str | Path, *, allow_extra: bool = False) -> list[dict]:
    """Normalized rows of a JSONL/JSON/Parquet file, HF export dir or task-set dir; raises DataError."""
    path = Path(path)
    if not path.exists():
        raise DataError([f"{path}: no such file or directory"])
    problems: list[str] = []
    try:
        rows = normalize_rows(raw_rows(path, problems), problems, allow_extra)
    except UnicodeDecodeError as e:
        raise DataError([f"{path}: not UTF-8 text ({e.reason} at byte {e.start})"], path) from None
    if not problems and not rows:
        problems.append(f"{path}: no rows (empty file?); expected SWE-smith task rows")
    if problems:
        raise DataError(problems, path)
    return rows


# ---------------------------------------------------------------- import into a task set


def _bundle_from_url(url: str, dest: Path, scratch: Path) -> None:
    """All branches of `url` (no tags, no pull-request refs) as one bundle."""
    bare = scratch / dest.stem
    git(scratch, "init", "-q", "--bare", str(bare))
    git(bare, "fetch", "-q", "--no-tags", url, "+refs/heads/*:refs/heads/*")
    git(bare, "bundle", "create", "-q", str(dest.resolve()), "--branches")
    shutil.rmtree(bare, ignore_errors=True)


def repo_url(repos: str, repo: str) -> str:
    """`https://github.com` + `swesmith/x.1234abcd` -> `https://github.com/swesmith/x.1234abcd.git`;
    a template with `{repo}` is filled in instead."""
    if "{repo}" in repos:
        return repos.format(repo=repo)
    return f"{repos.rstrip('/')}/{repo}.git"


def detect_layout(data: Path) -> TaskLayout:
    """SWE-bench when the first row carries a non-empty test_patch, else SWE-smith."""
    if not Path(data).exists():
        return TaskLayout.SWESMITH  # load_rows reports the missing file
    from dataprep.swebench import is_swebench_row

    first = next((raw for _, raw in raw_rows(Path(data), [])), None)
    return TaskLayout.SWEBENCH if is_swebench_row(first) else TaskLayout.SWESMITH


def import_taskset(
    data: Path,
    repos: str | Path | None,
    out: Path,
    *,
    allow_extra: bool = False,
    repo_dirs: Mapping[str, Path] | None = None,
    layout: TaskLayout | None = None,
) -> TaskSet:
    """Turns downloaded rows + their repos into a task-set directory.

    SWE-bench rows (`dataprep.swebench`): `repos` is a directory of local clones/mirrors/bundles and/or
    `repo_dirs` maps `owner/name` to one; every row that cannot be converted goes to `rejects.jsonl` with its
    reason. SWE-smith rows: `repos` is a dir of `<owner>__<name>.bundle` files, or a git base URL / `{repo}` URL
    template to clone from; repos that cannot be found are listed in the manifest (`missing_repos`), their
    rows stay, and the clean stage rejects them."""
    if (layout or detect_layout(data)) is TaskLayout.SWEBENCH:
        return _import_swebench(data, repos, out, allow_extra, repo_dirs or {})
    if repos is None:
        raise DataError([f"{data}: SWE-smith rows need --repos (a directory of .bundle files or a git URL)"])
    rows = load_rows(data, allow_extra=allow_extra)
    dupes = _duplicate_ids(rows)  # kept on purpose: duplicates are a cleaning rule with a recorded reason
    needed = sorted({r["repo"] for r in rows})
    bundles: dict[str, Path] = {}
    missing: dict[str, str] = {}
    repos_str = str(repos)
    with tempfile.TemporaryDirectory(prefix="harnessrl-import-") as tmp:
        scratch = Path(tmp)
        if Path(repos_str).is_dir():
            for repo in needed:
                candidate = Path(repos_str) / bundle_name(repo)
                if candidate.is_file():
                    bundles[repo] = candidate
                else:
                    missing[repo] = f"no {candidate.name} in {repos_str}"
        elif "://" in repos_str or repos_str.startswith("git@"):
            for repo in track(needed, "clone + bundle repos"):
                dest = scratch / bundle_name(repo)
                try:
                    _bundle_from_url(repo_url(repos_str, repo), dest, scratch)
                    bundles[repo] = dest
                except GitError as e:
                    missing[repo] = str(e)
        else:
            raise DataError(
                [
                    f"--repos {repos_str}: neither a directory of .bundle files nor a git URL "
                    "(e.g. https://github.com or https://host/{repo}.git)"
                ]
            )
        return write_taskset(
            out,
            rows,
            bundles,
            source=f"import:{data}",
            extra_manifest={
                "import": {
                    "data": str(data),
                    "repos": repos_str,
                    "missing_repos": missing,
                    "duplicate_instance_ids": len(dupes),
                }
            },
        )


def _import_swebench(
    data: Path, repos: str | Path | None, out: Path, allow_extra: bool, repo_dirs: Mapping[str, Path]
) -> TaskSet:
    from dataprep.swebench import import_swebench

    data = Path(data)
    if not data.exists():
        raise DataError([f"{data}: no such file or directory"])
    if repos is not None and not Path(repos).is_dir():
        raise DataError(
            [f"--repos {repos}: not a directory (SWE-bench rows take local clones, mirrors or bundles)"]
        )
    for repo, path in repo_dirs.items():
        if not Path(path).exists():
            raise DataError([f"--repo-dir {repo}={path}: no such file or directory"])
    problems: list[str] = []
    return import_swebench(
        data,
        raw_rows(data, problems),
        problems,
        out,
        repos_dir=Path(repos) if repos is not None else None,
        repo_dirs=repo_dirs,
        allow_extra=allow_extra,
    )


def _duplicate_ids(rows: list[dict]) -> list[str]:
    seen: set[str] = set()
    dupes = []
    for r in rows:
        if r["instance_id"] in seen:
            dupes.append(r["instance_id"])
        seen.add(r["instance_id"])
    return dupes
