"""Runs a stage on N local processes with torchrun (one per GPU, or N CPU processes with gloo).

The train component calls `run_multiprocess` when its pod sees more than one GPU; a user on a multi-GPU node can
type the same command directly (`torchrun --nproc-per-node N -m harnessrl.cli stage train ...`). The RL loop
(`harnessrl stage rl --nproc N`, harnessrl.rl.ranks) starts its trainer ranks through `run_ranks` too.

torchrun stops every rank as soon as one exits non-zero and prints which rank failed first; `run_ranks`
reads that summary back, so a failure names the rank (`RanksFailed`) instead of leaving a bare exit code.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harnessrl.processes import die_with_parent
from harnessrl.train.distributed import Rendezvous
from harnessrl.train.round import TrainConfig

TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# one block of torchrun's failure summary (torch.distributed.elastic ChildFailedError)
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = "Root Cause (first observed failure):"


@dataclass(frozen=True)
class RankFailure:
    rank: int
    exitcode: int

    @property
    def reason(self) -> str:
        if self.exitcode < 0:
            try:
                return f"killed by {signal.Signals(-self.exitcode).name}"
            except ValueError:
                return f"killed by signal {-self.exitcode}"
        return f"exit code {self.exitcode}"


class RanksFailed(RuntimeError):
    """A rank failed; torchrun stopped the others. `failures`: first observed failure first."""

    def __init__(self, message: str, failures: list[RankFailure], returncode: int):
        super().__init__(message)
        self.failures, self.returncode = failures, returncode


def rank_failures(torchrun_output: str) -> list[RankFailure]:
    """The failed ranks listed in torchrun's summary, the first observed failure (its root cause) first."""

    def parse(text: str) -> list[RankFailure]:
        return [RankFailure(int(r), int(c)) for r, c in _FAILURE.findall(text)]

    head, marker, root = torchrun_output.rpartition(_ROOT_CAUSE)
    if not marker:
        return parse(torchrun_output)
    first = parse(root)[:1]
    return first + [f for f in parse(head.rpartition("Failures:")[2]) if f not in first]


def failure_message(nproc: int, failures: list[RankFailure], returncode: int, what: str = "rank") -> str:
    if not failures:
        return f"torchrun with {nproc} processes failed (exit {returncode}) without naming a rank"
    first, *others = failures
    others = [f for f in others if f.exitcode != -signal.SIGTERM]  # stopped by torchrun itself
    msg = f"{what} {first.rank} of {nproc} failed ({first.reason})"
    if others:
        msg += "; then " + ", ".join(f"{what} {f.rank} ({f.reason})" for f in others)
    return msg + "; torchrun stopped every rank"


def torchrun_prefix(nproc: int, nnodes: int = 1, rendezvous: Rendezvous | None = None) -> list[str]:
    """torchrun for this node's `nproc` ranks: alone (`--standalone`), or one of `nnodes` nodes."""
    nodes = (rendezvous or Rendezvous()).torchrun_args(nnodes)
    return [sys.executable, "-m", "torch.distributed.run", *nodes, "--nproc-per-node", str(nproc)]


def stage_command(
    nproc: int, stage: str, args: Sequence[str], nnodes: int = 1, rendezvous: Rendezvous | None = None
) -> list[str]:
    """`torchrun ... -m harnessrl.cli stage <stage> <args>`."""
    return [*torchrun_prefix(nproc, nnodes, rendezvous), "-m", "harnessrl.cli", "stage", stage, *args]


def rank_env() -> dict[str, str]:
    """This process's environment less an outer torchrun's variables; one torch thread per rank unless set."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class RanksStopped(RuntimeError):
    """`run_ranks` stopped torchrun because its `watch` said so (e.g. another node's ranks failed)."""


def run_ranks(
    cmd: list[str],
    nproc: int,
    *,
    timeout: float | None = None,
    stream: bool = False,
    what: str = "rank",
    watch: Callable[[], str | None] | None = None,
) -> None:
    """Runs a torchrun command; raises `RanksFailed` naming the failed rank(s). `stream`: the ranks' stdout
    and stderr pass through live (stderr is also kept to read the failure summary); else both are captured.
    `watch` (streaming): asked every second; a reason from it stops torchrun and raises `RanksStopped`."""
    if not stream:
        proc = subprocess.run(cmd, env=rank_env(), capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            failures = rank_failures(proc.stderr)
            raise RanksFailed(
                f"{failure_message(nproc, failures, proc.returncode, what)}: {' '.join(cmd)}\n"
                f"{proc.stderr[-4000:]}",
                failures,
                proc.returncode,
            )
        return
    tail: collections.deque[str] = collections.deque(maxlen=400)
    env = rank_env()
    # torchrun ends with this thread (then it stops its ranks, which end with it): a launcher killed from
    # outside, e.g. the Ray task of a remote trainer node cancelled, leaves no rank behind
    with subprocess.Popen(die_with_parent(cmd, env), env=env, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                sys.stderr.write(line)
                tail.append(line)

        reader = threading.Thread(target=pump, name="torchrun-stderr", daemon=True)
        reader.start()
        try:
            code = _wait(proc, timeout, watch)
        except BaseException:  # timeout, a watched failure, Ctrl-C: torchrun forwards SIGTERM to every rank
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            reader.join(10)
    if code != 0:
        failures = rank_failures("".join(tail))
        raise RanksFailed(failure_message(nproc, failures, code, what), failures, code)


def _wait(proc: subprocess.Popen, timeout: float | None, watch: Callable[[], str | None] | None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return proc.wait(1.0)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout or 0) from None
            if watch is not None and (why := watch()) is not None:
                raise RanksStopped(why) from None


def torchrun_command(
    nproc: int,
    samples: str | Path,
    rewards: str | Path | None,
    policy: str | Path,
    out: str | Path,
    config_file: str | Path,
    *,
    resume: bool = False,
    model_out: str | Path | None = None,
    upload_to: str | None = None,
    nnodes: int = 1,
    rendezvous: Rendezvous | None = None,
) -> list[str]:
    """The train stage under torchrun with `nproc` ranks on this node, one of `nnodes` (`rendezvous`: where
    node 0 is and which node this is; torchrun's static rendezvous, as the RL stage's)."""
    args = [
        "--samples",
        str(samples),
        "--policy",
        str(policy),
        "--out",
        str(out),
        "--config",
        str(config_file),
    ]
    if rewards is not None:
        args += ["--rewards", str(rewards)]
    if model_out is not None:
        args += ["--model-out", str(model_out)]
    if upload_to:
        args += ["--upload-to", upload_to]
    if resume:
        args.append("--resume")
    return stage_command(nproc, "train", args, nnodes, rendezvous)


def run_multiprocess(
    nproc: int,
    samples: str | Path,
    rewards: str | Path | None,
    policy: str | Path,
    out: str | Path,
    cfg: TrainConfig,
    *,
    resume: bool = False,
    model_out: str | Path | None = None,
    upload_to: str | None = None,
    timeout: float | None = None,
) -> dict:
    """Launches `nproc` ranks of the train stage, waits, and returns rank 0's summary (OUT/metrics.json)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / "stage_config.json"
    config_file.write_text(json.dumps(cfg.to_dict(), default=list), encoding="utf-8")
    cmd = torchrun_command(
        nproc,
        samples,
        rewards,
        policy,
        out,
        config_file,
        resume=resume,
        model_out=model_out,
        upload_to=upload_to,
    )
    run_ranks(cmd, nproc, timeout=timeout)
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))
