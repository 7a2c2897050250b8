"""Why a job got its allocation and plan: curves, minimum demand, plans considered.

`explain_job(core, job_id)` reads the policy core's state (live, or rebuilt by feeding it a
recorded event log) and returns plain data; `render` turns it into text for `rubick explain`.
"""

from __future__ import annotations

import math

from controlplane.pending import sentence as pending_sentence

from .curves import knee, packed
from .plans import family


def explain_job(core, job_id: str, t: float) -> dict:
    job = core.state.jobs.get(job_id)
    if job is None:
        why = core.state.rejected.get(job_id)
        if why is not None:
            return {"job_id": job_id, "status": "rejected", "reason": why}
        raise KeyError(f"no job {job_id!r} in this cluster's events")
    inp = core.job_in(job, t)
    if inp is None:
        raise KeyError(f"job {job_id!r} has a model type the policy does not know: {job.model_type}")
    engine, book = core.engine, core.engine.book
    cpg = max(1, inp.requested_cpus // max(1, inp.requested_gpus)) if inp.requested_cpus else 4
    cpg = min(cpg, book.max_cpus_per_gpu)
    ref = engine.reference(inp)[0] if hasattr(engine, "reference") else 0.0
    curve = book.gpu_curve(inp.kind, cpg)
    cluster = sum(n.gpus for n in core.state.alive_nodes())
    if cluster > 0:  # sizes this cluster can give, not the plan book's whole range
        curve = curve[:min(len(curve), cluster + 1)]
    gpu_points = []
    last = None
    for g in range(1, len(curve)):
        b = book.best(inp.kind, packed(g, book.node_gpus), cpg)
        if b.plan is None:
            continue
        code = b.plan.code()
        if code != last or g == len(curve) - 1:
            gpu_points.append({"gpus": g, "plan": code, "samples_per_s": round(b.throughput, 4),
                               "normalised": round(b.throughput / ref, 4) if ref else None})
            last = code
    out = {
        "job_id": job_id, "status": job.status, "model": job.model_type, "tenant": job.tenant,
        "guaranteed": job.guaranteed, "requested": {"gpus": inp.requested_gpus, "cpus": inp.requested_cpus,
                                                    "plan": inp.requested_plan.code()},
        "reference_samples_per_s": round(ref, 4),
        "gpu_curve": gpu_points, "gpu_curve_knee": knee(curve), "cluster_gpus": cluster,
    }
    if job.guaranteed and hasattr(engine, "min_res") and ref > 0:
        g, c = engine.min_res(inp, ref, cpg)
        out["min_res"] = {"gpus": g, "cpus": c}
    pending = job.pending
    if pending is not None and job.status in ("queued", "running", "preempted"):
        out["pending"] = {"reason": pending.reason, "gpus": pending.gpus, "needs_gpus": pending.needs_gpus,
                          "detail": dict(pending.detail),
                          "sentence": pending_sentence(pending, getattr(engine, "restart_cost_s", None),
                                                       getattr(core, "batch_s", None))}
    alloc = tuple(s.gpus for s in job.decided_allocation if s.gpus)
    last_outcome = core.last.get(job_id)
    if last_outcome is not None:
        out["decision"] = {"reason": last_outcome.reason, "detail": dict(last_outcome.detail),
                           "plan": last_outcome.plan.code() if last_outcome.plan else None,
                           "samples_per_s": round(last_outcome.throughput, 4),
                           "allocation": {n: {"gpus": g, "cpus": c, "mem_gb": m}
                                          for n, (g, c, m) in sorted(last_outcome.shares.items())}}
    if alloc:
        cpus = [s.cpus // s.gpus for s in job.decided_allocation if s.gpus]
        acpg = max(1, min(cpus)) if cpus else cpg
        cpu_curve = book.cpu_curve(inp.kind, alloc)
        out["cpu_curve"] = [{"cpus_per_gpu": c, "samples_per_s": round(float(cpu_curve[c]), 4)}
                            for c in range(1, len(cpu_curve))]
        considered = []
        for plan, secs in sorted(book.considered(inp.kind, alloc, acpg), key=lambda x: (x[1], x[0].code())):
            considered.append({"plan": plan.code(), "family": family(plan),
                               "iter_time_s": None if not math.isfinite(secs) else round(secs, 5),
                               "samples_per_s": 0.0 if not math.isfinite(secs) or secs <= 0
                               else round(inp.kind.global_batch / secs, 4),
                               "verdict": "does not fit (memory) or unknown" if not math.isfinite(secs) else ""})
        chosen = job.decided_plan.code() if job.decided_plan else None
        for row in considered:
            if row["plan"] == chosen:
                row["verdict"] = "chosen: fastest feasible plan on this placement"
                break
        out["placement"] = list(alloc)
        out["plans_considered"] = considered
    return out


def render(info: dict) -> str:
    lines = [f"job {info['job_id']}: {info.get('status')}"]
    if info.get("status") == "rejected":
        lines.append(f"  rejected: {info['reason']}")
        return "\n".join(lines)
    r = info["requested"]
    lines.append(f"  model {info['model']}, tenant {info['tenant']}, "
                 f"{'guaranteed' if info['guaranteed'] else 'best-effort'}; asked for {r['gpus']} GPUs, "
                 f"{r['cpus']} CPUs, plan {r['plan']} -> {info['reference_samples_per_s']} samples/s (reference)")
    if "min_res" in info:
        lines.append(f"  minimum demand (min_res): {info['min_res']['gpus']} GPUs, {info['min_res']['cpus']} CPUs")
    upto = f", up to the cluster's {info['cluster_gpus']} GPUs" if info.get("cluster_gpus") else ""
    lines.append(f"  GPU sensitivity curve (best plan at each size{upto}; knee at {info['gpu_curve_knee']} GPUs):")
    for p in info["gpu_curve"]:
        lines.append(f"    {p['gpus']:>4} GPUs  {p['plan']:<28} {p['samples_per_s']:>10} samples/s"
                     f"  x{p['normalised']}")
    if "decision" in info:
        d = info["decision"]
        lines.append(f"  last decision: {decision_sentence(d)}")
    if "pending" in info:
        lines.append(f"  why it waits ({info['pending']['reason']}): {info['pending']['sentence']}")
    if "cpu_curve" in info:
        pts = ", ".join(f"{p['cpus_per_gpu']}:{p['samples_per_s']}" for p in info["cpu_curve"])
        lines.append(f"  CPU sensitivity curve at this placement (CPUs per GPU: samples/s): {pts}")
    if "plans_considered" in info:
        lines.append(f"  plans considered on placement {info['placement']}:")
        for p in info["plans_considered"]:
            t = "-" if p["iter_time_s"] is None else f"{p['iter_time_s']} s"
            lines.append(f"    {p['plan']:<28} {p['family']:<16} {t:>12} {p['samples_per_s']:>10} samples/s  {p['verdict']}")
    return "\n".join(lines)


REASONS = {
    "start": "started",
    "keep": "kept its resources",
    "guarantee": "given what its guarantee needs",
    "shrunk": "shrunk to make room for another job",
    "preempted": "preempted: its GPUs went to other jobs",
    "queued": "waiting in the queue",
    "node-lost": "its node was lost",
    "cancelled": "cancelled by its owner",
    "suspended": "suspended by its owner",
}
"""A decision's reason, in words."""

DETAILS = {
    "quota": lambda v: ("its tenant has no quota, so it runs as best-effort" if v == "none"
                        else "its tenant's quota is used up, so it runs as best-effort"),
    "guarantee": lambda v: f"guarantee: {v}",
    "shrunk": lambda v: f"it took GPUs from {v}",
    "by": lambda v: f"in favour of {v}",
    "why": lambda v: str(v),
    "slope": lambda v: f"it would gain {v} of its reference throughput per GPU more",
    "normalised": lambda v: f"it runs at {v} x its reference throughput",
}


def decision_sentence(d: dict) -> str:
    """The last decision about a job as a sentence with units: what, where, how fast, and why."""
    what = REASONS.get(d["reason"], d["reason"] or "decided")
    alloc = d.get("allocation") or {}
    if alloc:
        where = ", ".join(f"{a['gpus']} GPUs, {a['cpus']} CPUs and {a['mem_gb']:g} GB on {n}" for n, a in alloc.items())
        what += f"; runs plan {d['plan']} on {where}, predicted {d['samples_per_s']:g} samples/s"
    else:
        what += "; holds no GPUs"
    why = [DETAILS[k](v) for k, v in sorted((d.get("detail") or {}).items()) if k in DETAILS]
    return what + ("" if not why else " (" + "; ".join(why) + ")")
