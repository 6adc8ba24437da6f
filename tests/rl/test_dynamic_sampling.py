import pytest

from harnessrl.rl.dynamic_sampling import worth_sampling


def test_unknown_kept_solved_and_hopeless_skipped_order_preserved():
    rates = {"solved": 1.0, "hopeless": 0.0, "mixed": 0.5, "none": None}
    ids = ["new", "solved", "mixed", "hopeless", "none"]
    assert worth_sampling(rates, ids, low=0.0, high=1.0) == ["new", "mixed", "none"]


@pytest.mark.parametrize(
    ("rate", "kept"),
    [(0.2, False), (0.2000001, True), (0.8, False), (0.7999999, True), (0.5, True), (0.0, False)],
)
def test_bounds_are_exclusive(rate, kept):
    assert worth_sampling({"t": rate}, ["t"], low=0.2, high=0.8) == (["t"] if kept else [])


@pytest.mark.parametrize(("low", "high"), [(0.5, 0.5), (0.6, 0.4), (-0.1, 1.0), (0.0, 1.1)])
def test_bad_bounds_refused(low, high):
    with pytest.raises(ValueError, match="low"):
        worth_sampling({}, ["t"], low, high)


def test_bad_rate_names_the_task():
    with pytest.raises(ValueError, match="'t7'"):
        worth_sampling({"t7": 1.5}, ["t7"], 0.0, 1.0)
