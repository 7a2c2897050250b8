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


def example_trainer_core():
    """A policy where real agents run jobs without a workload on the example trainer."""
    core = core_for("rubick", hold_s=0, batch_s=0)
    core.default_support = EXAMPLE_TRAINER
    return core


def plans_for(workload):
    core = example_trainer_core()
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


def test_a_submission_whose_own_plan_its_workload_cannot_run_is_refused():
    adm = AdmissionCore(["llama7"])
    c = Clock()
    adm.handle(c.ev("node.registered", node("n0")))
    sub = replace(job("j", "llama7", 8, Plan(dp=2, tp=4), 8), workload=Workload(command=CODE))
    [rej] = adm.handle(c.ev("job.submitted", sub))
    assert (rej.payload.field, rej.payload.expected, rej.payload.got) == ("data.plan.tp", "<= 1", "4")
    assert "supports" in rej.payload.reason
    ok = replace(sub, job_id="k", workload=Workload(command=CODE, supports=PlanSupport(max_tp=4)))
    assert adm.handle(c.ev("job.submitted", ok)) == []


def test_the_example_trainer_declares_what_its_models_run_whatever_the_spec():
    """Its models have 4 heads and 2 layers at least (any model type runs as one of its sizes): TP 8 or PP 4,
    which LLaMA-7B's spec allows, would fail in the trainer, so neither the policy nor the agent offers them."""
    assert EXAMPLE_TRAINER.refusal(Plan(dp=1, tp=4)) is None
    assert EXAMPLE_TRAINER.refusal(Plan(dp=1, tp=2, pp=2, micro_batches=8)) is None
    assert EXAMPLE_TRAINER.refusal(Plan(dp=1, tp=8))[1:] == ("plan.tp", "<= 4", "8")
    assert EXAMPLE_TRAINER.refusal(Plan(dp=1, pp=4, micro_batches=8))[1] == "plan.pp"
    assert EXAMPLE_TRAINER.refusal(Plan(dp=1, tp=2, zero_stage=2))[1] == "plan.zero_stage"
    three = PlanSupport(max_tp=8, heads=6)
    assert three.refusal(Plan(tp=3)) is None and "6 attention heads" in three.refusal(Plan(tp=4))[0]
    core = example_trainer_core()
    c = Clock()
    for i in range(4):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    out = core.handle(c.ev("job.submitted", job("l7", "llama7", 16, Plan(dp=4, tp=4), 16, iters=10**5)))
    plan = decisions(out)["l7"].plan
    assert plan is not None and EXAMPLE_TRAINER.refusal(plan) is None, plan
    # LLaMA-30B needs more than TP 4 x PP 2 per replica: with the example trainer it can never run
    [rej] = core.handle(c.ev("job.submitted", job("l30", "llama30", 4, Plan(dp=4, tp=4, pp=2, micro_batches=1), 32)))
    assert rej.subject == "job.rejected" and "cannot run on any node" in rej.payload.reason
    # on a simulated cluster (no default: any plan) it runs, as the traces' jobs do
    sim = core_for("rubick", hold_s=0, batch_s=0)
    for i in range(4):
        sim.handle(c.ev("node.registered", node(f"n{i}")))
    out = sim.handle(c.ev("job.submitted", job("l30", "llama30", 4, Plan(dp=4, tp=4, pp=2, micro_batches=1), 32)))
    assert decisions(out)["l30"].allocation
