"""Splitting a git diff per file and dropping the changes an agent must not make to get graded.

Dropped (whole file sections, recorded with the reason, and the result is flagged):
- the task's own F2P/P2P test files, anything under a `tests/`, `test/` or `testing/` directory, `test_*.py`,
  `*_test.py`, any `conftest.py`;
- pytest/tox configuration: `pytest.ini`, `.pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml` (packaging
  files are not re-installed at verification, so changing them cannot legitimately help a fix);
- interpreter start-up hooks: `sitecustomize.py`, `usercustomize.py`, `*.pth`;
- byte code (`__pycache__/`, `*.pyc`, `*.pyo`): an unchecked-hash .pyc runs instead of its source;
- a *new* top-level module that shadows the standard library or the test runner (`pytest.py`, `json/`, ...).

Kept but flagged as `suspicious` (for audit): added lines in source files that reach into the test runner or
the interpreter's exit path (`_pytest`, `atexit`, `os._exit`, `sys.modules[...] =`, ...).
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

TEST_DIRS = {"tests", "test", "testing"}
CONFIG_FILES = {"pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "conftest.py"}
STARTUP_HOOKS = {"sitecustomize.py", "usercustomize.py"}
TEST_RUNNER_MODULES = {
    "pytest",
    "_pytest",
    "pluggy",
    "py",
    "iniconfig",
    "packaging",
    "xdist",
    "pytest_timeout",
}
SHADOWABLE = set(sys.stdlib_module_names) | TEST_RUNNER_MODULES
SUSPICIOUS = re.compile(
    r"\b(_pytest|pytest_\w+hook|atexit|os\._exit|sys\.modules\[[^\]]*\]\s*=|"
    r"sys\.settrace|sys\.setprofile|builtins\.|__builtins__|faulthandler)\b"
)
MAX_RECORDED_DIFF = 20_000


@dataclass
class FileDiff:
    path: str
    text: str  # the whole `diff --git` section, newline-terminated
    new_file: bool = False
    deleted_file: bool = False
    binary: bool = False


@dataclass
class Dropped:
    path: str
    reason: str
    diff: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FilterResult:
    kept: list[FileDiff] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    suspicious: list[dict] = field(default_factory=list)

    @property
    def patch(self) -> str:
        return "".join(f.text for f in self.kept)

    @property
    def flagged(self) -> bool:
        return bool(self.dropped or self.suspicious)


def _unquote(s: str) -> str:
    """Undoes git's C-style path quoting ("a/t\\303\\251st.py")."""
    if not (s.startswith('"') and s.endswith('"')):
        return s
    raw = s[1:-1].encode("latin-1", errors="backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", errors="replace")


def _header_path(header: str) -> str:
    rest = header[len("diff --git ") :]
    if rest.startswith('"'):
        end = rest.index('" ', 1) + 1
        return _unquote(rest[:end])[2:]
    # --no-renames: both sides name the same path, "a/P b/P"
    return rest[2 : 2 + (len(rest) - 5) // 2]


def split_diff(diff: str) -> list[FileDiff]:
    files: list[FileDiff] = []
    current: list[str] = []

    def flush() -> None:
        if not current:
            return
        text = "".join(current)
        header = current[0].rstrip("\n")
        if not header.startswith("diff --git "):
            raise ValueError(f"not a git diff: first line is {header[:80]!r}")
        path = _header_path(header)
        for line in current[1:6]:
            name = line[4:].rstrip("\n").rstrip("\t")  # git appends a tab to names with spaces
            if line.startswith("+++ b/"):
                path = name[2:]
            elif line.startswith('+++ "b/'):
                path = _unquote(name)[2:]
        files.append(
            FileDiff(
                path=path,
                text=text,
                new_file=any(ln.startswith("new file mode") for ln in current[1:4]),
                deleted_file=any(ln.startswith("deleted file mode") for ln in current[1:4]),
                binary=any(ln.startswith(("GIT binary patch", "Binary files")) for ln in current),
            )
        )
        current.clear()

    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            flush()
        current.append(line if line.endswith("\n") else line + "\n")
    flush()
    return files


def test_files_of(test_ids: list[str]) -> set[str]:
    return {t.split("::", 1)[0] for t in test_ids if t}


def drop_reason(f: FileDiff, task_test_files: set[str]) -> str:
    p = PurePosixPath(f.path)
    name = p.name
    if f.path in task_test_files:
        return "task test file (FAIL_TO_PASS/PASS_TO_PASS)"
    if any(part in TEST_DIRS for part in p.parts[:-1]):
        return "file under a test directory"
    if name == "conftest.py":
        return "conftest.py (pytest plugin)"
    if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
        return "test module"
    if name in CONFIG_FILES:
        return "pytest/tox/packaging configuration"
    if name in STARTUP_HOOKS or name.endswith(".pth"):
        return "interpreter start-up hook"
    if "__pycache__" in p.parts or p.suffix in (".pyc", ".pyo"):
        return "byte code"
    if f.new_file:
        parts = list(p.parts)
        if parts[0] == "src" and len(parts) > 1:
            parts = parts[1:]
        top = parts[0]
        module = top[:-3] if (len(parts) == 1 and top.endswith(".py")) else (top if len(parts) > 1 else "")
        if module in SHADOWABLE:
            return f"new top-level module shadows {module!r} (standard library / test runner)"
    return ""


def filter_diff(diff: str, fail_to_pass: list[str], pass_to_pass: list[str]) -> FilterResult:
    task_tests = test_files_of(fail_to_pass) | test_files_of(pass_to_pass)
    out = FilterResult()
    for f in split_diff(diff):
        reason = drop_reason(f, task_tests)
        if reason:
            out.dropped.append(Dropped(f.path, reason, f.text[:MAX_RECORDED_DIFF]))
            continue
        out.kept.append(f)
        if f.path.endswith(".py") and not f.binary:
            for line in f.text.splitlines():
                if line.startswith("+") and not line.startswith("+++") and SUSPICIOUS.search(line):
                    out.suspicious.append({"path": f.path, "line": line[1:][:300]})
    return out
