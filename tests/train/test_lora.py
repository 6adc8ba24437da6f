"""LoRA adapters (harnessrl/train/lora.py) on a small random Llama: what trains, the merged weights, PEFT's
layout read back by PEFT itself, and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harnessrl.train.batching import SeqItem
from harnessrl.train.lora import (
    Adapter,
    LoraSettings,
    adapter_of,
    add_adapters,
    is_adapter_tensor,
    load_adapter_weights,
    merged_weights,
)
from harnessrl.train.trainer import OptimConfig, Trainer, TrainerConfig
from tests.train.support import tiny_llama

SETTINGS = LoraSettings(rank=4, alpha=8)


def small_llama(seed: int = 0):
    return tiny_llama(seed, vocab=96).eval()


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def trained_adapter(seed: int = 0):
    """A small Llama with adapters whose B is no longer zero (as after some optimizer steps)."""
    model = small_llama()
    add_adapters(model, SETTINGS)
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter_tensor(name):
                p.copy_(torch.randn_like(p) * 0.3)
    return model


IDS = [5, 17, 3, 44, 9, 81, 2]


def test_adapters_train_alone_and_start_as_the_base_model():
    base = small_llama()
    model = small_llama()
    add_adapters(model, SETTINGS)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter_tensor(n) for n in trainable)
    # every linear projection of both layers: 7 targets x (A, B) x 2 layers
    assert len(trainable) == 7 * 2 * 2
    assert torch.equal(logits(model, IDS), logits(base, IDS))  # B starts at zero


def test_a_step_changes_only_the_adapters_and_keeps_optimizer_state_for_them_only():
    model = small_llama()
    add_adapters(model, SETTINGS)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Trainer(model, TrainerConfig(optim=OptimConfig(lr=1e-2)))
    ids = IDS * 3
    trainer.step([SeqItem(ids, [0] * 4 + [1] * (len(ids) - 4), [0.0] * len(ids), 1.0, 1.0, "r")])
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(is_adapter_tensor(n) for n in changed)
    state = trainer.optimizer.state
    adapter_numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert sum(s["exp_avg"].numel() for s in state.values()) == adapter_numel
    assert adapter_numel < 0.2 * sum(p.numel() for p in model.parameters())


def test_merged_weights_are_the_adapted_model_as_plain_weights():
    model = trained_adapter()
    merged = dict(merged_weights(model.state_dict().items(), SETTINGS))
    plain = small_llama(seed=7)  # other weights: the merged state must set every one
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    assert torch.allclose(logits(plain, IDS), logits(model, IDS), atol=1e-5)


def test_saved_adapter_is_peft_layout_that_peft_loads_and_we_load_back(tmp_path: Path):
    from peft import PeftModel

    model = trained_adapter()
    dest = adapter_of(model.state_dict().items(), SETTINGS).save(tmp_path / "adapter", "base-model")
    assert {p.name for p in dest.iterdir()} >= {"adapter_config.json", "adapter_model.safetensors"}
    with_peft = PeftModel.from_pretrained(small_llama(), str(dest))  # the library itself reads it
    assert torch.allclose(logits(with_peft, IDS), logits(model, IDS), atol=1e-5)
    ours = small_llama()
    add_adapters(ours, SETTINGS, dest)
    assert torch.equal(logits(ours, IDS), logits(model, IDS))
    read = Adapter.load(dest)  # what an engine reads
    written = adapter_of(model.state_dict().items(), SETTINGS)
    assert read.settings == SETTINGS and read.pairs.keys() == written.pairs.keys()
    assert all(torch.equal(read.pairs[w][i], written.pairs[w][i]) for w in read.pairs for i in (0, 1))
    with pytest.raises(ValueError, match="not a PEFT adapter directory"):
        Adapter.load(tmp_path)


def test_an_adapter_of_other_settings_or_targets_that_match_nothing_are_refused(tmp_path: Path):
    dest = adapter_of(trained_adapter().state_dict().items(), SETTINGS).save(tmp_path / "a", "base")
    other = small_llama()
    add_adapters(other, LoraSettings(rank=2, alpha=8))
    with pytest.raises(ValueError, match="rank 4 .* the run trains rank 2"):
        load_adapter_weights(other, dest, LoraSettings(rank=2, alpha=8))
    with pytest.raises(ValueError, match="match no linear layer"):
        add_adapters(small_llama(), LoraSettings(rank=2, target_modules=("qkv",)))


def test_settings_from_a_config_dict_and_their_checks():
    cfg = TrainerConfig.from_dict({"lora": {"rank": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}})
    assert cfg.lora == LoraSettings(rank=8, alpha=16, target_modules=("v_proj", "q_proj"))
    assert cfg.lora.scale == 2.0 and not TrainerConfig().lora.enabled
    assert TrainerConfig.from_dict(cfg.to_dict()).lora == cfg.lora
    with pytest.raises(ValueError, match="rank must be >= 0"):
        LoraSettings(rank=-1)
    with pytest.raises(ValueError, match="dropout"):
        LoraSettings(rank=4, dropout=1.5)


def test_adapter_of_pairs_each_adapted_weight_and_merges_it_as_merged_weights_do():
    model = trained_adapter()
    adapter = adapter_of(model.state_dict().items(), SETTINGS)
    assert len(adapter.pairs) == 7 * 2 and adapter.settings.scale == 2.0
    name = "model.layers.0.self_attn.q_proj.weight"
    merged = dict(merged_weights(model.state_dict().items(), SETTINGS))
    base = small_llama().state_dict()[name]
    assert torch.equal(adapter.merge(name, base), merged[name])
    assert adapter.nbytes == sum(t.nbytes for n, t in model.state_dict().items() if is_adapter_tensor(n))


def test_a_policy_given_as_an_adapter_is_merged_onto_its_base(tmp_path: Path):
    """`--policy <adapter dir>` for a stage that trains: the adapter's base (its adapter_config.json) with the
    adapter merged in, as a model directory in OUT; a base that is not here is named with the field to fix."""
    from harnessrl.tinymodel import load_model, tiny_model_dir
    from harnessrl.train.checkpoint import resolve_policy
    from harnessrl.train.lora import base_name

    base = tmp_path / "base"
    small_llama().save_pretrained(base)
    from harnessrl.tinymodel import load_tokenizer

    load_tokenizer(tiny_model_dir()).save_pretrained(base)
    model = trained_adapter()
    adapter = adapter_of(model.state_dict().items(), SETTINGS).save(tmp_path / "adapter", base_name(base))
    merged = resolve_policy(str(adapter), tmp_path / "out")
    assert merged == tmp_path / "out" / "policy_merged"
    assert torch.allclose(logits(load_model(merged).eval(), IDS), logits(model, IDS), atol=1e-5)

    moved = adapter_of(model.state_dict().items(), SETTINGS).save(tmp_path / "moved", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="base_model_name_or_path"):
        resolve_policy(str(moved), tmp_path / "out2")
