"""Run-length encoding of an integer vector, element by element."""

import numpy as np


def run_length_encode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values: list[int] = []
    lengths: list[int] = []
    for i in range(len(x)):
        v = int(x[i])
        if values and values[-1] == v:
            lengths[-1] += 1
        else:
            values.append(v)
            lengths.append(1)
    return np.array(values, dtype=np.int64), np.array(lengths, dtype=np.int64)
