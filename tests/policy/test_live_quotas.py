"""Live quotas (`quota.set`): the policy charges a tenant's guaranteed jobs to the quota in force from the
event on, admission refuses an unknown tenant or more GPUs than the cluster has, and the same events
replay to the same decisions."""

from __future__ import annotations

import pytest

from controlplane.admission import AdmissionCore
from controlplane.events import Invalid, Plan, build, encode
from controlplane.events.payloads import QuotaSet

from .helpers import Clock, decisions, job, node, table_core

MODELS = ("gpt2", "vit")


def run(core, events):
    out = []
    for e in events:
        out += core.handle(e)
    return out


def script():
    c = Clock()
    return c, [c.ev("node.registered", node("n0")),
               c.ev("job.submitted", job("g", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, guaranteed=True))]


def test_a_quota_set_live_makes_a_tenants_guaranteed_job_guaranteed():
    core = table_core("rubick", MODELS, quotas={"team-b": 8})  # team-a starts with no quota: best-effort
    c = Clock()
    events = [c.ev("node.registered", node("n0")),
              c.ev("job.submitted", job("b", "vit", 64, Plan(dp=8), 8, tenant="team-b")),
              c.ev("job.submitted", job("g", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, guaranteed=True))]
    before = decisions(run(core, events))
    assert before["g"].detail.get("quota") == "none", "no quota: it competes as best-effort"
    assert sum(s.gpus for s in before["b"].allocation) > 0
    after = decisions(run(core, [c.ev("quota.set", QuotaSet(tenant="team-a", gpus=8))]))
    assert core.engine.quotas == {"team-a": 8, "team-b": 8} and core.state.quotas() == {"team-a": 8, "team-b": 8}
    assert "quota" not in after["g"].detail and sum(s.gpus for s in after["g"].allocation) == 8
    assert after["b"].allocation == () and after["b"].detail["by"] == "g", "the guaranteed job takes precedence"
    # `rubick status` says why b waits
    from controlplane.cli.status import render
    line = next(x for x in render(core.state).splitlines() if x.split()[:1] == ["b"])
    assert line.endswith("why: no GPUs free for its minimum of 1 GPU (preempted for g)"), line


def test_quotas_that_cannot_apply_are_refused_and_change_nothing():
    adm, core = AdmissionCore(MODELS), table_core("rubick", MODELS, quotas={"team-a": 4})
    c, events = script()
    run(adm, events)
    run(core, events)
    bad = [c.ev("quota.set", QuotaSet(tenant="team-zz", gpus=4)),
           c.ev("quota.set", QuotaSet(tenant="team-a", gpus=64))]
    refusals = [(r.subject, r.payload.reason, r.payload.field, r.payload.expected, r.payload.got)
                for r in run(adm, bad)]
    assert refusals == [
        ("quota.rejected", "unknown tenant (set new_tenant for a tenant with no job yet)", "data.tenant",
         "one of team-a", "team-zz"),
        ("quota.rejected", "more GPUs than the cluster has", "data.gpus", "<= 8", "64")]
    run(core, bad)
    assert core.engine.quotas == {"team-a": 4} and core.state.quotas() == {"team-a": 4}
    good = [c.ev("quota.set", QuotaSet(tenant="team-new", gpus=2, new_tenant=True))]
    assert run(adm, good) == []
    run(core, good)
    assert core.engine.quotas == {"team-a": 4, "team-new": 2}


def test_replaying_quota_changes_gives_the_same_decisions():
    c, events = script()
    events += [c.ev("job.submitted", job("b", "vit", 64, Plan(dp=8), 8, tenant="team-b")),
               c.ev("quota.set", QuotaSet(tenant="team-a", gpus=8)),
               c.ev("quota.set", QuotaSet(tenant="team-a", gpus=0))]
    first = [encode(e) for e in run(table_core("rubick", MODELS, quotas={}), events)]
    again = [encode(e) for e in run(table_core("rubick", MODELS, quotas={}), events)]
    assert first == again and len(first) >= 2


def test_a_quota_as_a_share_follows_the_cluster_and_is_refused_when_malformed():
    adm, core = AdmissionCore(MODELS), table_core("rubick", MODELS, quotas={"team-a": 4})
    c, events = script()  # one 8-GPU node
    run(adm, events)
    run(core, events)
    share = [c.ev("quota.set", QuotaSet(tenant="team-a", share=0.5))]
    assert run(adm, share) == []
    run(core, share)
    assert core.engine.quotas == {"team-a": 4} and core.state.quota_shares == {"team-a": 0.5}
    run(core, [c.ev("node.registered", node("n1"))])  # the cluster doubles: so does the quota
    assert core.engine.quotas == {"team-a": 8} and core.state.quotas() == {"team-a": 8}
    run(core, [c.ev("quota.set", QuotaSet(tenant="team-a", gpus=2))])  # back to a number: the share is gone
    assert core.engine.quotas == {"team-a": 2} and core.state.quota_shares == {}
    from controlplane.cli.quota import parse_quota
    assert parse_quota("25%") == (None, 0.25) and parse_quota("3") == (3, None)
    for bad in ("150%", "-1", "x%", "lots"):
        with pytest.raises(ValueError):
            parse_quota(bad)
    with pytest.raises(Invalid) as err:  # both, or neither
        build(QuotaSet, {"tenant": "team-a", "gpus": 2, "share": 0.5})
    assert err.value.field == "gpus" and err.value.got == "both"
    with pytest.raises(Invalid):
        build(QuotaSet, {"tenant": "team-a", "share": 1.5})
