"""Fixtures for tests/engine live in engine_support.py, importable by a unique module name (several test folders
have a conftest.py, and `from conftest import ...` would pick whichever was imported first)."""

from engine_support import *  # noqa: F403 - pytest discovers the fixtures imported here
