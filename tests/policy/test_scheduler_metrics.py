"""The scheduler's metrics: a real policy core in the service shell, fed real events over a bus,
then read back from the Prometheus registry."""

from __future__ import annotations

import math

import pytest

from controlplane import metrics, scheduler_metrics
from controlplane.bus import MemoryBus
from controlplane.events import (JobReconfigured, JobStarted, MetricsIteration, ModelUpdated, Plan, encode, make)
from controlplane.service import ServiceShell
from tests.shells import run_until_done
from modeler.service import make_core
from policy.oracle import from_modeler
from policy.registry import make_policy

from .helpers import ALGORITHM_ONLY, completed, job, node

MODELER = make_core()


def value(name: str, **labels) -> float:
    v = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if v is None else v


def core(quotas=None, policy: str = "rubick"):
    oracle, models = from_modeler(MODELER)
    return make_policy(policy, oracle=oracle, models=models, quotas=quotas, **ALGORITHM_ONLY)


class Feed:
    """Events published on a bus, in order, with increasing times, and a shell that handles them."""

    def __init__(self, core) -> None:
        self.bus = MemoryBus()
        self.core = core
        self.t = 0.0
        self.n = 0
        self.shell: ServiceShell | None = None

    async def publish(self, subject: str, payload, dt: float = 1.0) -> None:
        self.t += dt
        self.n += 1
        e = make(subject, payload, time=self.t, id=f"sm-{self.n}", source="test")
        await self.bus.publish(subject, encode(e), e.id)

    async def run(self, shell: ServiceShell | None = None) -> ServiceShell:
        """Let a shell (this one, or a new one on the core) handle everything stored."""
        shell = shell or self.shell or ServiceShell(self.core, self.bus)
        self.shell = shell
        return await run_until_done(shell, self.bus)

    def decided(self, job_id: str):
        return self.core.state.jobs[job_id].decided_allocation


async def started(feed: Feed, job_id: str) -> None:
    j = feed.core.state.jobs[job_id]
    node = j.decided_allocation[0].node
    await feed.publish(f"job.started.{node}", JobStarted(job_id=job_id, allocation=j.decided_allocation,
                                                           plan=j.decided_plan))


def iteration(feed: Feed, job_id: str, iter_time_s: float, i: int = 0) -> MetricsIteration:
    j = feed.core.state.jobs[job_id]
    return MetricsIteration(job_id=job_id, model_type=j.model_type, iteration=i, iter_time_s=iter_time_s,
                            plan=j.decided_plan, gpus_per_node=tuple(s.gpus for s in j.decided_allocation),
                            node=j.decided_allocation[0].node, cpus_per_gpu=4)


