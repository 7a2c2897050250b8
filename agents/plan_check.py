"""Can this node run this decision? Pure checks, each refusal with (reason, field, expected, got)."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.events import Decision, NodeShare
from controlplane.events.workload import PlanSupport, Workload, support_of

from .node import NodeCapacity

Refusal = tuple[str, str, str, str]


@dataclass(frozen=True)
class JobInfo:
    """What the agent keeps of a `job.submitted`."""

    job_id: str
    model_type: str
    global_batch_size: int
    target_iterations: int
    workload: Workload | None = None
    """The job's own training code; None: the example trainer."""


def share_in(allocation: tuple[NodeShare, ...], node: str) -> NodeShare | None:
    """This node's part of an allocation (None when it has no devices here)."""
    for s in allocation:
        if s.node == node and s.gpus > 0:
            return s
    return None


def share_of(decision: Decision, node: str) -> NodeShare | None:
    return share_in(decision.allocation, node)


def check_decision(d: Decision, job: JobInfo, cap: NodeCapacity, support: PlanSupport | None = None) -> Refusal | None:
    """Refusal of one decision that places `job` on this node, judged alone (capacity shared with the
    node's other jobs is the core's business). `support`: what the job's training code runs (by default
    what its workload declares, `support_of`, which the policy's plan enumeration reads too)."""
    share = share_of(d, cap.node)
    assert share is not None
    plan = d.plan
    if plan is None:
        return ("an allocation needs a plan", "plan", "an execution plan", "nil")
    nodes = [s.node for s in d.allocation]
    if len(nodes) != len(set(nodes)):
        return ("a node appears twice in the allocation", "allocation", "each node once", ", ".join(nodes))
    if share.gpus > cap.gpus:
        return ("more devices than the node has", "allocation.gpus", f"<= {cap.gpus}", str(share.gpus))
    if share.cpus > cap.cpus:
        return ("more CPU cores than the node has", "allocation.cpus", f"<= {cap.cpus}", str(share.cpus))
    if share.mem_gb > cap.mem_gb:
        return ("more host memory than the node has", "allocation.mem_gb", f"<= {cap.mem_gb:g}",
                f"{share.mem_gb:g}")
    total = sum(s.gpus for s in d.allocation)
    if plan.gpus != total:
        return ("plan dp*tp*pp must equal the allocated devices", "plan", f"{total} devices",
                f"dp*tp*pp = {plan.gpus}")
    refused = (support or support_of(job.workload)).refusal(plan)
    if refused is not None:
        return refused
    per_step = plan.dp * plan.ga_steps
    if job.global_batch_size % per_step:
        return ("the global batch does not split into dp*ga_steps equal micro-batches", "plan.ga_steps",
                f"dp*ga_steps dividing {job.global_batch_size}", str(per_step))
    if len({s.gpus for s in d.allocation if s.gpus > 0}) > 1:
        return ("every node of a job must run the same number of processes", "allocation.gpus",
                "equal counts", ", ".join(str(s.gpus) for s in d.allocation))
    return None
