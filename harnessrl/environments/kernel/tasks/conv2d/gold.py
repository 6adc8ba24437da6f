"""Valid-mode 2-D cross-correlation: one shifted-slice multiply-add per kernel tap (kh * kw numpy ops)."""

import numpy as np


def conv2d_valid(image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    h, w = image.shape
    kh, kw = kernel.shape
    oh, ow = h - kh + 1, w - kw + 1
    out = np.zeros((oh, ow), dtype=np.float64)
    for u in range(kh):
        for v in range(kw):
            out += kernel[u, v] * image[u : u + oh, v : v + ow]
    return out
