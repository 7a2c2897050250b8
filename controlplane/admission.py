"""Admission: the core that answers refused submissions with `job.rejected`.

It folds the cluster state and applies `ClusterState.check_submission` (job id
reused, unknown model type, more resources than the cluster has, TP wider than
any node), and a node's report on a job that is not placed on that node
(`ClusterState.refusal`), and an owner's request that cannot apply (`job.cancel`, `job.suspend`,
`job.resume`, `job.priority` of an unknown, finished or other tenant's job: `ClusterState.control_refusal`);
schema-level problems never reach it, the shell answers those.
"""

from __future__ import annotations

from typing import Iterable

from .events import Event, Rejected, make
from .events.catalog import CONTROL
from .state import ClusterState


class AdmissionCore:
    name = "admission"
    subjects = (">",)

    def __init__(self, known_models: Iterable[str] = ()) -> None:
        self.state = ClusterState(known_models=set(known_models))

    def handle(self, event: Event) -> list[Event]:
        out: list[Event] = []
        if event.base == "job.submitted":
            sub = event.payload
            verdict = self.state.check_submission(sub)
            if verdict is not None:
                reason, field, expected, got = verdict
                out.append(make("job.rejected", Rejected(
                    subject="job.submitted", reason=reason, field=f"data.{field}", expected=expected, got=got,
                    event_id=event.id, job_id=sub.job_id), time=event.time, id=f"rej-{event.id}",
                    source=self.name))
        if event.base == "quota.set":
            verdict = self.state.quota_refusal(event.payload)
            if verdict is not None:
                reason, field, expected, got = verdict
                out.append(make("quota.rejected", Rejected(
                    subject=event.subject, reason=reason, field=field, expected=expected, got=got,
                    event_id=event.id), time=event.time, id=f"rej-{event.id}", source=self.name))
        control = self.state.control_refusal(event) if event.base in CONTROL else None
        if control is not None:
            reason, field, expected, got = control
            out.append(make("job.rejected", Rejected(
                subject=event.subject, reason=reason, field=f"data.{field}", expected=expected, got=got,
                event_id=event.id, job_id=event.payload.job_id), time=event.time, id=f"rej-{event.id}",
                source=self.name))
        refusal = self.state.refusal(event) if control is None and event.base not in CONTROL else None
        if refusal is not None:
            out.append(make("job.rejected", Rejected(
                subject=event.subject, reason=refusal, field="subject", expected="a node the job is placed on",
                got=event.subject, event_id=event.id, job_id=event.payload.job_id), time=event.time,
                id=f"rej-{event.id}", source=self.name))
        self.state.apply(event, control is None and refusal is None)  # found not refused just now: not asked again
        return out
