"""`run_rl`: the RL stage — engine(s), gateway, rollout workers, verifiers and the trainer in one process for N
optimizer steps, in one of three modes (drivers.py). `RLRun` (run.py) owns the setup and teardown; the loop
below is the whole algorithm: collect finished groups (rollouts generated through the gateway and verified)
→ train on them → publish the new weights into the engines → record the step → checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from harnessrl.rl.config import RLConfig, RLInputs
from harnessrl.rl.ranks import TrainerRanks, follow, init_ranks
from harnessrl.rl.records import RLSummary
from harnessrl.rl.run import RLRun


def run_rl(cfg: RLConfig, inputs: RLInputs, echo: Callable[[str], None] | None = None) -> RLSummary | None:
    """Runs the stage; returns the summary (also `out/metrics.json`). Under torchrun (`cfg.nproc` ranks,
    harnessrl.rl.ranks) rank 0 runs the loop and the other ranks only their part of the trainer (None)."""
    ctx = init_ranks(cfg)
    if not ctx.is_main:
        follow(cfg, ctx)
        return None
    ranks = TrainerRanks(ctx)
    try:
        with RLRun(cfg, inputs, ranks, echo) as run:
            return train(run)
    finally:
        ranks.stop()


def train(run: RLRun) -> RLSummary:
    """generate → verify → train → sync, once per optimizer step."""
    while run.step < run.cfg.steps:
        started = time.perf_counter()
        batch = run.collect()  # rollouts generated and verified, whole groups with signal
        update = run.train(batch) if batch.groups else None  # one GRPO / RLOO step on them
        synced = run.publish(update) if batch.groups else None  # the new weights into every engine
        run.record(started, batch, update, synced)  # steps.jsonl, TensorBoard, the step's line
        run.checkpoint_if_due()
    return run.finish()
