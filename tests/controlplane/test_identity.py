"""A node speaks only for itself: node-scoped subjects (`job.started.<node>`) whose payload speaks for
another node are refused by the codec, and a node's report on a job not placed on it is refused by the
state fold, answered by admission and ignored by the policy."""

from __future__ import annotations

import pytest

from controlplane.admission import AdmissionCore
from controlplane.events import (Decision, Invalid, JobCompleted, JobStarted, NodeShare, PlanDecided, decode,
                                 encode, make)
from controlplane.events.catalog import base_subject, subject_node
from controlplane.state import ClusterState

from .samples import PAYLOADS, PLAN, sample


def wire(subject: str, payload, n: int = 0):
    return encode(make(subject, payload, time=1_700_000_000.0 + n, id=f"ev-{n}", source="test"))


@pytest.mark.parametrize("base", ["node.registered", "node.heartbeat", "node.lost", "metrics.iteration",
                                  "job.started", "job.reconfigured"])
def test_payload_must_speak_for_the_subjects_node(base):
    ok = decode(wire(f"{base}.node-0", PAYLOADS[base]))  # the samples speak for node-0
    assert ok.base == base and subject_node(ok.subject) == "node-0"
    with pytest.raises(Invalid) as exc:
        decode(wire(f"{base}.node-1", PAYLOADS[base]))
    assert "node" in exc.value.reason


def test_bare_subjects_stay_valid_and_other_subjects_have_no_node():
    for base in ("job.started", "node.registered", "metrics.iteration"):
        assert decode(wire(base, PAYLOADS[base])).subject == base
    assert subject_node("plan.decided.node-0") is None
    assert subject_node("job.completed.a.b") == "a.b" and base_subject("job.completed.a.b") == "job.completed"


def placed(state_or_core, job="gpt2-0007", node="node-0"):
    decided = make("plan.decided", PlanDecided(round=1, policy="rubick", decisions=(
        Decision(job_id=job, allocation=(NodeShare(node=node, gpus=2, cpus=16, mem_gb=64.0),), plan=PLAN),)),
        time=1_700_000_010.0, id="d1", source="policy")
    (state_or_core.apply if isinstance(state_or_core, ClusterState) else state_or_core.handle)(decided)


def cluster(core=None):
    target = core if core is not None else ClusterState(known_models={"gpt2"})
    step = target.apply if isinstance(target, ClusterState) else target.handle
    step(sample("node.registered"))
    step(sample("job.submitted"))
    return target


def test_state_refuses_a_lifecycle_report_from_a_node_that_does_not_run_the_job():
    state = cluster()
    placed(state)
    forged = make("job.completed.node-9", JobCompleted(job_id="gpt2-0007", iterations=1000), time=1_700_000_020.0,
                  id="forged", source="agent-node-9")
    assert "not placed on it" in state.refusal(forged)
    state.apply(forged)
    assert state.jobs["gpt2-0007"].status == "queued"
    unknown = make("job.completed.node-0", JobCompleted(job_id="nobody", iterations=1), time=1_700_000_020.0,
                   id="u", source="agent-node-0")
    assert "not known" in state.refusal(unknown)
    honest = make("job.started.node-0", JobStarted(job_id="gpt2-0007", allocation=PAYLOADS["job.started"].allocation,
                                                   plan=PLAN), time=1_700_000_021.0, id="s", source="agent-node-0")
    assert state.refusal(honest) is None
    state.apply(honest)
    done = make("job.completed.node-0", JobCompleted(job_id="gpt2-0007", iterations=1000), time=1_700_000_030.0,
                id="c", source="agent-node-0")
    state.apply(done)
    assert state.jobs["gpt2-0007"].status == "completed"
    # the bare subject speaks for no node: not checked (recorded logs, simulated agents)
    assert state.refusal(make("job.completed", JobCompleted(job_id="nobody", iterations=1), time=1.0, id="x",
                              source="sim")) is None


def test_admission_answers_a_forged_lifecycle_report():
    core = cluster(AdmissionCore(["gpt2"]))
    placed(core)
    forged = make("job.completed.node-9", JobCompleted(job_id="gpt2-0007", iterations=1000),
                  time=1_700_000_020.0, id="forged", source="agent-node-9")
    (rej,) = core.handle(forged)
    assert rej.subject == "job.rejected" and rej.payload.subject == "job.completed.node-9"
    assert rej.payload.event_id == "forged" and rej.payload.job_id == "gpt2-0007"
    assert core.state.jobs["gpt2-0007"].status == "queued"
