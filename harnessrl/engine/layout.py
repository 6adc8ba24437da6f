"""How the local engine stores each float32 weight matrix on this CPU: measured once per host and cached.

A matrix product's speed at a decode step's few rows depends on how the weight sits in memory, and which way
is fastest differs between processors (measured, one thread, 8 rows, the 49,152 x 576 output head: an Ice
Lake Xeon ran the transposed layout ~2x faster than the plain one; an AMD EPYC ran it 1.25x slower, and MKL's
packed format 1.25x faster than plain). So the engine does not fix a layout: for every distinct weight shape
of the model it times, on this host and at its thread count, each layout —

- `plain`: `[out, in]` row-major, `F.linear(x, W)`;
- `transposed`: the same `[out, in]` tensor stored `[in, out]` in memory (MKL's `x @ B` with a plain `B`);
- `packed`: MKL's packed GEMM format (`torch.ops.mkl._mkl_linear`; a second copy of the matrix, made again
  after every weight load) —

at a decode step's 8 rows plus a 256-row prefill chunk (the head only at the decode rows: a chunk computes
logits for its last token alone), the decode rows over 64 MB of copies of the matrix (a step streams its
weights from memory; one small matrix would sit in the cache), and keeps the fastest (`plain` unless another is `MARGIN` faster). Every
layout gives the same parameter to every reader (names, shapes, values, in-place weight loads, tied
embeddings). The answer is cached as JSON under `cache_root()/layout/`, keyed by the CPU (model name, flags),
torch's version, the thread count and the shapes; `HARNESSRL_LAYOUT` (`plain`, `transposed`, `packed`)
overrides it for every shape. `python -m harnessrl.engine.layout [--refresh] [--threads N]` prints the tiny
model's answer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from harnessrl.io import atomic_write_json
from harnessrl.numformat import host_identity

logger = logging.getLogger(__name__)

DECODE_ROWS, CHUNK_ROWS = 8, 256
MARGIN = 1.05  # another layout must be this much faster than plain to be picked
COLD_BYTES = 64 << 20  # each shape is timed over this many bytes of weights (beyond the caches)
OVERRIDE_ENV = "HARNESSRL_LAYOUT"
PROBE_VERSION = 2
Shape = tuple[int, int]  # (out, in) of a weight matrix


class Layout(StrEnum):
    PLAIN = "plain"
    TRANSPOSED = "transposed"
    PACKED = "packed"


def packing_available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


@dataclass(frozen=True)
class LayoutProbe:
    """Per weight shape (`"out x in"`), the seconds of one decode step's and one chunk's products in each
    layout, and the pick."""

    seconds: dict[str, dict[str, float]]
    host: str
    threads: int
    measured_at: float

    def pick(self, shape: Shape) -> Layout:
        timed = self.seconds.get(_key(shape))
        if not timed:
            return Layout.PLAIN
        best = min(timed, key=lambda name: timed[name])
        return Layout(best) if timed[Layout.PLAIN] >= MARGIN * timed[best] else Layout.PLAIN

    def describe(self) -> str:
        parts = []
        for key, timed in self.seconds.items():
            pick = self.pick(_shape(key))
            speedup = timed[Layout.PLAIN] / timed[pick]
            parts.append(f"{key}: {pick} ({speedup:.2f}x plain)")
        return f"{'; '.join(parts)} ({self.threads} threads, {self.host})"


def _key(shape: Shape) -> str:
    return f"{shape[0]} x {shape[1]}"


def _shape(key: str) -> Shape:
    out, _, inner = key.partition(" x ")
    return int(out), int(inner)


def _shape_of(linear: nn.Linear) -> Shape:
    return int(linear.weight.shape[0]), int(linear.weight.shape[1])


def weight_shapes(model: nn.Module, head: nn.Linear | None) -> tuple[list[Shape], Shape | None]:
    """The distinct shapes of the model's linear maps (the head apart: it runs at the decode rows only)."""
    shapes = {_shape_of(m) for m in model.modules() if isinstance(m, nn.Linear) and m is not head}
    return sorted(shapes), (_shape_of(head) if head is not None else None)


def cache_path(layers: list[Shape], head: Shape | None, threads: int) -> Path:
    from harnessrl.tinymodel import cache_root

    identity = {**host_identity(), "threads": threads, "layers": layers, "head": head, "v": PROBE_VERSION}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "layout" / f"{key}.json"


