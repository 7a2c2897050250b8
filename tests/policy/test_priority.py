"""Priorities: a higher-priority job runs first and may shrink lower ones whatever the slopes, a lower one never
shrinks it, `job.priority` changes a job's priority live (refused when it cannot apply), and job specs get their
obvious defaults."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.admission import AdmissionCore
from controlplane.events import Invalid, JobSubmitted, Plan, build, decode, encode, make
from controlplane.events.payloads import JobControl, JobPriority

from .helpers import Clock, completed, job, node
from .test_guarantees import check_round, core_for

VIT = ("vit", 64, Plan(dp=8), 8)
T5 = ("t5", 16, Plan(dp=2), 2)


def gpus(core, job_id: str) -> int:
    return sum(g for g, _, _ in core.last[job_id].shares.values()) if job_id in core.last else 0


def two_jobs(prio_a: int, prio_b: int):
    core = core_for("rubick", hold_s=0, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    # long jobs: growing pays its restart (the restart rule)
    core.handle(c.ev("job.submitted", replace(job("A", *VIT, iters=10**6), priority=prio_a)))
    out = core.handle(c.ev("job.submitted", replace(job("B", *T5, iters=10**6), priority=prio_b)))
    check_round(core)
    return core, c, out


def test_equal_priorities_share_by_slope_as_algorithm_1():
    core, _, _ = two_jobs(0, 0)
    assert gpus(core, "A") == 4 and gpus(core, "B") == 4


def test_a_higher_priority_arrival_takes_the_gpus_it_can_use():
    core, _, _ = two_jobs(0, 10)
    assert gpus(core, "B") == 8 and gpus(core, "A") == 0
    assert core.state.jobs["A"].pending.reason == "no-gpus"


def test_a_lower_priority_arrival_never_shrinks_a_higher_one():
    core, _, out = two_jobs(10, 0)
    assert gpus(core, "A") == 8 and gpus(core, "B") == 0
    assert core.state.jobs["B"].pending.reason == "no-gpus"


def test_a_priority_change_applies_at_once_and_is_in_the_fold():
    core, c, _ = two_jobs(0, 0)
    out = core.handle(c.ev("job.priority", JobPriority(job_id="A", priority=50, reason="deadline")))
    assert core.state.jobs["A"].priority == 50
    assert [e.subject for e in out][0] == "plan.decided"
    assert gpus(core, "A") == 8 and gpus(core, "B") == 0, "A wants the whole node and now outranks B"
    check_round(core)
    core.handle(c.ev("job.priority", JobPriority(job_id="A", priority=-5)))
    assert gpus(core, "B") > 0 and gpus(core, "A") < 8, "A now below B: B takes back what it can use"


def test_priority_requests_that_cannot_apply_are_refused_and_change_nothing():
    adm = AdmissionCore(["vit", "t5"])
    c = Clock()
    for e in [c.ev("node.registered", node("n0")), c.ev("job.submitted", job("A", *VIT, tenant="team-a")),
              c.ev("job.submitted", job("B", *T5))]:
        adm.handle(e)
    adm.handle(c.ev("job.completed", completed("B")))
    asks = [JobPriority(job_id="nope", priority=1), JobPriority(job_id="B", priority=1),
            JobPriority(job_id="A", priority=1, tenant="team-b")]
    got = [adm.handle(c.ev("job.priority", a)) for a in asks]
    assert [(r.subject, r.payload.field, r.payload.got) for [r] in got] == [
        ("job.rejected", "data.job_id", "nope"), ("job.rejected", "data.job_id", "completed"),
        ("job.rejected", "data.tenant", "team-b")]
    assert adm.state.jobs["A"].priority == 0
    # out of range: refused by the schema, naming the field (admission's shell answers it)
    wire = encode(make("job.priority", JobPriority(job_id="A", priority=1), time=1.0, id="p", source="t"))
    import msgpack
    obj = msgpack.unpackb(wire)
    obj["data"]["priority"] = 5000
    with pytest.raises(Invalid) as err:
        decode(msgpack.packb(obj), "job.priority")
    assert (err.value.field, err.value.expected, err.value.got) == ("data.priority", "<= 1000", "5000")
    with pytest.raises(Invalid):
        build(JobControl, {"job_id": "A", "priority": 3})  # the other requests carry no priority


def test_job_specs_get_the_obvious_defaults():
    base = {"job_id": "j", "tenant": "t", "model": {"type": "bert"}, "global_batch_size": 32, "target_iterations": 10}
    only_gpus = build(JobSubmitted, {**base, "resources": {"gpus": 4}})
    assert only_gpus.guaranteed is False and only_gpus.priority == 0
    assert only_gpus.plan == Plan(dp=4), "no plan: data parallel over the requested GPUs"
    only_plan = build(JobSubmitted, {**base, "plan": {"dp": 2, "tp": 2}})
    assert only_plan.resources.gpus == 4 and only_plan.resources.cpus == 0
    with pytest.raises(Invalid) as err:
        build(JobSubmitted, base)
    assert err.value.field == "resources" and "resources" in err.value.reason
    with pytest.raises(Invalid) as err:  # the default plan must still split the batch
        build(JobSubmitted, {**base, "global_batch_size": 30, "resources": {"gpus": 4}})
    assert err.value.field == "global_batch_size"
