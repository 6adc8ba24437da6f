"""Overlapping occurrence counts of each pattern, comparing a slice at every position."""


def count_occurrences(text: str, patterns: list[str]) -> list[int]:
    out: list[int] = []
    for p in patterns:
        m = len(p)
        c = 0
        for i in range(len(text) - m + 1):
            if text[i : i + m] == p:
                c += 1
        out.append(c)
    return out
