"""0/1 knapsack: the full (items + 1) x (capacity + 1) dynamic-programming table in Python lists."""


def knapsack(weights: list[int], values: list[int], capacity: int) -> int:
    n = len(weights)
    table = [[0] * (capacity + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        w, v = weights[i - 1], values[i - 1]
        prev, cur = table[i - 1], table[i]
        for c in range(capacity + 1):
            cur[c] = prev[c]
            if w <= c and prev[c - w] + v > cur[c]:
                cur[c] = prev[c - w] + v
    return table[n][capacity]