def probe(
    layers: list[Shape], head: Shape | None, *, refresh: bool = False, seconds: float = 0.3
) -> LayoutProbe:
    """This host's answer at the current thread count: from the cache, else measured (a few seconds)."""
    threads = torch.get_num_threads()
    path = cache_path(layers, head, threads)
    if not refresh and path.is_file():
        try:
            return LayoutProbe(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            logger.warning("%s: unreadable, measuring again", path)
    result = measure(layers, head, seconds)
    try:
        atomic_write_json(path, asdict(result))
    except OSError as e:  # a read-only home: measured again next time
        logger.warning("cannot cache the layout probe at %s: %s", path, e)
    logger.info("weight layout probe: %s", result.describe())
    return result


def measure(layers: list[Shape], head: Shape | None, seconds: float = 0.3) -> LayoutProbe:
    """Best of repeated rounds, each round timing every layout of every shape (load drifts hit all alike)."""
    generator = torch.Generator().manual_seed(0)
    layouts = [Layout.PLAIN, Layout.TRANSPOSED] + ([Layout.PACKED] if packing_available() else [])
    calls: dict[str, dict[str, Callable[[], float]]] = {}
    for shape in [*layers, *([head] if head else [])]:
        weight = torch.randn(*shape, generator=generator)
        rows = [DECODE_ROWS] if shape == head else [DECODE_ROWS, CHUNK_ROWS]
        inputs = [torch.randn(n, shape[1], generator=generator) for n in rows]
        calls[_key(shape)] = {str(layout): _products(layout, weight, inputs) for layout in layouts}
    best = {key: dict.fromkeys(timed, float("inf")) for key, timed in calls.items()}
    for timed in calls.values():  # warm-up
        for call in timed.values():
            call()
    deadline = time.perf_counter() + seconds * max(1, len(calls))
    rounds = 0
    while rounds < 3 or (time.perf_counter() < deadline and rounds < 30):
        for key, timed in calls.items():
            for name, call in timed.items():
                best[key][name] = min(best[key][name], call())
        rounds += 1
    return LayoutProbe(best, host_identity()["device"], torch.get_num_threads(), time.time())


def _products(layout: Layout, weight: torch.Tensor, inputs: list[torch.Tensor]) -> Callable[[], float]:
    """Seconds of the decode rows (`inputs[0]`) through `COLD_BYTES` worth of copies of `weight` in `layout` —
    a model's step streams every layer's weights from memory, so one small matrix, hot in the cache, would
    time something else — plus a chunk's rows (`inputs[1:]`, bound by arithmetic, not memory) through one
    copy, counted once per copy."""
    copies = max(1, -(-COLD_BYTES // (weight.numel() * weight.element_size())))
    linears = []
    for _ in range(copies):
        linear = LayoutLinear(weight.shape[1], weight.shape[0], bias=False)
        linear.weight = nn.Parameter(weight.clone(), requires_grad=False)
        linear.set_layout(layout)
        linears.append(linear)
    decode, chunks = inputs[0], inputs[1:]

    def run() -> float:
        with torch.no_grad():
            t0 = time.perf_counter()
            for linear in linears:
                linear(decode)
            t1 = time.perf_counter()
            for x in chunks:
                linears[0](x)
            return t1 - t0 + (time.perf_counter() - t1) * copies

    return run


class LayoutLinear(nn.Linear):
    """`nn.Linear` whose weight is stored in a `Layout`. The parameter stays `weight` (shape, values, in-place
    loads as before); `packed` keeps MKL's copy, which `repack` makes again after the weight changed."""

    layout: Layout = Layout.PLAIN
    packed: torch.Tensor | None = None

    def set_layout(self, layout: Layout) -> None:
        self.layout = layout
        if layout is Layout.TRANSPOSED and self.weight.stride() != (1, self.weight.shape[0]):
            self.weight = nn.Parameter(
                self.weight.detach().t().contiguous().t(), requires_grad=self.weight.requires_grad
            )
        self.repack()

    def repack(self) -> None:
        self.packed = (
            torch.ops.mkl._mkl_reorder_linear_weight(self.weight.detach(), DECODE_ROWS)
            if self.layout is Layout.PACKED
            else None
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return functional.linear(input, self.weight, self.bias)
        rows = input.reshape(-1, input.shape[-1])
        out = torch.ops.mkl._mkl_linear(rows, self.packed, self.weight, self.bias, rows.shape[0])
        return out.reshape(*input.shape[:-1], out.shape[-1])


def apply(model: nn.Module, head: nn.Linear | None = None) -> dict[str, Layout]:
    """Stores every linear map of `model` (float32, CPU) in this host's fastest layout for its shape (`head`:
    the output head, timed at the decode rows only); returns each map's layout by name. A weight tied to
    another module (the head and the embedding) stays one parameter."""
    forced = os.environ.get(OVERRIDE_ENV, "")
    if forced and forced not in set(Layout):
        raise ValueError(f"{OVERRIDE_ENV} must be one of {', '.join(Layout)}, got {forced!r}")
    layers, head_shape = weight_shapes(model, head)
    answer = None if forced else probe(layers, head_shape)
    owners: dict[int, list[tuple[nn.Module, str]]] = {}  # parameter -> every (module, attribute) holding it
    for owner in model.modules():
        for attr, param in owner.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append((owner, attr))
    chosen: dict[str, Layout] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LayoutLinear):
            continue
        layout = Layout(forced) if answer is None else answer.pick(_shape_of(module))
        if layout is Layout.PACKED and not packing_available():
            layout = Layout.PLAIN
        holders = owners.get(id(module.weight), [])
        module.set_layout(layout)
        for owner, attr in holders:
            setattr(owner, attr, module.weight)
        chosen[name] = layout
    return chosen


def unpack(model: nn.Module) -> None:
    """MKL's packed copies dropped (their memory freed): each map multiplies by its plain weight until `repack`."""
    for module in model.modules():
        if isinstance(module, LayoutLinear):
            module.packed = None


def repack(model: nn.Module) -> None:
    """After the weights were loaded in place: MKL's packed copies made again."""
    for module in model.modules():
        if isinstance(module, LayoutLinear) and module.layout is Layout.PACKED:
            module.repack()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.engine.layout", description=__doc__)
    parser.add_argument("--refresh", action="store_true", help="measure again (and cache)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from harnessrl.numformat import Shapes

    *layer_maps, (hidden, vocab, _) = Shapes().linear()  # (in, out, times); the head last
    layers = sorted({(out, inner) for inner, out, _ in layer_maps})
    result = probe(layers, (vocab, hidden), refresh=args.refresh)
    picks = {key: str(result.pick(_shape(key))) for key in result.seconds}
    print(
        json.dumps(
            {"picks": picks, "seconds": result.seconds, "threads": result.threads, "host": result.host}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
