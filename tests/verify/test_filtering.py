"""What the filter drops, on diffs produced by real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harnessrl.verify.filtering import filter_diff, split_diff


def _diff(tmp_path: Path, before: dict[str, str], after: dict[str, str | None]) -> str:
    repo = tmp_path / "r"
    repo.mkdir()
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True, text=True).stdout  # noqa: E731
    run("init", "-q")
    for path, text in before.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    run("add", "-A")
    run("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "base")
    for path, text in after.items():
        if text is None:
            (repo / path).unlink()
        else:
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text)
    run("add", "-A")
    return run("diff", "--cached", "--binary", "--no-renames")


def test_drops_tests_config_hooks_and_shadowing_modules(tmp_path):
    before = {
        "pkg/core.py": "x = 1\n",
        "tests/test_core.py": "def test(): pass\n",
        "setup.cfg": "[metadata]\n",
        "test_root.py": "def test(): pass\n",
        "src/other.py": "y = 1\n",
    }
    after = {
        "pkg/core.py": "x = 2\n",
        "tests/test_core.py": None,
        "conftest.py": "import pytest\n",
        "pkg/conftest.py": "\n",
        "setup.cfg": "[tool:pytest]\naddopts = -p evil\n",
        "pytest.ini": "[pytest]\n",
        "sitecustomize.py": "import os\n",
        "evil.pth": "import os\n",
        "pkg/__pycache__/core.cpython-311.pyc": "x",
        "json.py": "dumps = None\n",
        "pytest.py": "\n",
        "src/os.py": "\n",
        "pkg/new_helper.py": "z = 3\n",
        "test_root.py": "def test(): assert 1\n",
        "pkg/util_test.py": "\n",
        "file with space.py": "a = 1\n",
        "src/other.py": "import atexit\natexit.register(print)\ny = 2\n",
    }
    result = filter_diff(_diff(tmp_path, before, after), ["tests/test_core.py::test"], [])
    kept = sorted(f.path for f in result.kept)
    dropped = {d.path: d.reason for d in result.dropped}
    assert kept == ["file with space.py", "pkg/core.py", "pkg/new_helper.py", "src/other.py"]
    assert set(dropped) == {
        "tests/test_core.py",
        "conftest.py",
        "pkg/conftest.py",
        "setup.cfg",
        "pytest.ini",
        "sitecustomize.py",
        "evil.pth",
        "pkg/__pycache__/core.cpython-311.pyc",
        "json.py",
        "pytest.py",
        "src/os.py",
        "test_root.py",
        "pkg/util_test.py",
    }
    assert dropped["tests/test_core.py"].startswith("task test file")
    assert "shadows 'json'" in dropped["json.py"]
    assert result.flagged and [s["path"] for s in result.suspicious] == ["src/other.py", "src/other.py"]
    # what is kept still applies as a patch
    assert result.patch.count("diff --git") == 4


def test_existing_module_named_like_stdlib_is_not_dropped(tmp_path):
    diff = _diff(tmp_path, {"types.py": "a = 1\n"}, {"types.py": "a = 2\n"})
    assert [f.path for f in filter_diff(diff, [], []).kept] == ["types.py"]


def test_split_diff_handles_quoted_paths_and_binary(tmp_path):
    diff = _diff(tmp_path, {"a.py": "1\n"}, {"tést ü.py": "x\n", "b.bin": "\x00\x01"})
    files = {f.path: f for f in split_diff(diff)}
    assert set(files) == {"tést ü.py", "b.bin"}
    assert files["b.bin"].binary and files["b.bin"].new_file
