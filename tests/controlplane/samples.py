"""One valid example payload per subject, built from the schema's own examples."""

from __future__ import annotations

from controlplane.events import (ClockTick, Decision, JobCompleted, JobFailed, JobPreempted, JobReconfigured,
                                 JobStarted, JobSubmitted, MetricsIteration, ModelRef, ModelSpec, ModelUpdated,
                                 NodeHeartbeat, NodeLost, NodeRegistered, NodeShare, Plan, PlanDecided, Rejected,
                                 Resources, make)
from controlplane.events.payloads import (JobControl, JobNetwork, JobPriority, ModelDescription, NetworkDecided,
                                          Pending, PlanPending, QuotaSet, RunDescribed)

PLAN = Plan(dp=2, zero_stage=2, ga_steps=2)
ALLOC = (NodeShare(node="node-0", gpus=2, cpus=16, mem_gb=64.0),)

PAYLOADS = {
    "job.submitted": JobSubmitted(job_id="gpt2-0007", tenant="team-a", guaranteed=True, model=ModelRef(type="gpt2"),
                                  global_batch_size=16, plan=PLAN, resources=Resources(gpus=2, cpus=16, mem_gb=64.0),
                                  target_iterations=1000),
    "job.rejected": Rejected(subject="job.submitted", reason="job id reused", field="job_id",
                             expected="an id never used before", got="gpt2-0007", event_id="sub-1", job_id="gpt2-0007"),
    "job.started": JobStarted(job_id="gpt2-0007", allocation=ALLOC, plan=PLAN),
    "job.reconfigured": JobReconfigured(job_id="gpt2-0007", allocation=ALLOC, plan=Plan(dp=1, tp=2),
                                        restart_cost_s=71.5),
    "job.completed": JobCompleted(job_id="gpt2-0007", iterations=1000),
    "job.failed": JobFailed(job_id="gpt2-0007", reason="exit code 137", exit_code=137, log_tail="Killed"),
    "job.preempted": JobPreempted(job_id="gpt2-0007", reason="shrunk to zero", iterations_done=420),
    "job.cancel": JobControl(job_id="gpt2-0007", tenant="team-a", reason="wrong dataset"),
    "job.suspend": JobControl(job_id="gpt2-0007", tenant="team-a", reason="make room for a deadline"),
    "job.resume": JobControl(job_id="gpt2-0007", tenant="team-a"),
    "job.priority": JobPriority(job_id="gpt2-0007", priority=100, tenant="team-a", reason="deadline moved up"),
    "quota.set": QuotaSet(tenant="team-a", gpus=32, new_tenant=True, reason="quarterly plan"),
    "node.registered": NodeRegistered(node="node-0", gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0,
                                      gpu_type="A800-80GB", nvlink_gbps=400.0, pcie_gbps=32.0, network_gbps=100.0),
    "node.heartbeat": NodeHeartbeat(node="node-0", jobs=("gpt2-0007",)),
    "node.lost": NodeLost(node="node-0", reason="no heartbeat for 30 s"),
    "metrics.iteration": MetricsIteration(job_id="gpt2-0007", model_type="gpt2", iteration=41, iter_time_s=1.05,
                                          plan=PLAN, gpus_per_node=(2,), node="node-0", cpus_per_gpu=8,
                                          fwd_s=0.3, bwd_s=0.6, opt_s=0.15),
    "model.updated": ModelUpdated(model_type="gpt2", version=3, n_points=12, rmsle=0.031,
                                  params={"k_bwd": 2.0, "k_sync": 1.5, "k_opt": 0.01, "k_opt_off": 0.2,
                                          "k_off": 1.2, "k_swap": 1.1, "k_const": 5.0}),
    "plan.decided": PlanDecided(round=17, policy="rubick", decisions=(
        Decision(job_id="gpt2-0007", allocation=ALLOC, plan=PLAN, predicted_throughput=15.2, reason="slope",
                 detail={"gpu_slope": "0.31"}),
        Decision(job_id="bert-0002", allocation=(), plan=None, reason="preempted",
                 detail={"shrunk_by": "gpt2-0007"}))),
    "plan.pending": PlanPending(round=17, policy="rubick", pending=(
        Pending(job_id="bert-0002", reason="quota", gpus=0, needs_gpus=2, detail={"quota": "16", "quota_used": "16"}),
        Pending(job_id="vit-0003", reason="no-fit", gpus=0, needs_gpus=4)), cleared=("gpt2-0007",)),
    "network.decided": NetworkDecided(mode="echelonflow", round=3, classes=4, decisions=(
        JobNetwork(job_id="gpt2-0007", traffic_class=0, rank=0, bytes_per_iteration=6.2e9, tardiness_s=0.15),
        JobNetwork(job_id="bert-0002", traffic_class=1, rank=1, bytes_per_iteration=1.3e9, tardiness_s=0.4)),
        cleared=("vit-0003",)),
    "clock.tick": ClockTick(seq=120, period_s=60.0),
    "run.described": RunDescribed(
        service="policy", policy="rubick", restart_cost_s=78.0, batch_s=60.0, refit_min_gain=0.1,
        models=(ModelDescription(spec=ModelSpec(name="gpt2", num_params=1_557_686_400, num_layers=48, hidden_size=1600,
                                                num_heads=25, seq_len=1024, global_batch_size=32, fwd_time_s=0.21),
                                 vocab_size=50257, b_pcie_gbps=0.96),),
        params={"gpt2": {"k_bwd": 2.0, "k_const": 0.005}}, quotas={"team-a": 16}, network="echelonflow",
        network_classes=4),
}

NEW_SPEC = ModelSpec(name="my-gpt", num_params=354_823_168, num_layers=24, hidden_size=1024, num_heads=16,
                     seq_len=1024, global_batch_size=32)


def sample(subject: str, n: int = 0, time: float = 1_700_000_000.0):
    return make(subject, PAYLOADS[subject], time=time + n, id=f"ev-{subject}-{n}", source="test")