async def test_the_shell_exports_jobs_gpus_quota_guarantees_reconfigurations_refits_and_rounds():
    a, b = "sm-alpha", "sm-beta"
    feed = Feed(core(quotas={a: 8, b: 0}))
    rounds_before = value("rubick_round_seconds_count")
    refits_before = value("rubick_model_refits_total", model_type="gpt2")
    errors_before = value("rubick_prediction_error_ratio_count", model_type="gpt2")
    await feed.publish("node.registered", node("sm-n0"))
    await feed.publish("node.registered", node("sm-n1"))
    await feed.publish("job.submitted", job("sm-g", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, guaranteed=True,
                                            tenant=a))
    await feed.publish("job.submitted", job("sm-v", "vit", 64, Plan(dp=2), 2, 16, tenant=b))
    # a guaranteed job of a tenant without quota runs as best-effort: no guarantee is counted for it
    await feed.publish("job.submitted", job("sm-x", "vit", 64, Plan(dp=2), 2, 16, guaranteed=True, tenant=b))
    shell = await feed.run()
    shell.observer.refresh_s = 0.0
    assert shell.observer is not None and shell.observer.rounds >= 3
    assert value("rubick_round_seconds_count") - rounds_before == shell.observer.rounds
    assert value("rubick_round_seconds_sum") > 0

    held = {j: sum(s.gpus for s in feed.decided(j)) for j in ("sm-g", "sm-v", "sm-x")}
    assert held["sm-g"] >= 4
    assert value("rubick_gpus_total") == 16
    assert value("rubick_gpus_allocated") == sum(held.values())
    assert value("rubick_gpus_free") == 16 - sum(held.values())
    assert value("rubick_jobs_pending", tenant=a) == 1 and value("rubick_jobs_pending", tenant=b) == 2
    waits: dict = {}
    for j in feed.core.state.jobs.values():
        if j.pending is not None:
            waits[j.tenant, j.pending.reason] = waits.get((j.tenant, j.pending.reason), 0) + 1
    for (t, r), n in waits.items():  # the pending reasons, as the policy published them
        assert value("rubick_jobs_waiting", tenant=t, reason=r) == n
    assert value("rubick_jobs_running", tenant=a) == 0
    assert value("rubick_quota_gpus", tenant=a) == 8 and value("rubick_quota_gpus", tenant=b) == 0
    assert value("rubick_quota_used_gpus", tenant=a) == held["sm-g"]
    assert value("rubick_quota_used_gpus", tenant=b) == 0
    assert value("rubick_guaranteed_jobs", tenant=a) == 1 and value("rubick_guaranteed_jobs", tenant=b) == 0
    assert value("rubick_guaranteed_behind", tenant=a) == 1  # decided, not started: it waits while owed its speed

    # started, then a first measured iteration at the predicted speed: on time, and a prediction error of ~0
    for j in ("sm-g", "sm-v", "sm-x"):
        await started(feed, j)
    g = feed.core.state.jobs["sm-g"]
    predicted = g.predicted_throughput
    await feed.publish("metrics.iteration", iteration(feed, "sm-g", 16 / predicted))
    await feed.run()
    assert value("rubick_jobs_running", tenant=a) == 1 and value("rubick_jobs_running", tenant=b) == 2
    assert value("rubick_jobs_pending", tenant=a) == 0 and value("rubick_jobs_pending", tenant=b) == 0
    assert value("rubick_guaranteed_behind", tenant=a) == 0
    assert value("rubick_prediction_error_ratio_count", model_type="gpt2") - errors_before == 1

    # it slows to half its prediction: behind its reference (the prediction error counts a configuration once)
    await feed.publish("metrics.iteration", iteration(feed, "sm-g", 2 * 16 / predicted, i=1))
    await feed.run()
    assert value("rubick_guaranteed_behind", tenant=a) == 1
    assert value("rubick_prediction_error_ratio_count", model_type="gpt2") - errors_before == 1

    # a reconfiguration with its measured restart cost, per tenant
    reconf_before = value("rubick_reconfigurations_total", tenant=a)
    cost_before = value("rubick_restart_cost_seconds_total", tenant=a)
    await feed.publish(f"job.reconfigured.{g.decided_allocation[0].node}",
                       JobReconfigured(job_id="sm-g", allocation=g.decided_allocation, plan=g.decided_plan,
                                       restart_cost_s=42.5))
    # a reconfiguration reported by a node the job is not on is refused by the fold: not counted
    await feed.publish("job.reconfigured.sm-elsewhere",
                       JobReconfigured(job_id="sm-g", allocation=g.decided_allocation, plan=g.decided_plan,
                                       restart_cost_s=99.0))
    # a refit of the model
    params = MODELER.types["gpt2"].params.as_dict()
    await feed.publish("model.updated", ModelUpdated(model_type="gpt2", version=2, params=params, n_points=12,
                                                     rmsle=0.0375))
    await feed.run()
    assert value("rubick_reconfigurations_total", tenant=a) - reconf_before == 1
    assert value("rubick_restart_cost_seconds_total", tenant=a) - cost_before == pytest.approx(42.5)
    assert value("rubick_model_refits_total", model_type="gpt2") - refits_before == 1
    assert value("rubick_model_fit_rmsle", model_type="gpt2") == pytest.approx(0.0375)

    # everything completes: the tenants' gauges drop to zero, the cluster's GPUs are free
    for j in ("sm-g", "sm-v", "sm-x"):
        node_name = feed.core.state.jobs[j].decided_allocation[0].node
        await feed.publish(f"job.completed.{node_name}", completed(j))
    await feed.run()
    for t in (a, b):
        assert value("rubick_jobs_running", tenant=t) == 0 and value("rubick_jobs_pending", tenant=t) == 0
        assert value("rubick_guaranteed_behind", tenant=t) == 0 and value("rubick_quota_used_gpus", tenant=t) == 0
    assert value("rubick_gpus_allocated") == 0 and value("rubick_gpus_free") == 16


