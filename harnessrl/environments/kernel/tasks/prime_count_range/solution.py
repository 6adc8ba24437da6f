"""Number of primes in [lo, hi) by trial division of every number."""


def count_primes(lo: int, hi: int) -> int:
    count = 0
    for n in range(lo, hi):
        if n < 2:
            continue
        if n % 2 == 0:
            count += n == 2
            continue
        d = 3
        prime = True
        while d * d <= n:
            if n % d == 0:
                prime = False
                break
            d += 2
        count += prime
    return count
