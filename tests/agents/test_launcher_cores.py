"""The local launcher pins a job's processes to the CPUs of its share: the agent's core numbers map onto the
CPUs this machine lets it use, wrapping around when the agent offers more cores than there are (`--cpus`)."""

from __future__ import annotations

import os

from agents.launcher import machine_cores


def test_core_numbers_map_onto_usable_cpus_and_wrap_around():
    usable = sorted(os.sched_getaffinity(0))
    n = len(usable)
    assert machine_cores(range(n)) == set(usable)
    assert machine_cores([n, n + 1]) == {usable[0], usable[1 % n]}, "an offer past the machine's CPUs wraps"
    assert machine_cores([]) == set()
    assert machine_cores([10 * n + 3]) <= set(usable)
