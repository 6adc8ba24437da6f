"""Role switching for separate-async RL: lend the trainer's devices to rollouts while it would idle.

While the trainer waits for a step's data its devices can serve rollouts; when the data is ready they
hand back. A switch costs time both ways (load the inference engine's weights and KV memory, then give the
memory back to the trainer), so lending pays only when the expected wait beats that cost. `RoleSwitch`
measures the cost of each switch (out + back, an exponentially weighted moving average) and lends only
when `expected_wait_s > min_gain * switch_cost_s`. Before any switch was measured it uses a conservative
prior (`prior_switch_s`), so a cold loop does not lend on a guess that switching is free.
"""

from __future__ import annotations

import math


class RoleSwitch:
    """Decide whether to lend the trainer's devices to rollouts for an expected idle period."""

    def __init__(self, min_gain: float = 1.0, prior_switch_s: float = 60.0, smoothing: float = 0.5):
        """`min_gain`: the expected wait must exceed the switch cost times this; `prior_switch_s`: the cost
        assumed before the first measurement; `smoothing`: weight of the newest measurement in the
        moving average (1.0 = only the last switch counts)."""
        if not min_gain > 0:
            raise ValueError(f"min_gain must be > 0, got {min_gain}")
        if not prior_switch_s >= 0:
            raise ValueError(f"prior_switch_s must be >= 0 seconds, got {prior_switch_s}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.min_gain = min_gain
        self.prior_switch_s = prior_switch_s
        self.smoothing = smoothing
        self._cost_s: float | None = None
        self.observations = 0

    @property
    def switch_cost_s(self) -> float:
        """The cost of one switch out and back: the measured average, or the prior before any."""
        return self.prior_switch_s if self._cost_s is None else self._cost_s

    def observe_switch(self, seconds: float) -> None:
        """Record the measured cost of one switch out + back."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"a switch cost must be a finite number of seconds >= 0, got {seconds}")
        if self._cost_s is None:
            self._cost_s = seconds
        else:
            self._cost_s += self.smoothing * (seconds - self._cost_s)
        self.observations += 1

    def should_lend(self, expected_wait_s: float) -> bool:
        """Lend the trainer's devices iff the expected idle time beats the switch cost by `min_gain`."""
        if math.isnan(expected_wait_s):
            raise ValueError("expected_wait_s is NaN")
        return expected_wait_s > self.min_gain * self.switch_cost_s


def expected_wait_s(groups_missing: int, groups_per_s: float) -> float:
    """Seconds until `groups_missing` more groups finish at the recent completion rate (inf at rate 0)."""
    if groups_missing < 0:
        raise ValueError(f"groups_missing must be >= 0, got {groups_missing}")
    if groups_missing == 0:
        return 0.0
    if not groups_per_s >= 0:
        raise ValueError(f"groups_per_s must be >= 0, got {groups_per_s}")
    return math.inf if groups_per_s == 0 else groups_missing / groups_per_s
