"""The train tests' fixtures (tiny policy, tokenizer), defined once in tests.train.support."""

from tests.train.support import *  # noqa: F403 - pytest discovers the fixtures imported here
