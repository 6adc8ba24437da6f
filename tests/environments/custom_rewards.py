"""Reward functions named by import path in the environment tests (`tests.environments.custom_rewards:...`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harnessrl.environments.base import Finished, Reward


def answer_length(row: Mapping[str, Any], finished: Finished) -> float:
    """1 for a reply of at least 3 words, else 0."""
    return float(len(finished.answer.split()) >= 3)


def with_parts(row: Mapping[str, Any], finished: Finished) -> Reward:
    return Reward(0.5, {"half": 0.5}, detail="always half")


def raises(row: Mapping[str, Any], finished: Finished) -> float:
    raise RuntimeError("the grader's database is down")


def not_a_number(row: Mapping[str, Any], finished: Finished) -> object:
    return "great"


def nan(row: Mapping[str, Any], finished: Finished) -> float:
    return float("nan")
