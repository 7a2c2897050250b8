"""Host memory a decision gave a job stays its own in later rounds (real policy core, measured-table oracle).

A job that keeps its GPUs keeps its memory: the round that does not re-decide it must neither publish it again
with no memory (the agents would restart it to apply that) nor hand the memory to another job on its node."""

from __future__ import annotations

from dataclasses import replace

from controlplane.events import Plan, Resources

from .helpers import Clock, completed, decisions, job, node
from .test_guarantees import core_for
from .test_pending import reasons


def _asking(job_id: str, gpus: int, mem_gb: float):
    return replace(job(job_id, "bert", 32, Plan(dp=1), gpus), resources=Resources(gpus=gpus, cpus=8 * gpus, mem_gb=mem_gb))


def test_a_kept_job_keeps_its_memory_and_no_other_job_gets_it():
    core = core_for("rubick-e", hold_s=0, batch_s=0)  # exactly the request: one GPU each
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", mem_gb=100.0)))
    first = core.handle(c.ev("job.submitted", _asking("a", 1, 60.0)))
    a = decisions(first)["a"]
    assert [(s.node, s.gpus, s.mem_gb) for s in a.allocation] == [("n0", 1, 60.0)]
    # a second job asking as much: 40 GB are left on the only node, so it waits; the first is not touched
    second = core.handle(c.ev("job.submitted", _asking("b", 1, 60.0)))
    assert "a" not in decisions(second), "a round that keeps a's GPUs published it again"
    assert "b" not in decisions(second), "b was given memory a holds"
    assert reasons(second)["b"].reason == "no-fit"
    assert sum(s.mem_gb for s in core.state.jobs["a"].decided_allocation) == 60.0
    # a third that fits in what is left starts beside it
    third = core.handle(c.ev("job.submitted", _asking("c", 1, 40.0)))
    assert [(s.node, s.mem_gb) for s in decisions(third)["c"].allocation] == [("n0", 40.0)]
    assert "a" not in decisions(third)


def test_memory_is_freed_with_the_job_that_held_it():
    core = core_for("rubick-e", hold_s=0, batch_s=0)  # exactly the request: one GPU each
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", mem_gb=100.0)))
    core.handle(c.ev("job.submitted", _asking("a", 1, 60.0)))
    core.handle(c.ev("job.submitted", _asking("b", 1, 60.0)))
    out = core.handle(c.ev("job.completed", completed("a")))
    assert [(s.node, s.mem_gb) for s in decisions(out)["b"].allocation] == [("n0", 60.0)]


def test_a_job_taken_off_a_node_leaves_its_memory_to_the_job_that_took_its_gpus():
    """One GPU and 100 GB: a higher-priority job preempts the one there in the same round, so the 60 GB it
    held are free again for the newcomer (held back, the newcomer would not fit: 40 GB left)."""
    core = core_for("rubick", hold_s=0, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", gpus=1, cpus=16, mem_gb=100.0)))
    core.handle(c.ev("job.submitted", _asking("low", 1, 60.0)))
    assert [(s.node, s.mem_gb) for s in core.state.jobs["low"].decided_allocation] == [("n0", 60.0)]
    out = core.handle(c.ev("job.submitted", replace(_asking("high", 1, 60.0), priority=10)))
    got = decisions(out)
    assert got["low"].allocation == () and got["low"].reason == "preempted"
    assert [(s.node, s.gpus, s.mem_gb) for s in got["high"].allocation] == [("n0", 1, 60.0)]
