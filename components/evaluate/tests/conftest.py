"""The engine tests' fixtures `engine` (the tiny model's LocalEngine) and `url` (it behind a loopback server)."""

from tests.engine.support import engine, url  # noqa: F401 - pytest discovers the fixtures imported here
