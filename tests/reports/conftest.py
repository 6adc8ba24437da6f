"""Fixtures of tests/reports: the tiny train policy comes from tests/train (defined once there)."""

from tests.train.support import tiny_policy_dir  # noqa: F401 - pytest discovers the fixture imported here
