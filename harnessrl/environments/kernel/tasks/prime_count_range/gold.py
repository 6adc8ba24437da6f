"""Number of primes in [lo, hi): a segmented sieve of Eratosthenes over the window, with the primes up to
sqrt(hi) from a small sieve (numpy slices strike out multiples)."""

import math

import numpy as np


def count_primes(lo: int, hi: int) -> int:
    lo = max(lo, 2)
    if hi <= lo:
        return 0
    limit = math.isqrt(hi - 1)
    small = np.ones(limit + 1, dtype=bool)
    small[:2] = False
    for p in range(2, math.isqrt(limit) + 1):
        if small[p]:
            small[p * p :: p] = False
    window = np.ones(hi - lo, dtype=bool)
    for p in np.flatnonzero(small).tolist():
        start = max(p * p, (lo + p - 1) // p * p)
        window[start - lo :: p] = False
    return int(np.count_nonzero(window))
