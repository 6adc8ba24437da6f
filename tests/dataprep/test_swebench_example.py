"""dataprep/swebench_example.py on tests/fixtures/minirepo: SWE-bench rows whose base commit lacks the tests
that test_patch adds, an easy-tier statement naming file and function, reproducible to the byte."""

from __future__ import annotations

import json
import re
import subprocess

from dataprep.load import import_taskset
from dataprep.swebench_example import ProblemTier, build_example_set, enclosing_function
from harnessrl.io import read_jsonl
from harnessrl.taskset import TaskLayout
from tests.support.fixtures import MINIREPO


def test_example_set_from_a_real_package_is_swebench_shaped_and_reproducible(tmp_path):
    a = build_example_set(MINIREPO, tmp_path / "a", n_tasks=2, seed=0, tier=ProblemTier.EASY)
    b = build_example_set(MINIREPO, tmp_path / "b", n_tasks=2, seed=0, tier=ProblemTier.EASY)
    assert a.rows_path.read_bytes() == b.rows_path.read_bytes()
    bundle = "harnessrl-examples__minirepo.bundle"
    assert (a.mirrors / bundle).read_bytes() == (b.mirrors / bundle).read_bytes()

    rows = list(read_jsonl(a.rows_path))
    assert len(rows) == 2 and rows == a.rows
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--mirror", str(a.mirrors / bundle), str(mirror)], check=True)
    for r in rows:
        assert all(isinstance(v, str) for v in r.values())
        f2p = json.loads(r["FAIL_TO_PASS"])
        assert f2p and json.loads(r["PASS_TO_PASS"])
        for test in f2p:  # absent at base_commit, added by test_patch
            file, name = test.split("::")[0], re.sub(r"\[.*", "", test.split("::")[-1])
            base = subprocess.run(
                ["git", "--git-dir", str(mirror), "show", f"{r['base_commit']}:{file}"],
                capture_output=True,
                text=True,
            ).stdout
            assert f"def {name}(" not in base and f"+def {name}(" in r["test_patch"]
        path = re.search(r"^\+\+\+ b/(\S+)", r["patch"], flags=re.M)
        assert path and f"in `{path[1]}`" in r["problem_statement"]
        assert re.search(r"^Bug in `\w+` in `", r["problem_statement"])  # names the function
    ts = import_taskset(a.rows_path, a.mirrors, tmp_path / "tasks", layout=TaskLayout.SWEBENCH)
    assert ts.manifest["import"]["converted"] == 2


def test_enclosing_function_names_methods_with_their_class():
    src = "class A:\n    def f(self):\n        x = 1\n        return x\n\n\ndef g():\n    return 2\n"
    assert enclosing_function(src, 3) == "A.f"
    assert enclosing_function(src, 8) == "g"
    assert enclosing_function(src, 1) is None
