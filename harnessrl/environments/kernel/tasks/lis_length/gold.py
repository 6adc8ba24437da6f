"""Length of the longest strictly increasing subsequence in O(n log n): tails[l] is the smallest value that
ends an increasing subsequence of length l + 1; each value replaces the first tail >= it (bisect_left)."""

from bisect import bisect_left


def lis_length(x: list[int]) -> int:
    tails: list[int] = []
    for v in x:
        i = bisect_left(tails, v)
        if i == len(tails):
            tails.append(v)
        else:
            tails[i] = v
    return len(tails)
