"""Preparing a repository for bug synthesis: copy it (a directory or an sdist) without VCS and build debris,
and tell source files (where bugs are planted) from test files."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

SKIP_DIRS = {
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".pytest_cache",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    "build",
    "dist",
    ".mypy_cache",
    ".ruff_cache",
    ".eggs",
    "node_modules",
    ".idea",
    ".vscode",
}
NON_SOURCE_DIRS = {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "scripts"}


class SynthesisError(ValueError):
    """The source cannot be used (not found, no tests, tests do not pass): the message says why and what to do."""


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in SKIP_DIRS or n.endswith((".egg-info", ".pyc", ".pyo", ".bundle"))}


def prepare_source(source: Path, dest: Path) -> str:
    """Copies a repo directory or an extracted sdist to `dest`; returns the project name."""
    source = Path(source)
    if source.is_dir():
        shutil.copytree(source, dest, ignore=_ignore)
        raw = source.resolve().name
    elif (
        source.is_file() and source.name.endswith((".tar.gz", ".tgz", ".tar")) and tarfile.is_tarfile(source)
    ):
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(source) as tar:
            tar.extractall(tmp, filter="data")
            entries = [p for p in Path(tmp).iterdir() if p.name not in SKIP_DIRS]
            root = entries[0] if len(entries) == 1 and entries[0].is_dir() else Path(tmp)
            shutil.copytree(root, dest, ignore=_ignore)
            raw = root.name if root != Path(tmp) else re.sub(r"\.(tar\.gz|tgz|tar)$", "", source.name)
    else:
        raise SynthesisError(
            f"{source}: not a directory or a .tar.gz source archive. Pass a repository "
            "directory or an sdist (`pip download --no-deps --no-binary :all: NAME==VER`)."
        )
    name = re.sub(r"-\d.*$", "", raw)  # parse-1.22.4 -> parse
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "repo"


def is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    base = parts[-1]
    return (
        base.startswith("test_")
        or base.endswith("_test.py")
        or base == "conftest.py"
        or any(p in ("tests", "test", "testing") for p in parts[:-1])
    )


def source_files(root: Path) -> dict[str, str]:
    """Non-test Python source files (relative posix path -> text) that bugs may be planted in."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if (
            is_test_path(rel)
            or parts[-1] in ("setup.py", "noxfile.py", "conftest.py")
            or any(p in NON_SOURCE_DIRS or p.startswith(".") for p in parts[:-1])
        ):
            continue
        try:
            out[rel] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def newest_mtime_iso(root: Path) -> str:
    newest = max((p.stat().st_mtime for p in root.rglob("*") if p.is_file()), default=0.0)
    return dt.datetime.fromtimestamp(int(newest), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
