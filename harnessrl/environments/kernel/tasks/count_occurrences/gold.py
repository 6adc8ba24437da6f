"""Overlapping occurrence counts: the text as a byte array, a pattern's match mask as the AND of one
shifted comparison per pattern character (len(pattern) numpy ops per pattern)."""

import numpy as np


def count_occurrences(text: str, patterns: list[str]) -> list[int]:
    data = text.encode("utf-32-le")  # one fixed-width code unit per character, whatever the text holds
    t = np.frombuffer(data, dtype=np.uint32)
    n = len(t)
    out: list[int] = []
    for p in patterns:
        m = len(p)
        if m == 0:
            out.append(n + 1)
            continue
        if m > n:
            out.append(0)
            continue
        codes = np.frombuffer(p.encode("utf-32-le"), dtype=np.uint32)
        mask = t[: n - m + 1] == codes[0]
        for j in range(1, m):
            mask &= t[j : n - m + 1 + j] == codes[j]
        out.append(int(np.count_nonzero(mask)))
    return out