async def test_a_restarted_shell_sets_the_gauges_from_the_rebuilt_state_and_times_no_rebuilt_round():
    a = "sm-restart"
    feed = Feed(core(quotas={a: 16}))
    await feed.publish("node.registered", node("sm-r0"))
    await feed.publish("job.submitted", job("sm-r1", "gpt2", 16, Plan(dp=4, zero_stage=2), 4, 32, guaranteed=True,
                                            tenant=a))
    await feed.publish("job.submitted", job("sm-r2", "vit", 64, Plan(dp=2), 2, 16, tenant=a))
    first = await feed.run()
    assert first.observer.rounds >= 2
    names = ("rubick_jobs_pending", "rubick_quota_used_gpus", "rubick_guaranteed_jobs")
    gauges = {n: value(n, tenant=a) for n in names}
    allocated = value("rubick_gpus_allocated")
    # wipe the gauges, as a new process starts with none, then rebuild from the stream
    for g in (metrics.JOBS_PENDING, metrics.QUOTA_USED_GPUS, metrics.GUARANTEED_JOBS):
        g.labels(a).set(-1)
    metrics.GPUS_ALLOCATED.set(-1)
    rounds = value("rubick_round_seconds_count")
    again = await feed.run(ServiceShell(core(quotas={a: 16}), feed.bus))
    assert again.restored == first.handled and again.handled == 0
    assert again.observer.rounds == 0 and value("rubick_round_seconds_count") == rounds
    assert {n: value(n, tenant=a) for n in gauges} == gauges and gauges["rubick_jobs_pending"] == 2
    assert value("rubick_gpus_allocated") == allocated > 0


async def test_tenant_labels_are_bounded(monkeypatch):
    monkeypatch.setattr(scheduler_metrics, "MAX_LABELS", 2)
    feed = Feed(core())
    await feed.publish("node.registered", node("sm-b0", gpus=8))
    # more tenants than labels; best-effort jobs too big to all start
    for i in range(4):
        await feed.publish("job.submitted", job(f"sm-b{i}", "gpt2", 16, Plan(dp=8, zero_stage=2), 8, 64,
                                                tenant=f"sm-bounded-{i}"))
    shell = await feed.run()
    assert list(shell.observer.tenants.seen) == ["sm-bounded-0", "sm-bounded-1"]
    assert value("rubick_jobs_pending", tenant="sm-bounded-2") == 0
    open_jobs = sum(value("rubick_jobs_pending", tenant=t) + value("rubick_jobs_running", tenant=t)
                    for t in ("sm-bounded-0", "sm-bounded-1", scheduler_metrics.OTHER))
    assert open_jobs >= 4  # the other tenants' jobs are under `other` (which other tests may share)


def test_the_observer_leaves_the_cores_answers_byte_for_byte_the_same():
    """Metrics are the shell's: a core observed decides exactly what an unobserved one does."""
    from .helpers import Clock

    plain, watched = core(quotas={"sm-p": 8}), core(quotas={"sm-p": 8})
    observer = scheduler_metrics.observer_for(watched)
    assert observer is not None and scheduler_metrics.observer_for(object()) is None
    clock = Clock()
    events = [clock.ev("node.registered", node("sm-p0")), clock.ev("node.registered", node("sm-p1"))]
    events += [clock.ev("job.submitted", job(f"sm-p{i}", "gpt2" if i % 2 else "vit", 16 if i % 2 else 64,
                                             Plan(dp=4, zero_stage=2) if i % 2 else Plan(dp=2), 4 if i % 2 else 2,
                                             guaranteed=i % 3 == 0, tenant="sm-p")) for i in range(6)]
    events.append(clock.ev("job.completed", completed("sm-p1")))
    for e in events:
        want = [encode(x) for x in plain.handle(e)]
        observer.before(e)
        got = watched.handle(e)
        observer.after(e, got)
        assert [encode(x) for x in got] == want
    assert observer.rounds >= 1 and all(math.isfinite(r[1]) for r in observer._refs.values())
