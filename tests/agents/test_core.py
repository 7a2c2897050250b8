"""The agent core alone (pure): decisions in, actions and lifecycle events out."""

from __future__ import annotations

from controlplane.events import (Decision, JobSubmitted, ModelRef, NodeRegistered, NodeShare, Plan, PlanDecided,
                                 Resources, make)
from agents.core import AgentCore, Exited, FirstIteration, Found, Kill, Launch, Started, Stop
from agents.node import NodeCapacity

NODE = NodeCapacity(node="n0", gpus=2, cpus=4, mem_gb=16.0, cpu_devices=True)
DP2 = Plan(dp=2, zero_stage=2)
OFF = Plan(dp=1, zero_stage=2, offload=True, ga_steps=2)


def ev(subject, payload, t=1.0, id=None):
    return make(subject, payload, time=t, id=id or f"{subject}-{t}", source="test")


def submitted(job_id="j1", gbs=8):
    return ev("job.submitted", JobSubmitted(job_id=job_id, tenant="t", guaranteed=True, model=ModelRef(type="gpt2"),
                                            global_batch_size=gbs, plan=DP2, resources=Resources(gpus=2),
                                            target_iterations=100), id=f"sub-{job_id}")


def decided(*decisions, t=2.0, subject="plan.decided", round=1):
    return ev(subject, PlanDecided(round=round, policy="test", decisions=tuple(decisions)), t, id=f"plan-{t}")


def place(job_id="j1", plan=DP2, gpus=2, cpus=0, node="n0", mem=0.0):
    return Decision(job_id=job_id, allocation=(NodeShare(node=node, gpus=gpus, cpus=cpus, mem_gb=mem),), plan=plan)


def core_with_job(*jobs):
    core = AgentCore(NODE)
    core.handle(ev("node.registered", NodeRegistered(node="n0", gpus=2, gpu_mem_gb=0, cpus=4, mem_gb=16.0)))
    for j in jobs or ("j1",):
        core.handle(submitted(j))
    return core


def running(core, job_id="j1", plan=DP2, gpus=2, cpus=0):
    assert core.handle(decided(place(job_id, plan, gpus, cpus))) == []
    (launch,) = core.take_actions()
    out = core.observe(Started(job_id, launch.attempt, 3.0))
    assert [e.subject for e in out] == ["job.started.n0"]
    return launch


def test_decision_launches_and_started_reports_plan_and_allocation():
    core = core_with_job()
    core.handle(decided(place(cpus=2)))
    (launch,) = core.take_actions()
    assert isinstance(launch, Launch)
    assert (launch.plan, launch.attempt, launch.devices, launch.cpu_cores) == (DP2, 1, (0, 1), (0, 1))
    (started,) = core.observe(Started("j1", 1, 3.0))
    assert started.payload.plan == DP2 and started.payload.allocation == place(cpus=2).allocation
    assert core.running_jobs() == ("j1",)


def test_plan_change_is_checkpoint_relaunch_resume_with_measured_cost():
    core = core_with_job()
    running(core)
    assert core.handle(decided(place(plan=OFF, gpus=1), t=10.0)) == []
    (stop,) = core.take_actions()
    assert isinstance(stop, Stop) and stop.reason == "reconfigure"
    assert core.observe(Exited("j1", 1, 12.0, 0, "checkpointed", 40)) == []
    (launch,) = core.take_actions()
    assert (launch.plan, launch.attempt, launch.devices) == (OFF, 2, (0,))
    assert core.observe(Started("j1", 2, 12.5)) == []  # not a new start: a reconfiguration
    (reconf,) = core.observe(FirstIteration("j1", 2, 19.0))
    assert reconf.subject == "job.reconfigured.n0" and reconf.payload.plan == OFF
    assert reconf.payload.restart_cost_s == 9.0
    (done,) = core.observe(Exited("j1", 2, 30.0, 0, "completed", 100))
    assert done.subject == "job.completed.n0" and done.payload.iterations == 100 and core.running_jobs() == ()


def test_same_decision_again_changes_nothing():
    core = core_with_job()
    running(core)
    assert core.handle(decided(place(), t=5.0)) == [] and core.take_actions() == []


