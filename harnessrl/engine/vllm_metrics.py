"""`EngineStats` from a vLLM server's Prometheus `/metrics` (vLLM has no `/stats`): what `HTTPEngine.stats()`
answers against vLLM, so that the RL loop's `engine_idle_frac` and engine rates are figures, not null.

Exact (vLLM counts them at every engine step, aborted requests included):
- `prefill_forward_tokens`: `vllm:prompt_tokens_by_source_total{source="local_compute"}` (prompt tokens
  computed, not taken from the prefix cache; `prompt_tokens_total - prompt_tokens_cached_total` on a vLLM
  without the by-source counter);
- `decode_emitted_tokens`: `vllm:generation_tokens_total`;
- `prefix_cache_hit_rate`: `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` (tokens).

Approximations (vLLM exposes no seconds of forward passes, only per-request phase times of *finished*
requests): `prefill_forward_s` and `decode_forward_s` add up the growth of `vllm:request_prefill_time_seconds_sum`
and `vllm:request_decode_time_seconds_sum` from one scrape to the next, scaled by k = engine steps per generated
token over the same interval (`vllm:iteration_tokens_total_count` / `vllm:generation_tokens_total`, at most 1).
Each engine step emits about one token per running request, so the per-request times of requests running
together add up to about 1/k times the steps' seconds: one request at a time, k = 1 and the figures are its
phases' seconds; B requests decoding together, k ≈ 1/B. They count a request when it finishes (one still
running, or aborted, adds nothing yet), and a request's phases include the time vLLM was paused around a weight
sync (`/pause?mode=keep`). Every parsed `vllm:` sample is kept in `figures` (for the gateway's metrics).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from harnessrl.engine.base import EngineStats

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_DROPPED_LABELS = ("engine", "model_name")  # one engine, one model per server: summed over


def parse_prometheus(text: str) -> dict[str, float]:
    """`vllm:` samples of Prometheus' text format as {"name{label=value,...}": value}, the engine and model
    labels dropped (summed over: one server), histogram buckets and `_created` timestamps left out."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match["name"]
        if name.endswith(("_bucket", "_created")):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        labels = [f"{k}={v}" for k, v in _LABEL.findall(match["labels"] or "") if k not in _DROPPED_LABELS]
        key = f"{name}{{{','.join(sorted(labels))}}}" if labels else name
        samples[key] = samples.get(key, 0.0) + value
    return samples


_COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:iteration_tokens_total_count",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
)


class VLLMFigures:
    """Successive `/metrics` scrapes of one server as `EngineStats` (counters since it started). The seconds are
    summed scrape to scrape, each increment scaled by that interval's steps per generated token, so they never
    go back when the concurrency changes (the RL loop takes differences between steps)."""

    def __init__(self) -> None:
        self._last: dict[str, float] | None = None
        self._prefill_s = 0.0
        self._decode_s = 0.0

    def update(self, text: str) -> EngineStats | None:
        samples = parse_prometheus(text)
        if "vllm:generation_tokens_total" not in samples:
            return None
        last = self._last or {}
        if any(samples.get(k, 0.0) < last.get(k, 0.0) for k in _COUNTERS):  # the server restarted
            last, self._prefill_s, self._decode_s = {}, 0.0, 0.0

        def delta(key: str) -> float:
            return samples.get(key, 0.0) - last.get(key, 0.0)

        generated, steps = delta("vllm:generation_tokens_total"), delta("vllm:iteration_tokens_total_count")
        scale = min(1.0, steps / generated) if generated > 0 else 1.0
        self._prefill_s += scale * delta("vllm:request_prefill_time_seconds_sum")
        self._decode_s += scale * delta("vllm:request_decode_time_seconds_sum")
        self._last = samples
        return stats_from_samples(samples, self._prefill_s, self._decode_s)


def stats_from_metrics(text: str) -> EngineStats | None:
    """The figures of one scrape alone (its seconds scaled by the steps per generated token since the server
    started); None when it holds no vLLM engine counters."""
    return VLLMFigures().update(text)


def stats_from_samples(samples: Mapping[str, float], prefill_s: float, decode_s: float) -> EngineStats:
    computed_key = "vllm:prompt_tokens_by_source_total{source=local_compute}"
    if computed_key in samples:
        computed = samples[computed_key]
    else:
        computed = max(
            0.0,
            samples.get("vllm:prompt_tokens_total", 0.0)
            - samples.get("vllm:prompt_tokens_cached_total", 0.0),
        )
    queries = samples.get("vllm:prefix_cache_queries_total", 0.0)
    hit_rate = samples.get("vllm:prefix_cache_hits_total", 0.0) / queries if queries > 0 else None
    return EngineStats(
        prefill_forward_s=prefill_s,
        prefill_forward_tokens=int(computed),
        decode_forward_s=decode_s,
        decode_emitted_tokens=int(samples.get("vllm:generation_tokens_total", 0.0)),
        prefix_cache_hit_rate=hit_rate,
        figures={"source": "vllm /metrics", **samples},
    )
