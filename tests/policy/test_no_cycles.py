"""A finished job's round records go by reference counting alone (real policy core, measured-table oracle).

A simulation and a replay check pause the garbage collector while the cores run (`controlplane.gc_tuning.paused`),
which is sound only while the cores make no reference cycles: a record that a cycle kept would stay in memory for
the whole run. The engine's queue and sleepers' keys hold their record, and the record its keys; the keys are let
go of when the job is gone."""

from __future__ import annotations

import gc

from controlplane.events import Plan
from controlplane.gc_tuning import paused
from policy.records import _Job

from .helpers import Clock, completed, decisions, job, node
from .test_guarantees import core_for


def _records(job_ids: set[str]) -> list[str]:
    """The ids of the live round records of `job_ids` (the collector tracks them whether it runs or not)."""
    return sorted(o.id for o in gc.get_objects() if type(o) is _Job and o.id in job_ids)


def test_records_of_finished_jobs_are_freed_with_the_collector_paused():
    gc.collect()
    with paused():
        core = core_for("rubick", hold_s=0, batch_s=0)
        c = Clock()
        core.handle(c.ev("node.registered", node("n0", gpus=4)))
        ids = [f"j{i}" for i in range(8)]
        for job_id in ids:  # two GPUs each on four: most of them wait, asleep (their keys listed)
            core.handle(c.ev("job.submitted", job(job_id, "bert", 32, Plan(dp=2), 2)))
        waiting = {j.job_id for j in core.state.jobs.values() if not j.decided_allocation}
        assert len(waiting) >= 4, "the test needs jobs asleep in the queue"
        assert _records(waiting) == sorted(waiting)  # the engine holds a record of each while it waits
        done: set[str] = set()
        while len(done) < len(ids):
            running = sorted(j.job_id for j in core.state.jobs.values()
                             if j.decided_allocation and j.job_id not in done)
            assert running, "the queue stalled"
            out = core.handle(c.ev("job.completed", completed(running[0])))
            done.add(running[0])
            assert running[0] not in decisions(out)
            assert _records(done) == [], "a finished job's record is still alive: only the collector would free it"
        assert gc.isenabled() is False


def test_paused_switches_the_collector_off_within_and_back_as_it_was():
    assert gc.isenabled()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "an inner pause switched the collector on within an outer one"
    assert gc.isenabled()
    gc.disable()
    try:
        with paused():
            pass
        assert not gc.isenabled(), "a pause switched on a collector its caller had switched off"
    finally:
        gc.enable()
    try:
        with paused():
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.isenabled(), "an error within left the collector off"


def test_pausing_runs_a_function_with_the_collector_off():
    from controlplane.gc_tuning import pausing

    @pausing
    def batch(x, *, y):
        """a batch run"""
        return gc.isenabled(), x + y

    assert batch(1, y=2) == (False, 3)
    assert gc.isenabled()
    assert batch.__doc__ == "a batch run" and batch.__name__ == "batch"
