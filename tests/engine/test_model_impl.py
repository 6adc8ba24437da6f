"""The engine's own forward pass (`llama.py`) against transformers' model: the same tokens and logprobs on the
tiny model and on small random checkpoints of each family it serves (biases included); checkpoints it does not
serve fall back to transformers' model, or are refused by name with model_impl=native."""

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harnessrl.engine.base import EngineError, ModelImpl, SamplingParams
from tests.engine.support import GREEDY, run

PROMPTS = ["Name a fruit.", "Write a haiku about rust.", "What is 12 times 7?", "Say hi."]


def outputs(engine, temperature: float = 0.0) -> list[tuple[list[int], list[float]]]:
    async def all_at_once():
        return await asyncio.gather(
            *(
                engine.generate(
                    engine.tokenizer.apply_chat_template(
                        [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
                    ),
                    GREEDY if temperature == 0 else SamplingParams(temperature=temperature, seed=i),
                    12,
                )
                for i, q in enumerate(PROMPTS)
            )
        )

    return [(g.token_ids, g.logprobs) for g in run(all_at_once())]


def assert_same(native, reference) -> None:
    for (ids, logprobs), (ref_ids, ref_logprobs) in zip(native, reference, strict=True):
        assert ids == ref_ids
        assert torch.allclose(torch.tensor(logprobs), torch.tensor(ref_logprobs), atol=1e-4)


def test_the_tiny_model_is_served_natively_with_transformers_outputs(engine):
    from harnessrl.engine.local import LocalEngine

    assert engine.model_impl == ModelImpl.NATIVE and engine.snapshot().figures["model_impl"] == "native"
    with LocalEngine(max_batch=8, model_impl=ModelImpl.TRANSFORMERS) as reference:
        assert reference.model_impl == ModelImpl.TRANSFORMERS
        for temperature in (0.0, 1.0):
            assert_same(outputs(engine, temperature), outputs(reference, temperature))


def random_checkpoint(tmp_path, family: str, **overrides) -> str:
    """A small random checkpoint of `family` with the tiny model's tokenizer (its vocabulary)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from harnessrl.tinymodel import tiny_model_dir

    tiny = tiny_model_dir()
    vocab = json.loads((tiny / "config.json").read_text())["vocab_size"]
    config = AutoConfig.for_model(
        family,
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **overrides,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(param, std=0.5)  # non-zero biases, so that a dropped bias shows
    out = tmp_path / family
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, out / name)
    return str(out)


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("qwen2", {}),  # q/k/v biases, none on o_proj
        ("mistral", {"sliding_window": None}),
    ],
    ids=["llama-biases", "qwen2", "mistral"],
)
def test_each_family_matches_transformers(tmp_path, family, overrides):
    from harnessrl.engine.local import LocalEngine

    checkpoint = random_checkpoint(tmp_path, family, **overrides)
    with (
        LocalEngine(checkpoint, max_batch=8) as native,
        LocalEngine(checkpoint, max_batch=8, model_impl=ModelImpl.TRANSFORMERS) as reference,
    ):
        assert native.model_impl == ModelImpl.NATIVE
        assert_same(outputs(native), outputs(reference))


def test_checkpoints_it_does_not_serve_fall_back_or_are_refused_by_name(tmp_path):
    from harnessrl.engine.local import LocalEngine

    checkpoint = random_checkpoint(tmp_path, "llama", rope_scaling={"rope_type": "linear", "factor": 2.0})
    with LocalEngine(checkpoint, max_batch=2) as auto:
        assert auto.model_impl == ModelImpl.TRANSFORMERS
        assert run(auto.generate([1, 2, 3], GREEDY, 3)).token_ids
    with pytest.raises(
        EngineError, match="rotary embedding of type 'linear'.*model_impl=auto or transformers"
    ):
        LocalEngine(checkpoint, model_impl=ModelImpl.NATIVE)
    harnessrl = Path(sys.executable).parent / "harnessrl"  # the command users type
    refused = subprocess.run(
        [str(harnessrl), "engine", "serve", "--model", checkpoint, "--model-impl", "native", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        "model_impl=native does not serve this checkpoint (rotary embedding of type 'linear'"
        in refused.stderr
    )


def test_a_checkpoint_that_does_not_fit_its_config_is_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    from harnessrl.engine.local import LocalEngine

    checkpoint = random_checkpoint(tmp_path, "llama")
    weights = f"{checkpoint}/model.safetensors"
    state = load_file(weights)
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, weights)
    with pytest.raises(
        EngineError, match=r"a llama model of its config.json.*1 missing.*layers.1.mlp.up_proj"
    ):
        LocalEngine(checkpoint, max_batch=1)


def test_serving_the_tiny_model_imports_no_transformers():
    """The engine's start-up cost: torch, safetensors and tokenizers only."""
    code = (
        "import sys\n"
        "from harnessrl.engine.local import LocalEngine\n"
        "LocalEngine(max_batch=1).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers' or m == 'torch._dynamo'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
