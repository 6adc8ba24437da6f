"""Registers the shared fixtures for tests/ and components/*/tests/ (pytest reads only this root conftest
for both trees)."""

pytest_plugins = [
    "tests.support.fixtures",
    "tests.support.memory_report",
    "tests.support.process_exit",
    "tests.support.scheduling",
]

# tests/fixtures/minirepo is a repository *under test* (its tests import `minicalc` from its own root).
collect_ignore_glob = ["tests/fixtures/*"]
