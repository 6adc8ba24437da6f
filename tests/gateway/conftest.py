"""Registers the fixtures of tests/gateway (defined in tests.gateway.support)."""

from tests.gateway.support import *  # noqa: F403 - pytest discovers the fixtures imported here
