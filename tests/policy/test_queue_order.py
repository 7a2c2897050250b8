"""A round's queue (`RubickEngine._sort_by_slope`) is the keys of its jobs sorted, whichever way they are gathered:
the kept keys in last round's order with the new ones put in their places one at a time (a few made again) or
sorted with them (many), or (a slope that is not a number this round or the last) the keys in the jobs' order, as a
plain sort of them gives. Rounds of random jobs, most of them placed as the last round left them, a few made again
(one in a hundred, or one in ten), some gone and some new, now and then a slope that is not a number."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

from policy.engine import _INSORT_SHARE, RubickEngine


class _Rec(SimpleNamespace):
    def up(self) -> float:
        return self.slope


def _job(rng: random.Random, n: int) -> _Rec:
    return _Rec(id=f"j{n:04d}", inp=SimpleNamespace(priority=rng.choice((0, 0, 1)), order=n),
                slope=rng.choice((0.0, -0.0, 0.5, 1.0, rng.random())), cpu=rng.choice((0.0, 0.25)),
                g=rng.randint(0, 4), carried=False, touched=False, privileged=False, reason="", queue_key=None)


def _expected(jobs: list[_Rec], keys_before: dict[str, tuple | None]) -> list[tuple]:
    """The old way: each job's key (kept, or made again), in the jobs' order, then sorted."""
    keyed = []
    for j in jobs:
        if j.carried and not j.touched:
            keyed.append(keys_before[j.id])
        elif not (j.privileged and j.g and j.reason == "guarantee"):
            keyed.append((-j.inp.priority, -j.up(), -(j.cpu if j.g else 0.0), j.inp.order, j.id, 0, j))
    keyed.sort()
    return keyed


def test_the_queue_is_the_sorted_keys_however_gathered() -> None:
    rng = random.Random(3)
    engine = SimpleNamespace(_dormant={}, _cpu_slope_up=lambda j: j.cpu)
    jobs = [_job(rng, n) for n in range(300)]
    made, from_last, unordered_rounds, one_by_one = 300, 0, 0, 0
    for round_no in range(60):
        stay = 0.99 if round_no % 2 else 0.9
        for j in jobs:
            j.carried = j.queue_key is not None and rng.random() < (0.5 if math.isnan(j.slope) else stay)
            j.touched = j.carried and rng.random() < (0.005 if round_no % 2 else 0.05)
            if not j.carried:
                j.slope = rng.choice((0.0, 0.5, rng.random()))
            j.privileged = rng.random() < 0.05
            j.reason = "guarantee" if j.privileged else ""
        nan_now = round_no % 13 == 7
        if nan_now:
            rng.choice([j for j in jobs if not j.carried]).slope = math.nan
        rng.shuffle(jobs)
        engine._awake, engine._dormant = jobs[:250], {j.id: j for j in jobs[250:]}
        before = {j.id: j.queue_key for j in jobs}
        last = getattr(engine, "_queue_last", None)
        expected = _expected(jobs, before)
        got = RubickEngine._sort_by_slope(engine)
        assert [(repr(k[:6]), k[6]) for k in got] == [(repr(k[:6]), k[6]) for k in expected], round_no
        kept = [before[j.id] for j in jobs if j.carried and not j.touched]
        if last is not None and kept and not nan_now and not engine._queue_unordered:
            from_last += 1
            one_by_one += (len(got) - len(kept)) * _INSORT_SHARE <= len(kept)
        unordered_rounds += engine._queue_unordered
        for j in jobs[:]:  # some go, some come
            if rng.random() < 0.03:
                jobs.remove(j)
        jobs += [_job(rng, made + i) for i in range(rng.randint(0, 8))]
        made += 8
    assert from_last > 30 and unordered_rounds >= 4, (from_last, unordered_rounds)
    assert 10 < one_by_one < from_last - 10, (one_by_one, from_last)
