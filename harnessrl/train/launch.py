"""Runs the train stage on N local processes with torchrun (one per GPU, or N CPU processes with gloo).

The KFP component calls `run_multiprocess` when its pod sees more than one GPU; a user on a multi-GPU node can
type the same command directly (`torchrun --nproc-per-node N -m harnessrl.cli stage train ...`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harnessrl.train.round import TrainConfig


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
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "harnessrl.cli",
        "stage",
        "train",
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
        cmd += ["--rewards", str(rewards)]
    if model_out is not None:
        cmd += ["--model-out", str(model_out)]
    if upload_to:
        cmd += ["--upload-to", upload_to]
    if resume:
        cmd.append("--resume")
    return cmd


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
    """Launches `nproc` ranks, waits, and returns rank 0's summary (OUT/metrics.json)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config_file = out / "stage_config.json"
    config_file.write_text(json.dumps(cfg.to_dict(), default=list), encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.setdefault("OMP_NUM_THREADS", "1")
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
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"torchrun with {nproc} processes failed (exit {proc.returncode}): "
            f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"
        )
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))
