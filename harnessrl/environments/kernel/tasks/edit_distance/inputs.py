"""Inputs for edit_distance: a random string over "ACGT" of `size` letters and a copy of it with about a
fifth of its positions edited (substituted, deleted or followed by an insertion)."""

import numpy as np


def generate(seed: int, size: int) -> tuple[str, str]:
    rng = np.random.default_rng(seed)
    letters = "ACGT"
    a = "".join(letters[i] for i in rng.integers(0, 4, size).tolist())
    out: list[str] = []
    for ch in a:
        r = float(rng.random())
        if r < 0.07:
            out.append(letters[int(rng.integers(0, 4))])  # substitute
        elif r < 0.14:
            continue  # delete
        elif r < 0.20:
            out.append(ch + letters[int(rng.integers(0, 4))])  # insert after
        else:
            out.append(ch)
    return a, "".join(out)
