"""`make gpu-check` (benchmarks/gpu_check.py) on a machine without a GPU: the one-line skip, the vLLM command it
builds, and its assertion logic run on CPU with the project's trainer and LocalEngine on the tiny model."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import save_file

from benchmarks.gpu_check import (
    PROMPT,
    TARGET,
    check_policy,
    mean_abs_diff,
    reinforce_step,
    teacher_forced,
    vllm_command,
    vllm_env,
)
from harnessrl.engine.base import SamplingParams
from harnessrl.engine.weight_sync import EXTENSION_CLS
from tests.engine.support import run
from tests.support.fake_vllm import miniature_model

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_skips_in_one_line_without_a_gpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        env={"PATH": str(tmp_path)},  # no nvidia-smi
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "gpu-check: skipped: no CUDA GPU on this machine (nvidia-smi not found)\n"


def test_vllm_command_loads_the_extension_with_dev_endpoints():
    command = vllm_command("/venv/bin/vllm", "/models/tiny", 8123)
    assert command[:3] == ["/venv/bin/vllm", "serve", "/models/tiny"]
    options = dict(zip(command[3::2], command[4::2], strict=False))
    assert options["--worker-extension-cls"] == EXTENSION_CLS
    assert options["--logprobs-mode"] == "processed_logprobs" and options["--port"] == "8123"
    assert vllm_env({"HOME": "/h"}, gpu=1) == {
        "HOME": "/h",
        "VLLM_SERVER_DEV_MODE": "1",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    module, _, name = EXTENSION_CLS.rpartition(".")  # how vLLM resolves --worker-extension-cls
    assert getattr(importlib.import_module(module), name).__name__ == "WeightSyncExtension"


def test_policy_check_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="equally long"):
        check_policy([0.1], [0.1, 0.2], [0.1], 0.1)


def test_check_passes_after_a_trainer_step_synced_into_local_engine(tmp_path):
    """The gpu-check's steps on CPU: one step of the project's trainer, its weights into LocalEngine; the
    check accepts the synced engine and rejects the same engine before the sync. On a 2-layer Llama with the
    tiny model's tokenizer: an optimizer step of the tiny model takes a minute on a busy 2-core machine."""
    from harnessrl.engine.local import LocalEngine
    from harnessrl.tinymodel import load_model
    from harnessrl.train.trainer import OptimConfig, Trainer, TrainerConfig

    model_dir = miniature_model(tmp_path / "model")
    engine = LocalEngine(model_dir, max_batch=2, prefix_cache_mb=0, threads=0)
    try:
        tok = engine.tokenizer
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": PROMPT}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        target = tok.encode(TARGET, add_special_tokens=False)
        old = load_model(model_dir).eval()
        model = load_model(model_dir)
        trainer = Trainer(model, TrainerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1e9)))
        behavior = teacher_forced(old, prompt, target)
        reinforce_step(trainer, prompt, target, behavior)
        model.eval()
        assert mean_abs_diff(teacher_forced(model, prompt, target), behavior) > 0.05  # the step moved it

        sampling = SamplingParams(temperature=1.0, seed=0)
        stale = run(engine.generate(prompt, sampling, 8))
        assert mean_abs_diff(stale.logprobs, teacher_forced(old, prompt, stale.token_ids)) < 1e-3
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        (tmp_path / "step-1").mkdir()
        save_file(state, str(tmp_path / "step-1" / "model.safetensors"))
        run(engine.load_weights(str(tmp_path / "step-1"), 1))
        fresh = run(engine.generate(prompt, sampling, 8))
    finally:
        engine.close()

    synced = check_policy(
        fresh.logprobs,
        teacher_forced(model, prompt, fresh.token_ids),
        teacher_forced(old, prompt, fresh.token_ids),
        0.1,
    )
    assert synced.ok, synced.why()
    assert fresh.token_policy_versions == [1] * len(fresh.token_ids)
    unsynced = check_policy(
        stale.logprobs,
        teacher_forced(model, prompt, stale.token_ids),
        teacher_forced(old, prompt, stale.token_ids),
        0.1,
    )
    assert not unsynced.ok and unsynced.why().startswith("engine still samples the old policy")
    assert synced.to_new < 1e-3 and unsynced.to_old < 1e-3 < unsynced.to_new
