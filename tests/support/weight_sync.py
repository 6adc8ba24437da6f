"""Helpers for the weight-sync tests: a real `harnessrl engine serve` process, and the logprobs a model gives
a continuation (what an engine holding that model's weights must report)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch


def serve_process(model_dir: Path, port: int = 0) -> tuple[subprocess.Popen, str]:
    """`harnessrl engine serve --model model_dir` on `port` (0: a free one): (process, URL). The caller kills
    it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "engine", "serve", "--model", str(model_dir), "--port", str(port),
         "--threads", "1", "--max-batch", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"engine did not start: {line!r} {proc.communicate()[1][-2000:]}")
    return proc, line.split()[-1]


@torch.no_grad()
def teacher_forced(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """Logprob of each of `tokens` after `prompt` under `model` (the raw distribution: greedy / temperature 1)."""
    logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def close(a: list[float], b: list[float], tol: float = 2e-3) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < tol