def test_withdrawn_allocation_preempts_after_checkpoint():
    core = core_with_job()
    running(core)
    core.handle(decided(Decision(job_id="j1", allocation=(), reason="shrink"), t=5.0))
    (stop,) = core.take_actions()
    assert isinstance(stop, Stop)
    (pre,) = core.observe(Exited("j1", 1, 7.0, 0, "checkpointed", 33))
    assert pre.subject == "job.preempted.n0" and pre.payload.iterations_done == 33 and core.running_jobs() == ()


def test_crash_fails_the_job_with_code_and_log_and_releases_devices():
    core = core_with_job("j1", "j2")
    running(core)
    (failed,) = core.observe(Exited("j1", 1, 8.0, 1, "running", 5, "Signal 9 (SIGKILL) received"))
    assert failed.subject == "job.failed.n0" and failed.payload.exit_code == 1
    assert "SIGKILL" in failed.payload.log_tail and "code 1" in failed.payload.reason
    assert isinstance(core.take_actions()[0], Kill)
    launch = running(core, "j2")  # both devices are free again
    assert launch.devices == (0, 1)


def rejections(out):
    assert all(e.subject == "plan.rejected.n0" for e in out)
    return [e.payload for e in out]


def test_bad_decisions_are_refused_with_reasons_and_nothing_starts():
    core = core_with_job()
    cases = {
        "unknown job": place(job_id="nobody"),
        "more devices than the node has": place(plan=Plan(dp=3), gpus=3),
        "more CPU cores than the node has": place(cpus=64),
        "more host memory than the node has": place(mem=1e6),
        "plan dp*tp*pp must equal the allocated devices": place(plan=Plan(dp=1), gpus=2),
        "only without tensor or pipeline parallelism": place(plan=Plan(tp=2, zero_stage=2)),
        "global batch": place(plan=Plan(dp=1, ga_steps=3), gpus=1),
        "an allocation needs a plan": Decision(job_id="j1", allocation=(NodeShare(node="n0", gpus=2),)),
        "unknown node": Decision(job_id="j1", allocation=(NodeShare(node="n0", gpus=1), NodeShare(node="ghost", gpus=1)),
                                 plan=DP2),
    }
    for i, (why, d) in enumerate(cases.items()):
        (rej,) = rejections(core.handle(decided(d, t=2.0 + i)))
        assert why in rej.reason, (why, rej.reason)
        assert rej.subject == "plan.decided" and rej.job_id == d.job_id and rej.field.startswith("data.decisions[0]")
    assert core.take_actions() == [] and core.running_jobs() == ()


def test_the_plans_a_workload_declares_are_the_plans_the_agent_runs():
    """The example trainer runs TP x PP (not with ZeRO); a workload that declares nothing runs data parallelism
    only; one that declares `max_tp: 2` runs TP 2 and no PP. The same declaration limits the policy."""
    from controlplane.events.workload import PlanSupport, Workload
    core = AgentCore(NODE)
    core.handle(ev("node.registered", NodeRegistered(node="n0", gpus=2, gpu_mem_gb=0, cpus=4, mem_gb=16.0)))
    for job_id, supports in (("dp-only", None), ("tp2", PlanSupport(max_tp=2))):
        sub = JobSubmitted(job_id=job_id, tenant="t", model=ModelRef(type="gpt2"), global_batch_size=8,
                           resources=Resources(gpus=2), target_iterations=100,
                           workload=Workload(command=("python", "train.py"), supports=supports))
        core.handle(ev("job.submitted", sub, id=f"sub-{job_id}"))
    (rej,) = rejections(core.handle(decided(place("dp-only", plan=Plan(tp=2)), t=2.0)))
    assert "tensor-parallel size" in rej.reason and rej.expected == "<= 1"
    (rej,) = rejections(core.handle(decided(place("tp2", plan=Plan(pp=2, micro_batches=2)), t=3.0)))
    assert "pipeline-parallel size" in rej.reason
    assert core.handle(decided(place("tp2", plan=Plan(tp=2)), t=4.0)) == []
    core = core_with_job()  # the example trainer: 3D runs
    assert core.handle(decided(place(plan=Plan(pp=2, micro_batches=2)), t=2.0)) == []


