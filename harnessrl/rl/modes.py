"""The RL loop's modes and statuses, in a module of their own so that the CLI can offer them as choices
without importing the trainer (and torch) at start-up."""

from enum import StrEnum


class RLMode(StrEnum):
    SYNC = "sync"  # generate a batch of groups → verify → train → sync weights
    COLOCATED = "colocated"  # one pool: pause + abort → train → sync → resume (partial rollouts)
    SEPARATE = "separate"  # generation never stops; bounded staleness; role switching


class WorkloadKind(StrEnum):
    SWE = "swe"  # a task set: harness episodes in sandboxes, verified by the task's tests
    PROMPT = "prompt"  # single-turn prompts with a verifiable answer word (smoke tests, benchmarks)


class GroupFate(StrEnum):
    """What a step did with a finished group (`rollouts/step-N.jsonl`)."""

    TRAINED = "trained"
    # no signal (train.data.has_signal): its rollouts in the step had one reward, or none of them trains
    ZERO_VARIANCE = "zero_variance"
    STALE = "stale"  # sampled by a policy older than max_staleness allows


class StepOutcome(StrEnum):
    TRAINED = "trained"
    NO_SIGNAL = "no_signal"  # the group budget ran out before any group had signal


class TrainerNodes(StrEnum):
    """Who starts the other trainer nodes (`nnodes` > 1)."""

    MANUAL = "manual"  # the user (or the cluster's objects) runs the command on every node
    RAY = "ray"  # node 0 places them as Ray tasks on other Ray nodes (harnessrl.rl.nodes)


class RolloutWorkers(StrEnum):
    """Where the RL loop's rollouts run (harnessrl.rl.runners)."""

    THREADS = "threads"  # threads of the stage's process
    RAY = "ray"  # Ray tasks across the cluster of RAY_ADDRESS (or a local one)
