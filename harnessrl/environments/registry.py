"""Environments and reward functions by name.

A task row's `environment` is a built-in name (`swe`, `instruction`, `kernel`, `search`, `procedural`) or an import path `module:attribute`
naming an `Environment` instance, or a class or function that makes one without arguments. A spec's
`reward` is one of the environment's `reward_names`, or an import path `module:function` to a function
`(row, finished) -> float | Reward` (`finished`: environments.base.Finished) — run outside the agent's
sandbox, on the agent's final answer and diff.

Errors name what failed and how to fix it; a custom reward that cannot be imported, raises or returns a
non-number becomes an infra-error `Reward` for that rollout (the task and the function named), never a 0.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from harnessrl.environments.base import Environment, Finished, Reward, WorkspaceHooks

logger = logging.getLogger(__name__)

DEFAULT_ENVIRONMENT = "swe"

RewardFunction = Callable[[Mapping[str, Any], Finished], object]  # returns a number or a Reward


class UnknownEnvironment(ValueError):
    pass


def _builtins() -> dict[str, Callable[[], Environment]]:
    from harnessrl.environments.instruction.env import InstructionEnvironment
    from harnessrl.environments.kernel.env import KernelEnvironment
    from harnessrl.environments.procedural.env import ProceduralEnvironment
    from harnessrl.environments.search.env import SearchEnvironment
    from harnessrl.environments.swe import SweEnvironment

    return {
        "swe": SweEnvironment,
        "instruction": InstructionEnvironment,
        "kernel": KernelEnvironment,
        "search": SearchEnvironment,
        "procedural": ProceduralEnvironment,
    }


def builtin_names() -> tuple[str, ...]:
    return tuple(_builtins())


def builtin_reward_names() -> tuple[str, ...]:
    return tuple(name for env in builtin_names() for name in get_environment(env).reward_names)


def resolve_reward(env: Environment, reward: str, task: Mapping[str, Any]) -> str:
    """The reward a spec's `reward` means for this task: the environment's default for "", else the name
    itself — ValueError naming the task when the environment does not offer it."""
    if not reward:
        return env.reward_names[0]
    if ":" in reward or reward in env.reward_names:
        return reward
    raise ValueError(
        f"task {task.get('instance_id')!r} ({env.name}): reward {reward!r} is not one of "
        f"{', '.join(env.reward_names)} (or 'module:function')"
    )


def environment_name(row: Mapping[str, Any]) -> str:
    name = row.get("environment") or DEFAULT_ENVIRONMENT
    if not isinstance(name, str):
        raise UnknownEnvironment(f"environment must be a string, got {name!r}")
    return name


@functools.cache
def get_environment(name: str) -> Environment:
    """The environment `name` names (built-in or `module:attribute`); UnknownEnvironment in one line."""
    made = _builtins().get(name)
    if made is not None:
        return made()
    if ":" not in name:
        raise UnknownEnvironment(
            f"unknown environment {name!r}; built-in: {', '.join(builtin_names())}, or an import path "
            "'module:attribute' to your own (docs/environments.md)"
        )
    target = _import(name, "environment")
    env = target if isinstance(target, Environment) or not callable(target) else target()
    if not isinstance(env, Environment):
        raise UnknownEnvironment(
            f"environment {name!r} is a {type(env).__name__}, not an Environment (name, reward_names, "
            "check_task, episode, reward: harnessrl.environments.base)"
        )
    return env


def environment_of(row: Mapping[str, Any]) -> Environment:
    return get_environment(environment_name(row))


def workspace_hooks(env: Environment) -> WorkspaceHooks:
    """How `env`'s workspace is made and read: its own hooks, else the task set's repository (swe's)."""
    if isinstance(env, WorkspaceHooks):
        return env
    from harnessrl.environments.swe import TaskRepoWorkspace

    return TaskRepoWorkspace()


def reward_function(path: str) -> RewardFunction:
    """The function `module:function` names; ImportError naming it when it cannot be imported."""
    target = _import(path, "reward function")
    if not callable(target):
        raise ImportError(f"reward function {path!r}: {type(target).__name__} is not callable")
    return target


def call_reward(path: str, row: Mapping[str, Any], finished: Finished) -> Reward:
    """A custom reward function's Reward; an infra-error Reward naming the task and the function when it
    cannot be imported, raises, or returns anything but a finite number or a Reward."""
    task = row.get("instance_id", "?")
    try:
        fn = reward_function(path)
        value = fn(row, finished)
    except Exception as e:
        logger.warning("task %s: reward function %s failed: %s", task, path, e)
        return Reward.failed(f"task {task}: reward function {path} failed: {type(e).__name__}: {e}")
    if isinstance(value, Reward):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return Reward(float(value))
    detail = f"task {task}: reward function {path} returned {value!r:.80}, not a finite number or a Reward"
    logger.warning("%s", detail)
    return Reward.failed(detail)


def _import(path: str, what: str) -> Any:
    module, _, attribute = path.partition(":")
    if not module or not attribute:
        raise ImportError(f"{what} {path!r}: expected 'module:attribute'")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{what} {path!r} cannot be imported: {type(e).__name__}: {e}") from None
