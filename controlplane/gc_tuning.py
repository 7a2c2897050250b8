"""The garbage collector's thresholds for the control plane's processes.

A policy round allocates a few objects per job (its outcome, shares, a closure for the detail), a
simulation keeps every event, and the plan book caches hundreds of thousands of best plans. With
CPython's default thresholds (a young collection every 700 allocations, an older one every 10 of
those) the collector walks that heap over and over: on a PAI-shaped day (`bench/pai_day.py`, 6
simulated hours on 80x8) it was 14% of the policy's time, the same as with the collector off.
Larger thresholds keep reference cycles collected, less often. Freed memory is unchanged: almost
every object goes when its last reference does, which no threshold affects.
"""

from __future__ import annotations

import gc

YOUNG = 100_000
"""allocations (net of frees) of container objects between young collections (CPython's default: 700)"""
OLDER = (50, 100)
"""young collections per middle one, middle ones per full one (defaults: 10, 10)"""


def tune() -> None:
    """Raise the thresholds for this process (never lowers one set higher already)."""
    young, middle, full = gc.get_threshold()
    if young and young < YOUNG:  # 0: collection switched off by the caller
        gc.set_threshold(YOUNG, max(middle, OLDER[0]), max(full, OLDER[1]))
