"""`rubick status`: the cluster state folded from the event log, or live from the stream."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ..bus.nats import JetStreamBus
from ..eventlog import events as log_events
from ..events import Invalid, decode
from ..models import builtin_model_types
from ..pending import short as pending_words
from ..state import ClusterState, fold
from ..auth import AuthError, Identity
from .common import add_nats_args, credentials_for, fail, nats_url_for_client
from ..bus.nats import redact_url


def register(sub) -> None:
    p = sub.add_parser("status", help="nodes, jobs, allocations and plans (from the log or live)")
    p.add_argument("--log", type=Path, help="fold this event-log folder instead of the live stream")
    add_nats_args(p)
    p.set_defaults(func=run)


async def live_events(url: str, credentials=None, end_seq: int | None = None) -> list:
    """Every decodable event in the running deployment's stream, in order (what `status` folds and
    `explain` feeds to a policy core); up to sequence `end_seq` where given."""
    bus = await JetStreamBus.connect(url, name="rubick-status", create_stream=False, credentials=credentials)
    try:
        out = []
        async for d in bus.read((">",), end_seq=end_seq):
            try:
                out.append(decode(d.data, d.subject))
            except Invalid:
                continue
        return out
    finally:
        await bus.close()


async def live_state(url: str, credentials=None, end_seq: int | None = None) -> ClusterState:
    state = ClusterState(known_models=set(builtin_model_types()))
    for e in await live_events(url, credentials, end_seq):
        state.apply(e)
    return state


WHY = {"queued": "waiting for GPUs", "preempted": "its GPUs went to other jobs", "shrunk": "shrunk for another job",
       "node-lost": "its node was lost", "suspended": "suspended by its owner", "cancelled": "cancelled by its owner"}


def waiting_reason(job) -> str:
    """Why a job waits or was cut back, from the policy's latest decision about it ('' when it runs as decided)."""
    if job.status in ("completed", "failed"):
        return ""
    if job.status in ("suspended", "cancelled"):
        return WHY[job.status]
    reason = job.decision_reason
    if job.pending is not None:  # the policy's own reason, as of its latest round
        words = pending_words(job.pending)
        if job.decision_detail.get("by") and reason in ("preempted", "shrunk"):
            words += f" ({reason} for {job.decision_detail['by']})"
        return words
    if job.status == "running" and reason != "shrunk":
        return ""
    if job.decided_allocation:
        return "starting on the GPUs decided for it"
    words = WHY.get(reason, reason)
    detail = job.decision_detail
    if detail.get("quota") == "none":
        words += "; its tenant has no quota (best-effort)"
    elif detail.get("quota") == "exceeded":
        words += "; its tenant's quota is used up (best-effort)"
    if detail.get("by"):
        words += f" ({detail['by']})"
    if detail.get("guarantee"):
        words += f"; guarantee: {detail['guarantee']}"
    return words


def render(state: ClusterState) -> str:
    lines = []
    gpus, cpus, mem = state.totals()
    lines.append(f"nodes: {len(state.alive_nodes())} alive of {len(state.nodes)}; {gpus} GPUs, {cpus} CPUs, "
                 f"{mem:g} GB")
    for n in (state.nodes[k] for k in sorted(state.nodes)):
        lines.append(f"  {n.node:<16} {'up' if n.alive else 'LOST':<5} {n.gpus:>3} x {n.gpu_type or 'GPU'} "
                     f"{n.gpu_mem_gb:g} GB  {n.cpus} CPUs  {n.mem_gb:g} GB  jobs: {', '.join(n.jobs) or '-'}")
    counts = {}
    for job in state.jobs.values():
        counts[job.status] = counts.get(job.status, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none"
    lines.append(f"jobs: {summary}; {len(state.rejected)} rejected")
    for job in (state.jobs[k] for k in sorted(state.jobs)):
        plan = job.plan.code() if job.plan else (f"decided {job.decided_plan.code()}" if job.decided_plan else "-")
        where = " ".join(f"{s.node}:{s.gpus}" for s in job.allocation) or "-"
        why = waiting_reason(job)
        lines.append(f"  {job.job_id:<24} {job.status:<10} {job.model_type:<10} {job.tenant:<10} "
                     f"{'G' if job.guaranteed else 'BE'}{f' prio {job.priority}' if job.priority else ''}  "
                     f"iter {job.iterations_done}/{job.target_iterations}  "
                     f"plan {plan}  on {where}" + (f"  why: {why}" if why else ""))
    for job_id in sorted(state.rejected):
        lines.append(f"  {job_id:<24} rejected   {state.rejected[job_id]}")
    lines.append(f"last scheduling round: {state.last_round if state.last_round >= 0 else '-'}; "
                 f"events folded: {state.events}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.log:
        try:
            decoded = log_events(args.log)
        except FileNotFoundError as exc:
            return fail(str(exc))
        for path, reason in decoded.problems:
            print(f"warning: {path}: {reason}", file=sys.stderr)
        state = fold(decoded.events, known_models=builtin_model_types())
    else:
        url = nats_url_for_client(args)
        if url is None:
            return 2
        try:
            state = asyncio.run(asyncio.wait_for(live_state(url, credentials_for(args, Identity("submitter"))), 60))
        except AuthError as exc:
            return fail(str(exc), 1)
        except Exception as exc:
            return fail(f"cannot read the live stream at {redact_url(url)}: {exc}; use --log DIR for a recorded run", 1)
    print(render(state))
    return 0
