"""`dtype: auto` / `precision: auto`: the probe measures once per host (cached, keyed by the host and torch),
picks bfloat16 only where it is clearly faster, and the local engine, the trainer and the RL loop's config take
its answer. No timing is asserted: the measured values are replaced where a test needs a given answer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from harnessrl import numformat
from harnessrl.engine.base import DType
from harnessrl.numformat import BFLOAT16, FLOAT32, MARGIN, Probe, Shapes
from harnessrl.train.modes import Precision

SMALL = Shapes(hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=128, layers=2)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The probe's answers go to a fresh folder (the tiny model stays in the real cache)."""
    folder = tmp_path / "numformat"
    monkeypatch.setattr(numformat, "cache_dir", lambda: folder)
    monkeypatch.delenv(numformat.OVERRIDE_ENV, raising=False)
    return folder


def fixed(factor: float):
    """A stand-in for `measure` answering bfloat16 `factor`x as fast as float32, counting its calls."""
    calls = []

    def measure(role: str, shapes: Shapes, device: str = "cpu", seconds: float = 0.3) -> Probe:
        calls.append(role)
        return Probe(role, {FLOAT32: factor, BFLOAT16: 1.0}, 1e9, "test cpu", 1, 0.0)

    return measure, calls


@pytest.mark.parametrize("role", numformat.ROLES)
def test_the_probe_measures_both_formats_once_and_caches_the_answer(role, cache, monkeypatch):
    first = numformat.probe(role, SMALL, seconds=0.01)
    assert set(first.seconds) == {FLOAT32, BFLOAT16} and all(s > 0 for s in first.seconds.values())
    assert first.pick in (FLOAT32, BFLOAT16) and first.flops > 0
    [path] = cache.glob(f"{role}-*.json")
    assert json.loads(path.read_text())["seconds"] == first.seconds

    def refuse(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(numformat, "measure", refuse)
    assert numformat.probe(role, SMALL) == first  # read back, not measured


def test_the_cache_is_keyed_by_host_torch_role_and_shapes(monkeypatch):
    base = numformat.cache_path("engine", SMALL)
    assert numformat.cache_path("trainer", SMALL) != base
    assert numformat.cache_path("engine", replace(SMALL, hidden=64)) != base
    identity = numformat.host_identity()
    assert identity["torch"] == torch.__version__ and identity["device"]
    monkeypatch.setattr(numformat, "host_identity", lambda device="cpu": {**identity, "torch": "9.9"})
    assert numformat.cache_path("engine", SMALL) != base
    monkeypatch.setattr(numformat, "host_identity", lambda device="cpu": {**identity, "flags": "amx_bf16"})
    assert numformat.cache_path("engine", SMALL) != base


def test_bfloat16_is_picked_only_when_clearly_faster(monkeypatch):
    for factor, expected in ((2.6, BFLOAT16), (MARGIN, BFLOAT16), (1.1, FLOAT32), (0.5, FLOAT32)):
        measure, _ = fixed(factor)
        monkeypatch.setattr(numformat, "measure", measure)
        assert numformat.probe("engine", SMALL, refresh=True).pick == expected
    assert numformat.resolve("float32", "engine") == FLOAT32  # an explicit format is kept as it is
    assert numformat.resolve("bfloat16", "trainer") == BFLOAT16


def test_the_environment_overrides_the_probe(monkeypatch):
    measure, calls = fixed(0.5)
    monkeypatch.setattr(numformat, "measure", measure)
    monkeypatch.setenv(numformat.OVERRIDE_ENV, BFLOAT16)
    assert numformat.resolve("auto", "trainer", None) == BFLOAT16 and calls == []
    monkeypatch.setenv(numformat.OVERRIDE_ENV, "fp8")
    with pytest.raises(ValueError, match="HARNESSRL_NUMFORMAT"):
        numformat.resolve("auto", "engine")


def test_the_shapes_come_from_the_models_config():
    from harnessrl.tinymodel import tiny_model_dir

    config = json.loads((tiny_model_dir() / "config.json").read_text())
    shapes = Shapes.of(type("Config", (), config))
    assert shapes == Shapes()  # the defaults are the tiny model's
    assert shapes.linear()[-1] == (576, 49152, 1)  # the head, once
    assert sum(times for _, _, times in shapes.linear()[:-1]) == 7 * 30


def test_precision_takes_the_engines_names_and_auto():
    assert Precision("float32") is Precision.FP32 and Precision("bfloat16") is Precision.BF16
    from harnessrl.train.trainer import TrainerConfig

    assert TrainerConfig(precision="auto").precision is Precision.AUTO  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match=r"train.precision must be one of fp32, bf16, auto"):
        TrainerConfig(precision="fp8")  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize(("factor", "expected"), [(2.6, Precision.BF16), (0.5, Precision.FP32)])
def test_the_trainer_resolves_auto_and_keeps_fp32_master_weights(monkeypatch, factor, expected):
    from harnessrl.train.batching import SeqItem
    from harnessrl.train.trainer import Trainer, TrainerConfig
    from tests.train.support import tiny_llama

    measure, calls = fixed(factor)
    monkeypatch.setattr(numformat, "measure", measure)
    model = tiny_llama(vocab=64)
    trainer = Trainer(model, TrainerConfig(precision=Precision.AUTO))
    assert trainer.precision is expected and calls == ["trainer"]
    item = SeqItem([3, 4, 5, 6, 7], [0, 0, 1, 1, 1], [0.0, 0.0, -1.0, -1.0, -1.0], 1.0, 1.0 / 3, "r")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.step([item])
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    states = [s for group in trainer.optimizer.state.values() for s in group.values() if torch.is_tensor(s)]
    assert states and all(s.dtype == torch.float32 for s in states)  # AdamW's moments
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_the_local_engine_serves_in_the_format_auto_picks(tmp_path, monkeypatch):
    from harnessrl.engine.local import LocalEngine
    from tests.engine.test_model_impl import random_checkpoint

    checkpoint = random_checkpoint(tmp_path, "llama")
    for factor, dtype in ((2.6, torch.bfloat16), (0.5, torch.float32)):
        measure, calls = fixed(factor)
        monkeypatch.setattr(numformat, "measure", measure)
        monkeypatch.setattr(numformat, "cache_dir", lambda factor=factor: tmp_path / f"probe-{factor}")
        with LocalEngine(checkpoint, dtype=DType.AUTO, threads=1, max_batch=2) as engine:
            assert engine.dtype == dtype and calls == ["engine"]  # at the checkpoint's shapes
            assert engine.snapshot().figures["dtype"] == str(dtype).removeprefix("torch.")
        [path] = (tmp_path / f"probe-{factor}").glob("engine-*.json")


def test_the_rl_config_takes_an_engine_dtype_without_changing_old_identities():
    from harnessrl.rl.config import RLConfig

    assert RLConfig().engine_dtype is DType.FLOAT32
    assert "engine_dtype" not in RLConfig().hashed_settings()  # runs from before the setting still resume
    auto = RLConfig.from_dict({"engine_dtype": "auto", "train": {"precision": "auto"}})
    assert auto.engine_dtype is DType.AUTO and auto.train.precision is Precision.AUTO
    assert auto.hashed_settings()["engine_dtype"] == "auto"
    with pytest.raises(ValueError, match="engine_dtype must be one of"):
        RLConfig(engine_dtype="fp8")  # pyright: ignore[reportArgumentType]
