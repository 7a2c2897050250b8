"""The garbage collector's thresholds for the control plane's processes.

A policy round allocates a few objects per job (its outcome, shares, a closure for the detail), a
simulation keeps every event, and the plan book caches hundreds of thousands of best plans. With
CPython's default thresholds (700 allocations per young collection, 10 young per middle one, 10 middle
per full one) the collector walks that heap over and over. On 6 simulated hours of a PAI-shaped day
(`bench/pai_day.py`'s rows, 80x8) the policy took 25.2 and 26.6 s with the defaults and 23.0 and 21.9 s
with these, about what it takes with the collector off. The young threshold stays modest: at 100,000
the first round of a small cluster (`bench/policy_round.py`, 64 GPUs) took 40% longer, its young
collections walking objects no longer in the CPU's caches. Reference cycles are still collected, less
often; every other object goes when its last reference does, which no threshold affects.

A batch run (a simulation, a replay check) pauses the collector from start to end (`pausing`), and the
`rubick` commands that run one leave it off to the exit (`controlplane.cli.BATCH`). Such a run
makes no reference cycles: with `gc.DEBUG_SAVEALL`, the whole 10x trace leaves none past the imports' (811
objects), where the policy engine's keys once made one per finished job (95,154 objects). So the collector
finds nothing there; it only walks the objects that live on (every event a simulation keeps, every event a
check decodes), a few milliseconds a young collection and 70-100 ms a middle one: 0.84 s of the 10x trace
and 0.23 s of the Base trace's simulation, timed from the collector's own callbacks.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

_F = TypeVar("_F", bound=Callable)

YOUNG = 10_000
"""allocations (net of frees) of container objects between young collections (CPython's default: 700)"""
OLDER = (20, 50)
"""young collections per middle one, middle ones per full one (defaults: 10, 10)"""


def tune() -> None:
    """Raise the thresholds for this process (never lowers one set higher already)."""
    young, middle, full = gc.get_threshold()
    if young and young < YOUNG:  # 0: collection switched off by the caller
        gc.set_threshold(YOUNG, max(middle, OLDER[0]), max(full, OLDER[1]))


@contextmanager
def paused() -> Iterator[None]:
    """The collector off within (a batch run's cores at work: they make no reference cycles, see above), and on
    again after where it was on. A cycle made meanwhile (a policy of one's own may make some) is freed by the
    first collection after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def pausing(fn: _F) -> _F:
    """`fn` run with the collector paused (`paused`): a batch run's entry point, from loading to its result."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with paused():
            return fn(*args, **kwargs)
    return run  # type: ignore[return-value]
