"""A run's figures (`summary.json`): JCT, makespan, SLOs, utilisation, reconfigurations.

Definitions (docs/simulate.md):

- JCT of a job = its `job.completed` time - its `job.submitted` time; average and P99 (numpy's
  linear-interpolation percentile) over completed jobs, in seconds and hours; also per class
  (guaranteed, best-effort).
- makespan = last completion - first submission.
- SLO of a guaranteed job: its JCT must not exceed the JCT it would have had running its requested
  plan on its requested GPUs from the moment it was submitted, with no queueing and no restart
  (`slo_violations_after_waiting`: those of them that waited for GPUs before their first start):
  `target_iterations * t_iter(requested plan, packed placement)`, where the packed placement fills
  whole 8-GPU nodes first (e.g. 24 GPUs = 8;8;8) or, where that was never measured, the first measured
  placement of equal nodes, plus the start cost where the run charges one (a job running as asked
  starts too). A guaranteed job that does not complete counts as a violation too.
  `slo_violations_within_quota` counts only the jobs the guarantee covers: the paper promises a
  guaranteed job its performance "as long as the quota is enough", so a job is covered when, at its
  submission, the requested GPUs of its tenant's guaranteed jobs not yet completed, its own
  included, fit in the tenant's quota (the whole cluster where no quotas are set; 0 for a tenant
  missing from them).
- GPU utilisation = GPU-seconds held by jobs / (cluster GPUs x the span from the first submission to
  the last GPU released: the makespan, or longer for a run stopped before its jobs ended), so never
  above 100%; `busy` counts only the time jobs ran (not restarting).
- plan_decided_sha256 = sha256 over every `plan.decided` message's wire bytes, in stream order,
  each preceded by its length as 8 bytes big-endian.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np

from controlplane.events import Event, JobSubmitted

from .timeline import Timeline, build

RefTime = Callable[[JobSubmitted], float]
"""Seconds one iteration takes on the job's requested plan and packed placement (inf if it cannot run)."""


def plan_stream_sha256(wire: Sequence[bytes], subjects: Sequence[str]) -> str:
    h = hashlib.sha256()
    for data, subject in zip(wire, subjects):
        if subject.startswith("plan.decided"):
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
    return h.hexdigest()


def _stats(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "avg_s": None, "p99_s": None, "avg_h": None, "p99_h": None, "median_s": None}
    a = np.asarray(values, dtype=np.float64)
    avg, p99, med = float(a.mean()), float(np.percentile(a, 99)), float(np.median(a))
    return {"n": len(values), "avg_s": avg, "p99_s": p99, "avg_h": avg / 3600, "p99_h": p99 / 3600, "median_s": med}


def within_quota(tl: Timeline, subs: dict[str, JobSubmitted], quotas: dict[str, int] | None) -> set[str]:
    """The guaranteed jobs whose tenant's quota held their request when they were submitted."""
    covered, owed = set(), []  # (tenant, GPUs, completion time or inf) of guaranteed jobs so far
    for job_id in sorted(tl.jobs, key=lambda j: (tl.jobs[j].submitted, j)):
        line = tl.jobs[job_id]
        if not line.guaranteed:
            continue
        tenant, t = subs[job_id].tenant, line.submitted
        quota = tl.total_gpus if quotas is None else int(quotas.get(tenant, 0))
        held = sum(g for ten, g, end in owed if ten == tenant and end > t)
        if held + line.requested_gpus <= quota:
            covered.add(job_id)
        owed.append((tenant, line.requested_gpus, line.end if line.status == "completed" else float("inf")))
    return covered


def summarize(events: Sequence[Event], wire: Sequence[bytes], ref_time: RefTime, *,
              extra: dict[str, Any] | None = None, timeline: Timeline | None = None,
              start_cost_s: float = 0.0, quotas: dict[str, int] | None = None) -> dict[str, Any]:
    tl = timeline or build(events)
    subs = {e.payload.job_id: e.payload for e in events if e.base == "job.submitted"}
    covered = within_quota(tl, subs, quotas)
    jobs, jct_all, jct_g, jct_b = [], [], [], []
    violations = waited = in_quota = 0
    for job_id in sorted(tl.jobs, key=lambda j: (tl.jobs[j].submitted, j)):
        line = tl.jobs[job_id]
        sub = subs[job_id]
        jct = None if line.status != "completed" else line.end - line.submitted
        ref = sub.target_iterations * ref_time(sub) + start_cost_s if line.guaranteed else None
        violated = None
        wait = (line.segments[0].start - line.submitted) if line.segments else None
        if line.guaranteed:
            violated = jct is None or jct > ref * (1 + 1e-9) + 1e-6
            violations += bool(violated)
            in_quota += bool(violated) and job_id in covered
            if violated:
                waited += bool(wait is None or wait > 0)
        if jct is not None:
            jct_all.append(jct)
            (jct_g if line.guaranteed else jct_b).append(jct)
        jobs.append({"job_id": job_id, "model": line.model, "guaranteed": line.guaranteed, "status": line.status,
                     "submitted_s": line.submitted, "end_s": line.end, "jct_s": jct, "slo_jct_s": ref,
                     "slo_violated": violated, "within_quota": job_id in covered if line.guaranteed else None,
                     "wait_s": wait, "gpus": line.requested_gpus,
                     "restarts": sum(1 for s in line.segments if s.state == "restart")})
    ends = [j["end_s"] for j in jobs if j["status"] == "completed"]
    first = min((j["submitted_s"] for j in jobs), default=0.0)
    makespan = (max(ends) - first) if ends else 0.0
    # utilisation over the whole span the jobs held GPUs in: a run stopped early (at --max-time-h) has
    # segments past its last completion, which the makespan alone would leave out of the denominator
    last = max([first + makespan] + [s.end for j in tl.jobs.values() for s in j.segments])
    held = sum(s.gpus * (s.end - s.start) for j in tl.jobs.values() for s in j.segments)
    busy = sum(s.gpus * (s.end - s.start) for j in tl.jobs.values() for s in j.segments if s.state == "run")
    denom = tl.total_gpus * (last - first)
    subjects = [e.subject for e in events]
    counts = Counter(e.base for e in events)
    status = Counter(j["status"] for j in jobs)
    out = {
        "jobs": {"submitted": len(jobs), "completed": status["completed"], "failed": status["failed"],
                 "rejected": status["rejected"], "unfinished": status["queued"]},
        "jct": _stats(jct_all),
        "guaranteed": _stats(jct_g),
        "best_effort": _stats(jct_b),
        "makespan_s": makespan,
        "makespan_h": makespan / 3600,
        "slo_violations": violations,
        "slo_violations_after_waiting": waited,
        "slo_violations_within_quota": in_quota,
        "guaranteed_within_quota": len(covered),
        "gpu_utilisation": held / denom if denom else 0.0,
        "gpu_utilisation_busy": busy / denom if denom else 0.0,
        "cluster_gpus": tl.total_gpus,
        "reconfigurations": counts["job.reconfigured"],
        "reconfiguration_cost_s": float(sum(e.payload.restart_cost_s for e in events
                                            if e.base == "job.reconfigured")),
        "preemptions": counts["job.preempted"],
        "plan_decided": counts["plan.decided"],
        "plan_decided_sha256": plan_stream_sha256(wire, subjects),
        "events": dict(sorted(counts.items())),
        "per_job": jobs,
    }
    if extra:
        out.update(extra)
    return out
