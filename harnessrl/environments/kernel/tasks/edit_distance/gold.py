"""Levenshtein distance, bit-parallel (Myers 1999 in Hyyro's formulation for the global distance): the
vertical differences of one DP column (+1 / -1 / 0 between consecutive rows) live as the bits of two Python
ints VP and VN over len(a) rows, so each character of `b` costs a handful of big-int operations.

For each character c of b, with Eq = the rows where a has c:
    D0 = (((Eq & VP) + VP) ^ VP) | Eq | VN
    HP = VN | ~(D0 | VP);  HN = D0 & VP
    the distance in the last row moves by +1 if HP's top bit is set, -1 if HN's is;
    HP = (HP << 1) | 1 (the top row grows by one per column);  HN <<= 1
    VP = HN | ~(D0 | HP);  VN = D0 & HP   (both cut to len(a) bits)
"""


def edit_distance(a: str, b: str) -> int:
    m = len(a)
    if m == 0:
        return len(b)
    peq: dict[str, int] = {}
    for i, c in enumerate(a):
        peq[c] = peq.get(c, 0) | (1 << i)
    full = (1 << m) - 1
    top = 1 << (m - 1)
    vp, vn, dist = full, 0, m
    for c in b:
        eq = peq.get(c, 0)
        d0 = (((eq & vp) + vp) ^ vp) | eq | vn
        hp = vn | ~(d0 | vp)
        hn = d0 & vp
        if hp & top:
            dist += 1
        elif hn & top:
            dist -= 1
        hp = ((hp << 1) | 1) & full
        hn = (hn << 1) & full
        vp = (hn | ~(d0 | hp)) & full
        vn = d0 & hp
    return dist
