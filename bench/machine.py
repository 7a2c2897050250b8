"""How fast this machine runs plain Python right now, printed beside a benchmark's figures.

The machines the benchmarks run on are shared: the same code on the same machine has read three to four times
slower on one day than on another. A figure in seconds is only comparable with one taken at the same speed, so the
timing benchmarks print this one with theirs: the median, over `runs`, of the best of three timings of a fixed
pure-Python loop (`sum(range(10**6))`), the figure `python -m timeit "sum(range(10**6))"` gives. Ratios measured
side by side in one run do not need it.

    python bench/machine.py
"""

from __future__ import annotations

import statistics
import timeit


def loop_ms(runs: int = 5) -> float:
    """Milliseconds for `sum(range(10**6))`: the median over `runs` of the best of three."""
    return statistics.median(min(timeit.repeat("sum(range(10**6))", repeat=3, number=1)) * 1e3 for _ in range(runs))


def line(runs: int = 5) -> str:
    return f"machine speed: sum(range(10**6)) takes {loop_ms(runs):.1f} ms (median of {runs}; lower is faster)"


if __name__ == "__main__":
    print(line())