def test_refusal_leaves_the_running_job_alone():
    core = core_with_job("j1", "j2")
    running(core)
    (rej,) = rejections(core.handle(decided(place(job_id="j2", plan=Plan(dp=1), gpus=1), t=4.0)))
    assert "not enough free devices" in rej.reason
    (rej,) = rejections(core.handle(decided(place(plan=Plan(dp=4), gpus=4), t=5.0)))
    assert core.take_actions() == [] and core.running_jobs() == ("j1",) and core.local["j1"].plan == DP2


def test_one_round_may_shrink_one_job_and_place_another():
    core = core_with_job("j1", "j2")
    running(core)
    out = core.handle(decided(place(plan=Plan(dp=1), gpus=1), place(job_id="j2", plan=Plan(dp=1), gpus=1), t=5.0))
    assert out == []
    (stop,) = core.take_actions()  # j2 waits until j1 has let go of the devices
    assert isinstance(stop, Stop) and stop.job_id == "j1"
    core.observe(Exited("j1", 1, 7.0, 0, "checkpointed", 10))
    launches = core.take_actions()
    assert sorted(a.job.job_id for a in launches) == ["j1", "j2"]
    assert sorted(d for a in launches for d in a.devices) == [0, 1]


def test_routed_decision_for_another_node_only_is_refused():
    core = core_with_job()
    (rej,) = rejections(core.handle(decided(place(node="ghost"), subject="plan.decided.n0")))
    assert "unknown node" in rej.reason


def test_restore_learns_facts_only():
    core = core_with_job()
    core.restoring = True
    assert core.handle(decided(place())) == [] and core.take_actions() == []
    assert core.running_jobs() == ()


def found(alive, state, attempt=1):
    return Found("j1", attempt, DP2, place().allocation, (0, 1), (), alive, state, 12, "tail")


def restarted(*facts):
    core = core_with_job()
    core.restoring = True
    core.handle(decided(place()))
    for f in facts:
        core.handle(f)
    return core


def test_reconcile_adopts_a_live_job_and_starts_no_duplicate():
    core = restarted(ev("job.started", __import__("controlplane.events", fromlist=["JobStarted"]).JobStarted(
        job_id="j1", allocation=place().allocation, plan=DP2, attempt=1), 3.0))
    assert core.reconcile([found(True, "running")], 50.0) == []
    assert core.take_actions() == [] and core.running_jobs() == ("j1",)
    (done,) = core.observe(Exited("j1", 1, 60.0, None, "completed", 100))
    assert done.subject == "job.completed.n0"


def test_reconcile_reports_jobs_that_ended_or_vanished_while_away():
    core = restarted()
    (done,) = core.reconcile([found(False, "completed")], 50.0)
    assert done.subject == "job.completed.n0" and core.take_actions() == []
    from controlplane.events import JobStarted
    core = restarted(ev("job.started", JobStarted(job_id="j1", allocation=place().allocation, plan=DP2), 3.0))
    (failed,) = core.reconcile([], 50.0)
    assert failed.subject == "job.failed.n0" and "agent was down" in failed.payload.reason


def test_reconcile_launches_a_decision_never_acted_on():
    core = restarted()
    assert core.reconcile([], 50.0) == []
    (launch,) = core.take_actions()
    assert isinstance(launch, Launch) and launch.attempt == 1


def test_job_waiting_for_devices_after_its_checkpoint_is_preempted_when_taken_away():
    core = core_with_job("j1", "j2")
    running(core, "j1", Plan(dp=1), gpus=1)
    running(core, "j2", Plan(dp=1), gpus=1)
    core.handle(decided(place("j1", Plan(dp=2), gpus=2), Decision(job_id="j2", allocation=()), t=5.0))
    assert sorted(type(a).__name__ for a in core.take_actions()) == ["Stop", "Stop"]
    assert core.observe(Exited("j1", 1, 6.0, 0, "checkpointed", 17)) == []  # waits: j2 still holds a device
    assert core.take_actions() == []
    (pre,) = core.handle(decided(Decision(job_id="j1", allocation=()), t=7.0))
    assert pre.subject == "job.preempted.n0" and pre.payload.iterations_done == 17
    (pre2,) = core.observe(Exited("j2", 1, 8.0, 0, "checkpointed", 9))
    assert pre2.payload.job_id == "j2" and core.running_jobs() == () and core.take_actions() == []
