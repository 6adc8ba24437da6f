"""Length of the longest common subsequence, bit-parallel (Allison-Dix / Hyyro): one Python int holds a row
of the DP table's differences as bits, so each character of `b` costs a few big-int operations on len(a)
bits instead of len(a) Python steps.

V starts with all len(a) bits set; for each character c of b, with U = V & match[c],
V = (V + U) | (V - U). The LCS length is the number of zero bits among the low len(a) bits of V.
"""


def lcs_length(a: str, b: str) -> int:
    m = len(a)
    if m == 0 or not b:
        return 0
    match: dict[str, int] = {}
    for i, c in enumerate(a):
        match[c] = match.get(c, 0) | (1 << i)
    full = (1 << m) - 1
    v = full
    for c in b:
        u = v & match.get(c, 0)
        v = ((v + u) | (v - u)) & full
    return m - v.bit_count()
