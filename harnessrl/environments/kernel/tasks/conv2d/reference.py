"""Valid-mode 2-D cross-correlation by four nested loops."""

import numpy as np


def conv2d_valid(image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    h, w = image.shape
    kh, kw = kernel.shape
    out = np.empty((h - kh + 1, w - kw + 1), dtype=np.float64)
    for i in range(h - kh + 1):
        for j in range(w - kw + 1):
            s = 0.0
            for u in range(kh):
                for v in range(kw):
                    s += image[i + u, j + v] * kernel[u, v]
            out[i, j] = s
    return out
