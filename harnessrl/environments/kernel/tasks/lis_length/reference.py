"""Length of the longest strictly increasing subsequence by the quadratic dynamic programme."""


def lis_length(x: list[int]) -> int:
    n = len(x)
    best = [1] * n
    for i in range(n):
        xi = x[i]
        for j in range(i):
            if x[j] < xi and best[j] + 1 > best[i]:
                best[i] = best[j] + 1
    return max(best, default=0)
