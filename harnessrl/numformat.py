"""Which number format this host multiplies faster, float32 or bfloat16: measured once per host and cached, for
`dtype: auto` of the local engine and `precision: auto` of the trainer.

The probe times the matrix products each role runs, at the model's shapes (its decoder's linear maps and the
output head), in float32 and in bfloat16, and picks bfloat16 only where it is faster by at least `MARGIN`
(bfloat16 costs exactness: greedy outputs that no longer match float32 token for token, logits that move with
the chunking — docs/engine.md), else float32:

- engine: one decode step of 8 rows and one prefill chunk of 256 rows through every linear map (the head for
  the decode rows), weights stored in the format (`x @ W^T`);
- trainer: a packed micro-batch of 1,024 tokens, forward and backward through autograd, as `Trainer` runs it:
  float32 master weights, under bf16 autocast for bfloat16 (which casts weights and inputs: timed too).

Hosts differ: on a Xeon with AMX, bfloat16 products run at ~2.6x the float32 rate; on one with AVX-512 but
no native bfloat16 (this project's CI machine), at about half of it. The answer is cached as JSON under
`cache_root()/numformat/`, keyed by the CPU's model name and flags (or the GPU's name), torch's version, the
role and the shapes; `HARNESSRL_NUMFORMAT` (`float32` or `bfloat16`) overrides the probe for every role.
`python -m harnessrl.numformat [--refresh]` prints both roles' answers for the tiny model (one JSON line).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harnessrl.io import atomic_write_json

logger = logging.getLogger(__name__)

FLOAT32, BFLOAT16 = "float32", "bfloat16"
MARGIN = 1.2  # bfloat16 must be this much faster to be picked
ROLES = ("engine", "trainer")
ENGINE_ROWS = (8, 256)  # a decode step of 8 rows, a prefill chunk
TRAINER_TOKENS = 1024  # a packed micro-batch
OVERRIDE_ENV = "HARNESSRL_NUMFORMAT"
PROBE_VERSION = 1  # bump when what is measured changes: cached answers of another version are measured again


@dataclass(frozen=True)
class Shapes:
    """The products of one decoder layer and the head (transformers' config names)."""

    hidden: int = 576  # SmolLM2-135M
    intermediate: int = 1536
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    vocab: int = 49152
    layers: int = 30

    @classmethod
    def of(cls, config: Any) -> Shapes:
        heads = int(config.num_attention_heads)
        return cls(
            hidden=int(config.hidden_size),
            intermediate=int(config.intermediate_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            vocab=int(config.vocab_size),
            layers=int(config.num_hidden_layers),
        )

    def linear(self) -> list[tuple[int, int, int]]:
        """(in, out, times per forward) of every linear map: q, k, v, o, gate, up, down per layer, the head once."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        per_layer = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
        merged: dict[tuple[int, int], int] = {}
        for shape in per_layer:
            merged[shape] = merged.get(shape, 0) + self.layers
        return [(k, n, times) for (k, n), times in merged.items()] + [(h, self.vocab, 1)]


@dataclass(frozen=True)
class Probe:
    """Seconds of one pass over a role's products in each format, and what they pick."""

    role: str
    seconds: dict[str, float]
    flops: float  # of one pass
    host: str  # CPU model name (or GPU name)
    threads: int
    measured_at: float  # time.time()

    @property
    def factor(self) -> float:
        """float32 seconds over bfloat16 seconds: above 1, bfloat16 is faster."""
        return self.seconds[FLOAT32] / self.seconds[BFLOAT16]

    @property
    def pick(self) -> str:
        return BFLOAT16 if self.factor >= MARGIN else FLOAT32

    def gflops(self, fmt: str) -> float:
        return self.flops / self.seconds[fmt] / 1e9

    def describe(self) -> str:
        return (
            f"{self.role}: {self.pick} (bfloat16 {self.factor:.2f}x the float32 speed at its shapes: "
            f"{self.gflops(FLOAT32):.0f} vs {self.gflops(BFLOAT16):.0f} GFLOP/s fp32/bf16, {self.threads} "
            f"threads, {self.host})"
        )


def resolve(requested: str, role: str, config: Any | None = None, device: str | Any = "cpu") -> str:
    """The format to run: `requested` itself (float32, bfloat16, float16), or for `auto` the probe's pick for
    `role` at the shapes of the model `config` (transformers' names; None: the tiny model's) on `device`."""
    requested = str(requested)
    if requested != "auto":
        return requested
    forced = os.environ.get(OVERRIDE_ENV, "")
    if forced:
        if forced not in (FLOAT32, BFLOAT16):
            raise ValueError(f"{OVERRIDE_ENV} must be {FLOAT32} or {BFLOAT16}, got {forced!r}")
        logger.info("%s auto: %s (%s)", role, forced, OVERRIDE_ENV)
        return forced
    shapes = Shapes()
    if config is not None:
        try:
            shapes = Shapes.of(config)
        except (AttributeError, TypeError, ValueError):  # not a decoder config: probed at the tiny model's
            logger.info(
                "%s number format auto: the model's config has no decoder shapes, probing the tiny model's",
                role,
            )
    result = probe(role, shapes, str(device))
    logger.info("%s number format auto: %s", role, result.describe())
    return result.pick


def host_identity(device: str = "cpu") -> dict[str, str]:
    """What the answer depends on besides the shapes: the processor and the kernels' library."""
    import torch

    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        return {"device": torch.cuda.get_device_name(index), "flags": "", "torch": torch.__version__}
    name, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and not name:
                name = value
            elif key in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    return {"device": name, "flags": flags, "torch": torch.__version__}


def cache_dir() -> Path:
    from harnessrl.tinymodel import cache_root

    return cache_root() / "numformat"


def cache_path(role: str, shapes: Shapes, device: str = "cpu") -> Path:
    identity = {**host_identity(device), "role": role, "shapes": asdict(shapes), "version": PROBE_VERSION}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{role}-{key}.json"


def probe(
    role: str,
    shapes: Shapes | None = None,
    device: str = "cpu",
    *,
    refresh: bool = False,
    seconds: float = 0.3,
) -> Probe:
    """The role's measurement on this host: from the cache, else measured (a few seconds) and cached."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    shapes = shapes or Shapes()
    path = cache_path(role, shapes, device)
    if not refresh and path.is_file():
        try:
            return Probe(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            logger.warning("%s: unreadable, measuring again", path)
    result = measure(role, shapes, device, seconds)
    try:
        atomic_write_json(path, asdict(result))
    except OSError as e:  # a read-only home: measured again next time
        logger.warning("cannot cache the number-format probe at %s: %s", path, e)
    logger.info("number-format probe, %s", result.describe())
    return result


def measure(role: str, shapes: Shapes, device: str = "cpu", seconds: float = 0.3) -> Probe:
    """Times one pass over the role's products in float32 and in bfloat16: the best of repeated rounds, each
    round running both formats, so that a shared machine's load drifts hit both alike."""
    import torch

    run = {fmt: _pass(role, shapes, getattr(torch, fmt), torch.device(device)) for fmt in (FLOAT32, BFLOAT16)}
    best = {fmt: call() for fmt, call in run.items()}  # warm-up (kernels set up, memory touched), also timed
    deadline = time.perf_counter() + 2 * seconds
    rounds = 0
    # 3 rounds at least where a round is cheap; one where a format is emulated (seconds a pass: noise is small)
    cheap = sum(best.values()) < seconds
    while rounds < 1 or (rounds < 50 and (time.perf_counter() < deadline or (cheap and rounds < 3))):
        for fmt, call in run.items():
            best[fmt] = min(best[fmt], call())
        rounds += 1
    return Probe(
        role,
        best,
        _flops(role, shapes),
        host_identity(device)["device"],
        torch.get_num_threads(),
        time.time(),
    )


def _flops(role: str, shapes: Shapes) -> float:
    layers = sum(k * n * times for k, n, times in shapes.linear()[:-1])
    head = shapes.hidden * shapes.vocab
    if role == "engine":
        return 2.0 * (layers * sum(ENGINE_ROWS) + head * ENGINE_ROWS[0])
    return 3 * 2.0 * (layers + head) * TRAINER_TOKENS  # forward, and two products backward


def _pass(role: str, shapes: Shapes, dtype: Any, device: Any) -> Callable[[], float]:
    """One pass over the role's products, returning its seconds. Each distinct product runs once and its
    seconds count as many times as the model runs it (30 layers: a pass costs what the model's products cost
    without holding a whole model's weights); the head runs on fewer rows for the trainer, scaled the same way.

    engine: weights stored in the format, `x @ W^T` for a decode step's rows and a prefill chunk's (the head
    only for the decode rows: a chunk computes logits for its last token alone). trainer: float32 master
    weights, forward and backward through autograd, under bf16 autocast for bfloat16 (it casts the weights
    and inputs), as `Trainer` runs."""
    import torch
    from torch.nn import functional

    generator = torch.Generator().manual_seed(0)
    cuda = device.type == "cuda"

    def tensor(*size: int, kind: Any) -> Any:
        return torch.randn(*size, generator=generator).to(device=device, dtype=kind)

    calls: list[tuple[float, Callable[[], object]]] = []
    linear = shapes.linear()
    for index, (k, n, times) in enumerate(linear):
        head = index == len(linear) - 1
        if role == "engine":
            weight = tensor(n, k, kind=dtype)
            for rows in ENGINE_ROWS[:1] if head else ENGINE_ROWS:
                x = tensor(rows, k, kind=dtype)
                calls.append((times, lambda x=x, w=weight: functional.linear(x, w)))
            continue
        tokens = TRAINER_TOKENS // 8 if head else TRAINER_TOKENS
        master = tensor(n, k, kind=torch.float32).requires_grad_(True)
        x = tensor(tokens, k, kind=torch.float32).requires_grad_(True)
        grad = tensor(tokens, n, kind=dtype)

        def step(master: Any = master, x: Any = x, grad: Any = grad) -> None:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                out = functional.linear(x, master)
            out.backward(grad)
            master.grad = x.grad = None

        calls.append((times * TRAINER_TOKENS / tokens, step))

    def one_pass() -> float:
        total = 0.0
        for scale, call in calls:
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with contextlib.nullcontext() if role == "trainer" else torch.inference_mode():
                call()
            if cuda:
                torch.cuda.synchronize(device)
            total += (time.perf_counter() - start) * scale
        return total

    return one_pass


def main(argv: list[str] | None = None) -> int:
    import argparse

    import torch

    parser = argparse.ArgumentParser(description="which number format auto picks here (engine and trainer)")
    parser.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out: dict[str, Any] = {}
    for role in ROLES:
        result = probe(role, device=args.device, refresh=args.refresh)
        out[role] = {
            "pick": result.pick,
            "bf16_vs_fp32_factor": round(result.factor, 3),
            "gflops_per_s": {fmt: round(result.gflops(fmt), 1) for fmt in (FLOAT32, BFLOAT16)},
            "threads": result.threads,
            "cache": str(cache_path(role, Shapes(), args.device)),
        }
    out["host"] = host_identity(args.device)["device"]
    out["torch"] = torch.__version__
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
