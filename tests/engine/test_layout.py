"""Weight layouts of the local engine (harnessrl/engine/layout.py): every layout computes the same products,
weight loads reach MKL's packed copy, tied weights stay one parameter, and the per-host probe is cached."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.nn import functional

from harnessrl.engine import layout
from harnessrl.engine.layout import Layout, LayoutLinear

LAYOUTS = [Layout.PLAIN, Layout.TRANSPOSED] + ([Layout.PACKED] if layout.packing_available() else [])


def _linear(out: int, inner: int, bias: bool, seed: int = 0) -> LayoutLinear:
    g = torch.Generator().manual_seed(seed)
    m = LayoutLinear(inner, out, bias=bias)
    m.weight = nn.Parameter(torch.randn(out, inner, generator=g), requires_grad=False)
    if bias:
        m.bias = nn.Parameter(torch.randn(out, generator=g), requires_grad=False)
    return m


@pytest.mark.parametrize("kind", LAYOUTS)
def test_every_layout_computes_the_same_product_and_follows_weight_loads(kind):
    m = _linear(96, 40, bias=True)
    m.set_layout(kind)
    assert m.weight.shape == (96, 40)
    for rows in (1, 8, 300):
        x = torch.randn(rows, 40)
        assert torch.allclose(m(x), functional.linear(x, m.weight, m.bias), atol=1e-5)
    x3 = torch.randn(2, 5, 40)  # a batch of sequences
    assert m(x3).shape == (2, 5, 96)
    with torch.no_grad():  # an in-place weight load, as a weight sync does, then the engine's repack
        m.weight.copy_(torch.randn(96, 40))
    layout.repack(nn.Sequential(m))
    x = torch.randn(8, 40)
    assert torch.allclose(m(x), functional.linear(x, m.weight, m.bias), atol=1e-5)


@pytest.mark.parametrize("kind", LAYOUTS)
def test_a_tied_head_and_embedding_stay_one_parameter(kind, monkeypatch):
    monkeypatch.setenv(layout.OVERRIDE_ENV, str(kind))
    model = nn.Module()
    model.embed = nn.Embedding(50, 16)
    model.head = LayoutLinear(16, 50, bias=False)
    model.head.weight = model.embed.weight
    names = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    chosen = layout.apply(model, model.head)
    assert chosen == {"head": kind}
    assert model.head.weight is model.embed.weight
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == names
    with torch.no_grad():
        model.embed.weight.mul_(2)  # a weight load through the embedding's name
    layout.repack(model)
    x = torch.randn(3, 16)
    assert torch.allclose(model.head(x), x @ model.embed.weight.T, atol=1e-5)


def test_the_override_is_checked(monkeypatch):
    monkeypatch.setenv(layout.OVERRIDE_ENV, "sideways")
    with pytest.raises(ValueError, match="HARNESSRL_LAYOUT must be one of plain, transposed, packed"):
        layout.apply(nn.Sequential(LayoutLinear(4, 4)))


def test_the_probe_picks_per_shape_and_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path))
    monkeypatch.setattr(layout, "COLD_BYTES", 1 << 20)
    first = layout.probe([(32, 16)], (64, 16), seconds=0.01)
    assert set(first.seconds) == {"32 x 16", "64 x 16"}
    assert all(set(timed) == {str(k) for k in LAYOUTS} for timed in first.seconds.values())
    (cached,) = (tmp_path / "layout").glob("*.json")
    assert json.loads(cached.read_text())["seconds"] == first.seconds
    again = layout.probe([(32, 16)], (64, 16), seconds=0.01)
    assert again == first  # read back, not measured again
    # the pick: plain unless another layout is MARGIN faster
    slow_plain = layout.LayoutProbe({"8 x 8": {"plain": 2.0, "transposed": 1.0}}, "cpu", 1, 0.0)
    close = layout.LayoutProbe({"8 x 8": {"plain": 1.01, "transposed": 1.0}}, "cpu", 1, 0.0)
    assert slow_plain.pick((8, 8)) is Layout.TRANSPOSED and close.pick((8, 8)) is Layout.PLAIN
    assert close.pick((9, 9)) is Layout.PLAIN  # a shape it did not time
