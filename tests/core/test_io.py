import json
import os

import pytest

from harnessrl.io import atomic_output, atomic_write_json, read_jsonl, write_jsonl
from harnessrl.taskset import TaskSet, bundle_name, write_taskset


def test_write_jsonl_roundtrip_and_replaces_atomically(tmp_path):
    path = tmp_path / "a" / "rows.jsonl"
    assert write_jsonl(path, [{"x": 1}, {"x": 2}]) == 2
    assert list(read_jsonl(path)) == [{"x": 1}, {"x": 2}]
    with pytest.raises(RuntimeError):
        write_jsonl(path, ({"x": i} if i < 2 else _boom() for i in range(3)))
    # the failed rewrite left the previous file intact and no temp files behind
    assert list(read_jsonl(path)) == [{"x": 1}, {"x": 2}]
    assert os.listdir(path.parent) == ["rows.jsonl"]


def _boom():
    raise RuntimeError("writer crashed")


def test_read_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"ok": 1}\n{"broken": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: malformed JSON"):
        list(read_jsonl(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected a JSON object"):
        list(read_jsonl(path))


def test_atomic_output_replaces_directory_whole(tmp_path):
    out = tmp_path / "set"
    with atomic_output(out) as tmp:
        tmp.mkdir()
        (tmp / "old.txt").write_text("old")
    with atomic_output(out) as tmp:
        tmp.mkdir()
        (tmp / "new.txt").write_text("new")
    assert sorted(os.listdir(out)) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]


def test_taskset_roundtrip(tmp_path):
    bundle = tmp_path / "x.bundle"
    bundle.write_bytes(b"not really a bundle")
    ts = write_taskset(tmp_path / "ts", [{"instance_id": "a", "repo": "o/r"}], {"o/r": bundle}, source="test")
    assert ts.row("a")["repo"] == "o/r"
    assert ts.bundle("o/r").read_bytes() == b"not really a bundle"
    assert bundle_name("swesmith/parse.abc") == "swesmith__parse.abc.bundle"
    manifest = json.loads((tmp_path / "ts" / "manifest.json").read_text())
    assert manifest["tasks"] == 1 and manifest["repos"] == ["o/r"]
    with pytest.raises(KeyError, match="no task with instance_id 'b'"):
        ts.row("b")
    with pytest.raises(FileNotFoundError, match="not a task-set directory"):
        TaskSet.open(tmp_path)
    atomic_write_json(tmp_path / "m.json", {"b": 1})
    assert json.loads((tmp_path / "m.json").read_text()) == {"b": 1}
