"""A polynomial evaluated at many points as a sum of powers, point by point."""

import numpy as np


def poly_eval(coeffs: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x), dtype=np.float64)
    for i in range(len(x)):
        s = 0.0
        for k in range(len(coeffs)):
            s += coeffs[k] * x[i] ** k
        out[i] = s
    return out
