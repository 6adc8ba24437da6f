"""Registers the fixtures of tests/engine (defined in tests.engine.support)."""

from tests.engine.support import *  # noqa: F403 - pytest discovers the fixtures imported here
