"""Registers the fixtures of tests/train (defined in tests.train.support)."""

from tests.train.support import *  # noqa: F403 - pytest discovers the fixtures imported here
