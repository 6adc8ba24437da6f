import pytest

from harnessrl.rl.admission import (
    StalePolicy,
    admission_capacity,
    can_admit,
    is_stale,
    keep_group,
    staleness,
)


@pytest.mark.parametrize(
    ("accepted", "running", "version", "max_staleness", "batch", "expected"),
    [
        # bound = (max_staleness + version + 1) * batch
        (0, 0, 0, 0, 4, True),  # 0 < 4
        (0, 3, 0, 0, 4, True),  # 3 < 4: the last slot of the first batch
        (0, 4, 0, 0, 4, False),  # 4 == 4: sync admits exactly one batch per version
        (2, 2, 0, 0, 4, False),  # accepted and running count alike
        (4, 0, 1, 0, 4, True),  # after one step the next batch opens: 4 < 8
        (4, 4, 1, 0, 4, False),
        (0, 7, 0, 1, 4, True),  # one version of staleness: two batches ahead, 7 < 8
        (0, 8, 0, 1, 4, False),  # 8 == 8
        (10, 1, 2, 1, 3, True),  # 11 < 12
        (10, 2, 2, 1, 3, False),  # 12 == 12
        (40, 19, 3, 2, 10, True),  # 59 < 60
        (40, 20, 3, 2, 10, False),  # 60 == 60
    ],
)
def test_can_admit_hand_computed(accepted, running, version, max_staleness, batch, expected):
    assert can_admit(accepted, running, version, max_staleness, batch) is expected
    capacity = admission_capacity(accepted, running, version, max_staleness, batch)
    assert (capacity > 0) is expected
    assert capacity == max(0, (max_staleness + version + 1) * batch - accepted - running)


def test_admitting_until_refused_fills_exactly_the_staleness_window():
    # five steps taken, their 40 groups accepted: the window is the batches of versions 5, 6 and 7
    running = 0
    while can_admit(40, running, version=5, max_staleness=2, batch_groups=8):
        running += 1
    assert running == 3 * 8


@pytest.mark.parametrize(
    ("accepted", "running", "version", "steps", "expected_capacity"),
    [
        (0, 0, 0, 6, 8),  # the first step: two batches open, as without a run length
        (16, 0, 4, 6, 8),  # the fifth step: its batch and the last
        (20, 0, 5, 6, 4),  # the last step: its own batch only (the staleness window would open 8)
        (20, 4, 5, 6, 0),
        (24, 0, 6, 6, 0),  # the run is done
        (0, 0, 0, 1, 4),  # a one-step run: one batch
    ],
)
def test_window_ends_at_the_runs_last_batch(accepted, running, version, steps, expected_capacity):
    capacity = admission_capacity(accepted, running, version, 1, 4, steps)
    assert capacity == expected_capacity
    assert can_admit(accepted, running, version, 1, 4, steps) is (expected_capacity > 0)
    assert capacity <= admission_capacity(accepted, running, version, 1, 4)  # the run's end only narrows it


@pytest.mark.parametrize(
    "args",
    [(-1, 0, 0, 0, 1), (0, -1, 0, 0, 1), (0, 0, -1, 0, 1), (0, 0, 0, -1, 1), (0, 0, 0, 0, 0)],
)
def test_can_admit_rejects_bad_counts(args):
    with pytest.raises(ValueError, match="must be >="):
        can_admit(*args)


@pytest.mark.parametrize(
    ("oldest", "trainer", "max_staleness", "expected"),
    [
        (3, 3, 0, False),  # on-policy
        (2, 3, 0, True),  # one behind with no staleness allowed
        (2, 3, 1, False),  # exactly at the bound
        (1, 3, 1, True),  # one past it
        (0, 10, 10, False),
        (0, 11, 10, True),
    ],
)
def test_is_stale_boundaries(oldest, trainer, max_staleness, expected):
    assert is_stale(oldest, trainer, max_staleness) is expected
    assert staleness(oldest, trainer) == trainer - oldest


def test_token_newer_than_trainer_is_an_error():
    with pytest.raises(ValueError, match="cannot be newer than the trainer"):
        is_stale(4, 3, 1)


def test_keep_group_drop_and_keep():
    assert keep_group(StalePolicy.DROP, 2, 3, 1) is True  # fresh: always kept
    assert keep_group(StalePolicy.DROP, 1, 3, 1) is False
    assert keep_group(StalePolicy.KEEP, 1, 3, 1) is True
    assert [str(p) for p in StalePolicy] == ["drop", "keep"]
