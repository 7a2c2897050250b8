"""The plan features a job's training code declares (`workload.supports`) limit the policy's plan space: it
never decides a plan the code cannot run, the agent's check reads the same declaration, and a submission
whose own plan its code cannot run is refused."""

from __future__ import annotations

from dataclasses import replace

from controlplane.admission import AdmissionCore
from controlplane.events import Plan
from controlplane.events.workload import EXAMPLE_TRAINER, PlanSupport, Workload

from .helpers import Clock, decisions, job, node
from .test_guarantees import core_for

CODE = ("python", "train.py")


def plans_for(workload):
    core = core_for("rubick", hold_s=0, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0")))
    out = core.handle(c.ev("job.submitted", replace(job("j", "llama7", 8, Plan(dp=8, zero_stage=2), 8, iters=10**5),
                                                    workload=workload)))
    return decisions(out)["j"].plan


def test_the_example_trainer_gets_3d_plans_and_a_dp_only_workload_never_does():
    assert plans_for(None).tp > 1, "llama7 on one 8-GPU node: the best plan is 3D for the example trainer"
    dp_only = plans_for(Workload(command=CODE))
    assert (dp_only.tp, dp_only.pp) == (1, 1)
    tp2 = plans_for(Workload(command=CODE, supports=PlanSupport(max_tp=2, max_pp=1)))
    assert tp2.tp <= 2 and tp2.pp == 1
    for plan in (plans_for(None), dp_only, tp2):  # what the agent would say of each: nothing against it
        assert EXAMPLE_TRAINER.refusal(plan) is None


def test_a_submission_whose_own_plan_its_code_cannot_run_is_refused():
    adm = AdmissionCore(["llama7"])
    c = Clock()
    adm.handle(c.ev("node.registered", node("n0")))
    sub = replace(job("j", "llama7", 8, Plan(dp=2, tp=4), 8), workload=Workload(command=CODE))
    [rej] = adm.handle(c.ev("job.submitted", sub))
    assert (rej.payload.field, rej.payload.expected, rej.payload.got) == ("data.plan.tp", "<= 1", "4")
    assert "supports" in rej.payload.reason
    ok = replace(sub, job_id="k", workload=Workload(command=CODE, supports=PlanSupport(max_tp=4)))
    assert adm.handle(c.ev("job.submitted", ok)) == []
