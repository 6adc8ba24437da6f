import math

import pytest

from harnessrl.rl.role_switch import RoleSwitch, expected_wait_s


def test_prior_is_used_before_any_observation():
    switch = RoleSwitch(min_gain=1.0, prior_switch_s=60.0)
    assert switch.switch_cost_s == 60.0
    assert not switch.should_lend(59.0)
    assert not switch.should_lend(60.0)  # equal is not a gain
    assert switch.should_lend(60.5)


def test_lends_when_wait_beats_measured_cost_times_min_gain():
    switch = RoleSwitch(min_gain=2.0, prior_switch_s=1000.0)
    switch.observe_switch(10.0)  # first measurement replaces the prior
    assert switch.switch_cost_s == 10.0
    assert not switch.should_lend(15.0)  # beats the cost, but not by 2x
    assert not switch.should_lend(20.0)
    assert switch.should_lend(20.1)


def test_adapts_as_costs_are_observed():
    switch = RoleSwitch(min_gain=1.0, prior_switch_s=5.0, smoothing=0.5)
    assert switch.should_lend(8.0)  # prior says 5 s
    switch.observe_switch(4.0)
    assert switch.switch_cost_s == 4.0
    switch.observe_switch(20.0)  # switching got expensive: 4 + 0.5 * (20 - 4) = 12
    assert switch.switch_cost_s == 12.0
    assert not switch.should_lend(8.0)
    switch.observe_switch(2.0)  # 12 + 0.5 * (2 - 12) = 7
    assert switch.switch_cost_s == 7.0
    assert switch.should_lend(8.0)
    assert switch.observations == 3


def test_zero_cost_lends_for_any_positive_wait():
    switch = RoleSwitch(prior_switch_s=0.0)
    assert switch.should_lend(0.001)
    assert not switch.should_lend(0.0)


@pytest.mark.parametrize(
    "kwargs", [{"min_gain": 0.0}, {"prior_switch_s": -1.0}, {"smoothing": 0.0}, {"smoothing": 1.5}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        RoleSwitch(**kwargs)


@pytest.mark.parametrize("seconds", [-1.0, math.inf, math.nan])
def test_bad_observation_is_refused(seconds):
    with pytest.raises(ValueError, match="switch cost"):
        RoleSwitch().observe_switch(seconds)


def test_expected_wait():
    assert expected_wait_s(0, 0.0) == 0.0
    assert expected_wait_s(6, 2.0) == 3.0
    assert expected_wait_s(1, 0.0) == math.inf
    assert RoleSwitch(prior_switch_s=30.0).should_lend(expected_wait_s(3, 0.0))
