"""A polynomial at many points: Horner's rule, vectorized over the points."""

import numpy as np


def poly_eval(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    acc = np.zeros(len(x), dtype=np.float64)
    for c in coeffs[::-1]:
        acc *= x
        acc += c
    return acc
