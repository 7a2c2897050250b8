"""An owner's requests about a job (`job.cancel`, `job.suspend`, `job.resume`): the policy takes or gives
back the job's resources at once, admission refuses what cannot apply with the field named, the agent's
report of the processes stopping keeps the job where the owner put it, and replaying the same events
gives the same decisions byte for byte."""

from __future__ import annotations

from controlplane.admission import AdmissionCore
from controlplane.events import Plan, encode
from controlplane.events.payloads import JobControl, JobPreempted

from .helpers import Clock, completed, decisions, job, node, table_core

MODELS = ("gpt2", "vit")


def ask(subject: str, job_id: str, tenant: str | None = None) -> JobControl:
    return JobControl(job_id=job_id, tenant=tenant, reason="test")


def script():
    c = Clock()
    return c, [c.ev("node.registered", node("n0")),
               c.ev("job.submitted", job("a", "gpt2", 16, Plan(dp=4, zero_stage=2), 4)),
               c.ev("job.submitted", job("b", "vit", 64, Plan(dp=8), 8))]


def run(core, events):
    out = []
    for e in events:
        out += core.handle(e)
    return out


def test_cancel_frees_the_gpus_at_once_and_the_job_ends_cancelled():
    core = table_core("rubick", MODELS)
    c, events = script()
    run(core, events)
    held = {j: sum(s.gpus for s in core.state.jobs[j].decided_allocation) for j in ("a", "b")}
    assert held["a"] > 0 and held["a"] + held["b"] == 8, held
    out = run(core, [c.ev("job.cancel", ask("job.cancel", "a", "team-a"))])
    d = decisions(out)
    assert d["a"].allocation == () and d["a"].reason == "cancelled"
    assert core.state.jobs["a"].status == "cancelled"
    # its GPUs are free at once: a new job gets them before the agent has even stopped the processes
    d = decisions(run(core, [c.ev("job.submitted", job("c", "vit", 64, Plan(dp=4), 4))]))
    assert sum(s.gpus for s in d["c"].allocation) == held["a"], d
    # the agent stops the processes and says so: the job stays cancelled, and is never scheduled again
    run(core, [c.ev("job.preempted", JobPreempted(job_id="a", reason="cancelled", iterations_done=40))])
    assert core.state.jobs["a"].status == "cancelled" and core.state.jobs["a"].iterations_done == 40
    assert "a" not in decisions(run(core, [c.ev("job.completed", completed("b"))]))


def test_suspend_holds_and_resume_gives_back():
    core = table_core("rubick", MODELS)
    c, events = script()
    run(core, events[:2])
    assert sum(s.gpus for s in core.state.jobs["a"].decided_allocation) > 0
    d = decisions(run(core, [c.ev("job.suspend", ask("job.suspend", "a"))]))
    assert d["a"].allocation == () and d["a"].reason == "suspended"
    run(core, [c.ev("job.preempted", JobPreempted(job_id="a", reason="suspended", iterations_done=12))])
    assert core.state.jobs["a"].status == "suspended"
    from controlplane.cli.status import render
    assert any(x.split()[:1] == ["a"] and x.endswith("why: suspended by its owner") for x in render(core.state).splitlines())
    assert decisions(run(core, [c.ev("node.registered", node("n1"))])) == {}, "a suspended job gets nothing"
    d = decisions(run(core, [c.ev("job.resume", ask("job.resume", "a"))]))
    assert sum(s.gpus for s in d["a"].allocation) > 0
    assert core.state.jobs["a"].status == "queued", "it never started: back in the queue, not preempted"


def test_requests_that_cannot_apply_are_refused_naming_the_field_and_change_nothing():
    adm, core = AdmissionCore(MODELS), table_core("rubick", MODELS)
    c, events = script()
    run(adm, events)
    run(core, events)
    finished = [c.ev("job.completed", completed("b"))]
    run(adm, finished)
    run(core, finished)
    bad = [c.ev("job.cancel", ask("job.cancel", "nobody")),
           c.ev("job.cancel", ask("job.cancel", "b")),
           c.ev("job.cancel", ask("job.cancel", "a", "team-z")),
           c.ev("job.resume", ask("job.resume", "a")),
           c.ev("job.suspend", ask("job.suspend", "a")),
           c.ev("job.suspend", ask("job.suspend", "a"))]
    refusals = [r.payload for r in run(adm, bad)]
    assert [(r.reason, r.field, r.expected, r.got) for r in refusals] == [
        ("unknown job", "data.job_id", "a job submitted and accepted", "nobody"),
        ("job b is already completed", "data.job_id", "a job not yet over", "completed"),
        ("job a belongs to another tenant", "data.tenant", "team-a", "team-z"),
        ("job a is not suspended", "data.job_id", "a suspended job", "queued"),
        ("job a is already suspended", "data.job_id", "a job not suspended", "suspended"),
    ], refusals
    assert all(r.subject.startswith("job.") and r.event_id for r in refusals)
    out = run(core, bad)
    assert [d.reason for e in out for d in e.payload.decisions] == ["suspended"], "only the one that applies"


def test_replaying_the_same_requests_gives_the_same_decisions():
    c, events = script()
    events += [c.ev("job.suspend", ask("job.suspend", "a")), c.ev("job.resume", ask("job.resume", "a")),
               c.ev("job.cancel", ask("job.cancel", "b")), c.ev("job.cancel", ask("job.cancel", "b"))]
    first = [encode(e) for e in run(table_core("rubick", MODELS), events)]
    again = [encode(e) for e in run(table_core("rubick", MODELS), events)]
    assert first == again and len(first) >= 4
