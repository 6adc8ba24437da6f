"""The statistics of an evaluation: pass@k, the Wilson interval, and a paired bootstrap over tasks.

pass_at_k(n, c, k) -> float                      unbiased estimator (Chen et al. 2021)
wilson_interval(successes, trials) -> (low, high)  95% score interval for a proportion
paired_bootstrap(a, b, iterations, seed) -> BootstrapResult   mean(b - a) over tasks, CI, p, significant
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c of them correct) is
    correct: 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms the
    (huge) binomial coefficients."""
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for successes/trials (95% by default); (0, 1) when there are no trials."""
    if not 0 <= successes <= trials:
        raise ValueError(f"Wilson interval needs 0 <= successes <= trials, got {successes}/{trials}")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    z2n = z * z / trials
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    return max(0.0, center - half), min(1.0, center + half)


@dataclass(frozen=True)
class BootstrapResult:
    """mean(b - a) over paired tasks, its percentile interval, and a two-sided bootstrap p-value."""

    tasks: int
    diff: float
    low: float
    high: float
    p_value: float
    significant: bool  # the interval excludes 0
    confidence: float
    iterations: int
    seed: int

    def to_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    iterations: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapResult:
    """Resamples tasks with replacement (seeded), keeping each task's pair (a_i, b_i) together.

    a[i], b[i]: the two policies' scores on task i (e.g. their pass@1 on it). The difference is significant
    when the percentile interval excludes 0. p_value: twice the share of resampled means on the far side of
    0 (capped at 1), the usual bootstrap reading of "how often would the sign flip"."""
    da, db = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if da.shape != db.shape or da.ndim != 1:
        raise ValueError(f"paired bootstrap needs two equally long lists, got {da.shape} and {db.shape}")
    if len(da) == 0:
        raise ValueError("paired bootstrap needs at least one task scored by both policies")
    if iterations < 1 or not 0 < confidence < 1:
        raise ValueError(f"need iterations >= 1 and 0 < confidence < 1, got {iterations}, {confidence}")
    d = db - da
    rng = np.random.default_rng(seed)
    means = np.empty(iterations)
    chunk = max(1, 4_000_000 // len(d))  # bounds the index matrix at ~32 MB
    for start in range(0, iterations, chunk):
        stop = min(iterations, start + chunk)
        means[start:stop] = d[rng.integers(0, len(d), size=(stop - start, len(d)))].mean(axis=1)
    alpha = 1 - confidence
    low, high = (float(x) for x in np.quantile(means, [alpha / 2, 1 - alpha / 2]))
    p = min(1.0, 2 * min(float(np.mean(means <= 0)), float(np.mean(means >= 0))))
    return BootstrapResult(
        tasks=len(d),
        diff=float(d.mean()),
        low=low,
        high=high,
        p_value=p,
        significant=low > 0 or high < 0,
        confidence=confidence,
        iterations=iterations,
        seed=seed,
    )
