import random

import libcst as cst
import pytest

from dataprep.mutations import (
    MODIFIERS,
    Candidate,
    count_sites,
    enumerate_candidates,
    mutate_source,
)
from dataprep.problem import humanize_test
from dataprep.pytest_runner import parse_pytest_report, run_pytest
from dataprep.source import is_test_path
from dataprep.synthesize import order_candidates

SOURCE = """\
LIMIT = 10


def score(values, bonus=2):
    total = 0
    for v in values:
        if v > LIMIT:
            continue
        total += v * 2 - 1
    if total == 0 and bonus:
        return bonus
    else:
        total = total % 7
    return total
"""

EXPECTED_CHANGE = {
    "func_pm_op_change": "total -= v * 2 - 1",
    "func_pm_op_flip": "if v <= LIMIT:",
    "func_pm_op_swap": "total += 1 - v * 2",
    "func_pm_remove_loop": None,
    "func_pm_ctrl_invert_if": None,
}


@pytest.mark.parametrize("modifier", [m.name for m in MODIFIERS])
def test_every_modifier_changes_valid_code_inside_functions_only(modifier):
    cands = [c for c in enumerate_candidates({"m.py": SOURCE}) if c.modifier == modifier]
    assert cands, f"{modifier} found no site"
    outputs = set()
    for c in cands:
        new = mutate_source(SOURCE, c, seed=0)
        if new is None:
            continue
        compile(new, "m.py", "exec")
        assert new != SOURCE
        assert new.startswith("LIMIT = 10\n")  # module-level constant is not a site
        assert "def score(values, bonus=2):" in new  # parameter defaults are not sites
        outputs.add(new)
    assert outputs
    if EXPECTED_CHANGE.get(modifier):
        assert any(EXPECTED_CHANGE[modifier] in o for o in outputs), outputs


def test_remove_loop_and_invert_if_do_what_they_say():
    removed = mutate_source(SOURCE, Candidate("m.py", "func_pm_remove_loop", 0), 0)
    assert removed is not None and "for v in values" not in removed
    inv = mutate_source(SOURCE, Candidate("m.py", "func_pm_ctrl_invert_if", 0), 0)
    assert inv is not None
    assert "if total == 0 and bonus:\n        total = total % 7\n    else:\n        return bonus" in inv


def test_sites_are_stable_and_mutation_is_seeded():
    module = cst.parse_module(SOURCE)
    counts = {m.name: count_sites(module, m) for m in MODIFIERS}
    assert counts["func_pm_remove_loop"] == 1 and counts["func_pm_ctrl_invert_if"] == 1
    assert counts["func_pm_remove_cond"] == 1  # `if v > LIMIT: continue` (the other if has an else)
    c = Candidate("m.py", "func_pm_op_change_const", 0)
    assert mutate_source(SOURCE, c, 5) == mutate_source(SOURCE, c, 5)


def test_unparsable_files_are_skipped():
    assert enumerate_candidates({"bad.py": "def f(:\n"}) == []


def test_candidate_order_is_seeded_and_interleaves_families():
    cands = enumerate_candidates({"m.py": SOURCE})
    a, b = order_candidates(cands, 1), order_candidates(cands, 1)
    assert a == b and sorted(a, key=repr) == sorted(cands, key=repr)
    first = [c.modifier for c in a[: len({c.modifier for c in cands})]]
    assert len(set(first)) == len(first)
    assert order_candidates(cands, 2) != a


def test_test_path_detection():
    assert is_test_path("tests/test_x.py") and is_test_path("pkg/x_test.py") and is_test_path("conftest.py")
    assert is_test_path("test_parse.py") and not is_test_path("parse/__init__.py")


def test_humanize_test_ids():
    assert humanize_test("tests/test_a.py::TestX::test_parse_pairs[a-1]") == "parse pairs (a-1)"


def test_runner_reads_every_outcome_from_a_real_pytest_run(tmp_path):
    (tmp_path / "test_mix.py").write_text("""
import pytest

def test_ok():
    assert 1 + 1 == 2

def test_bad():
    assert [1, 2] == [1, 3], "lists differ"

@pytest.fixture
def broken():
    raise RuntimeError("fixture exploded")

def test_error(broken):
    pass

@pytest.mark.skip(reason="not today")
def test_skipped():
    pass

@pytest.mark.xfail(strict=False)
def test_xfail():
    assert False

@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x == 1

class TestGroup:
    def test_method(self):
        print("PASSED fake line in captured output")
""")
    run = run_pytest(tmp_path, (), timeout_s=60, plugin_autoload=False)
    assert run.returncode == 1 and not run.timed_out
    assert run.outcomes == {
        "test_mix.py::test_ok": "PASSED",
        "test_mix.py::test_bad": "FAILED",
        "test_mix.py::test_error": "ERROR",
        "test_mix.py::test_xfail": "XFAIL",
        "test_mix.py::test_param[1]": "PASSED",
        "test_mix.py::test_param[2]": "FAILED",
        "test_mix.py::TestGroup::test_method": "PASSED",
    }
    assert "lists differ" in run.messages["test_mix.py::test_bad"]
    assert "fixture exploded" in run.messages["test_mix.py::test_error"]
    only = run_pytest(tmp_path, ["test_mix.py::test_ok"], timeout_s=60)  # default: plugins autoloaded
    assert only.outcomes == {"test_mix.py::test_ok": "PASSED"} and only.returncode == 0


def test_collection_error_marks_file():
    text = (
        "============ short test summary info ============\n"
        "ERROR tests/test_a.py - ImportError: cannot import name 'x'\n"
        "!!!! Interrupted: 1 error during collection !!!!\n"
        "============ 1 error in 0.10s ============\n"
    )
    outcomes, messages = parse_pytest_report(text)
    assert outcomes == {"tests/test_a.py": "ERROR"}
    assert messages["tests/test_a.py"].startswith("ImportError")


def test_random_is_not_global():
    state = random.getstate()
    mutate_source(SOURCE, Candidate("m.py", "func_pm_op_change_const", 0), 1)
    assert random.getstate() == state
