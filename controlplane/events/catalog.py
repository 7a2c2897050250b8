"""The subject catalogue: which payload each subject carries, and at which schema version."""

from __future__ import annotations

from . import payloads as p

SUBJECTS: dict[str, tuple[type, int]] = {
    "job.submitted": (p.JobSubmitted, 1),
    "job.rejected": (p.Rejected, 1),
    "job.started": (p.JobStarted, 1),
    "job.reconfigured": (p.JobReconfigured, 1),
    "job.completed": (p.JobCompleted, 1),
    "job.failed": (p.JobFailed, 1),
    "job.preempted": (p.JobPreempted, 1),
    "job.cancel": (p.JobControl, 1),
    "job.suspend": (p.JobControl, 1),
    "job.resume": (p.JobControl, 1),
    "job.priority": (p.JobPriority, 1),
    "node.registered": (p.NodeRegistered, 1),
    "node.heartbeat": (p.NodeHeartbeat, 1),
    "node.lost": (p.NodeLost, 1),
    "metrics.iteration": (p.MetricsIteration, 1),
    "model.updated": (p.ModelUpdated, 1),
    "plan.decided": (p.PlanDecided, 1),
    "plan.pending": (p.PlanPending, 1),
    "clock.tick": (p.ClockTick, 1),
    "node.rejected": (p.Rejected, 1),
    "metrics.rejected": (p.Rejected, 1),
    "model.rejected": (p.Rejected, 1),
    "plan.rejected": (p.Rejected, 1),
    "clock.rejected": (p.Rejected, 1),
    "run.described": (p.RunDescribed, 1),
    "quota.set": (p.QuotaSet, 1),
    "quota.rejected": (p.Rejected, 1),
    "run.rejected": (p.Rejected, 1),
    "network.decided": (p.NetworkDecided, 1),
    "network.rejected": (p.Rejected, 1),
}
"""Catalogue subject -> (payload class, current schema version)."""

CONTROL = frozenset({"job.cancel", "job.suspend", "job.resume", "job.priority"})
"""An owner's requests about a job (submitters publish them; admission and the policy judge them alike)."""

REJECTED_SUFFIX = ".rejected"

STREAM_NAME = "RUBICK"
STREAM_SUBJECTS = ("job.>", "node.>", "metrics.>", "model.>", "plan.>", "clock.>", "run.>", "quota.>", "network.>")
"""One JetStream stream captures every control-plane subject (and any routing suffix)."""

NODE_SCOPED = frozenset({"job.started", "job.reconfigured", "job.completed", "job.failed", "job.preempted",
                         "node.registered", "node.heartbeat", "node.lost", "metrics.iteration", "plan.rejected"})
"""Subjects a node agent (or a training process on its node) publishes with its node id as the last part:
`job.started.<node>`. Permissions can then say which node an identity speaks for (docs/security.md), and
the cores refuse such an event when its payload speaks for another node. The bare subject stays valid for
publishers that speak for no node in particular (simulated agents, recorded logs)."""

ROUTED = frozenset({"plan.decided"}) | NODE_SCOPED
"""Subjects that may carry a suffix: `plan.decided.<node>` for routing, the node-scoped ones for identity."""


class UnknownSubject(ValueError):
    pass


def is_rejection(subject: str) -> bool:
    return subject.endswith(REJECTED_SUFFIX)


def base_subject(subject: str) -> str:
    """The catalogue subject a wire subject belongs to (strips a routing suffix).

    Raises UnknownSubject for anything outside the catalogue.
    """
    if subject in SUBJECTS:
        return subject
    for known in ROUTED:
        if subject.startswith(known + ".") and len(subject) > len(known) + 1:
            return known
    raise UnknownSubject(subject)


def subject_node(subject: str) -> str | None:
    """The node a node-scoped wire subject speaks for (`job.started.node-3` -> `node-3`), else None."""
    try:
        base = base_subject(subject)
    except UnknownSubject:
        return None
    if base not in NODE_SCOPED or subject == base:
        return None
    return subject[len(base) + 1:]


def payload_type(subject: str) -> tuple[type, int]:
    """(payload class, current version) for a wire subject."""
    return SUBJECTS[base_subject(subject)]


def rejection_subject(subject: str) -> str | None:
    """Where a refusal of a message on `subject` is published: `<namespace>.rejected`
    (`job.submitted` -> `job.rejected`, `metrics.iteration` -> `metrics.rejected`,
    `plan.decided.<node>` -> `plan.rejected`); None for a rejection itself."""
    if is_rejection(subject):
        return None
    return subject.split(".", 1)[0] + REJECTED_SUFFIX


def all_subjects() -> list[str]:
    return sorted(SUBJECTS)
