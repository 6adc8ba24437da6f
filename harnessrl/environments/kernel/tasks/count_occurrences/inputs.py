"""Inputs for count_occurrences: a text of `size` letters from "abcd" and 8 patterns of 1 to 6 letters
(half of them cut from the text, so they occur)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[str, list[str]]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcd"))
    text = "".join(letters[rng.integers(0, 4, size)].tolist())
    patterns: list[str] = []
    for i in range(8):
        m = int(rng.integers(1, 7))
        if i % 2 == 0 and size >= m:
            start = int(rng.integers(0, size - m + 1))
            patterns.append(text[start : start + m])
        else:
            patterns.append("".join(letters[rng.integers(0, 4, m)].tolist()))
    return text, patterns
