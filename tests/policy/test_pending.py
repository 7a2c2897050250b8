"""Why a job waits: every round publishes, on `plan.pending`, each waiting or short job's reason from the
documented set, only when it changes; the fold, `rubick status` and `rubick explain` show it."""

from __future__ import annotations

from dataclasses import replace

from controlplane.cli.status import render
from controlplane.events import Plan, encode
from controlplane.events.payloads import PENDING_REASONS
from controlplane.pending import sentence, short
from policy.explain import render as render_explain

from .helpers import Clock, completed, job, node
from .test_guarantees import core_for
from .test_hold import grown_then_arrival, tick

LLAMA30 = Plan(dp=1, tp=4, pp=3, micro_batches=4)


def pending_events(out):
    return [e.payload for e in out if e.base == "plan.pending"]


def reasons(out) -> dict:
    return {p.job_id: p for e in pending_events(out) for p in e.pending}


def test_a_best_effort_job_on_a_full_cluster_waits_for_gpus_and_is_cleared_when_it_starts():
    core = core_for("rubick", hold_s=0, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", gpus=4)))
    core.handle(c.ev("job.submitted", job("g", "bert", 32, Plan(dp=4), 4, guaranteed=True)))
    out = core.handle(c.ev("job.submitted", job("b", "llama7", 8, Plan(dp=4, zero_stage=2, offload=True), 4)))
    p = reasons(out)["b"]
    assert (p.reason, p.gpus) == ("no-gpus", 0) and p.needs_gpus >= 1
    assert core.state.jobs["b"].pending == p
    assert "no GPUs free for its minimum" in short(p)
    assert "why: no GPUs free" in next(x for x in render(core.state).splitlines() if x.split()[:1] == ["b"])
    # the same reason next round: nothing published again
    assert pending_events(core.handle(c.ev("node.registered", node("n0", gpus=4)))) == []
    out = core.handle(c.ev("job.completed", completed("g")))
    [ev] = pending_events(out)
    assert "b" in ev.cleared and core.state.jobs["b"].pending is None
    assert "why: starting" in next(x for x in render(core.state).splitlines() if x.split()[:1] == ["b"])


def test_a_guaranteed_job_over_its_tenants_quota_says_so_with_the_numbers():
    core = core_for("rubick", quotas={"team-a": 4, "team-b": 0}, hold_s=0, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", gpus=4)))
    core.handle(c.ev("job.submitted", job("a1", "bert", 32, Plan(dp=4), 4, guaranteed=True)))
    out = core.handle(c.ev("job.submitted", job("a2", "bert", 32, Plan(dp=4), 4, guaranteed=True)))
    out += core.handle(c.ev("job.submitted", job("b1", "bert", 32, Plan(dp=4), 4, guaranteed=True, tenant="team-b")))
    got = reasons(out)
    assert got["a2"].reason == "quota" and got["a2"].detail["quota"] == "4"
    assert int(got["a2"].detail["quota_used"]) + got["a2"].needs_gpus > 4
    assert "quota of 4 GPUs is used up" in sentence(got["a2"])
    assert got["b1"].reason == "quota" and short(got["b1"]) == "its tenant has no quota: best-effort"


def test_free_gpus_no_plan_fits_on_is_no_fit_not_no_gpus():
    core = core_for("rubick", hold_s=0, batch_s=0)
    c = Clock()
    for i in range(6):  # 12 GPUs, two per node: LLaMA-30B needs 12 with four on a node (TP 4)
        core.handle(c.ev("node.registered", node(f"n{i}", gpus=2)))
    out = core.handle(c.ev("job.submitted", job("big", "llama30", 4, Plan(dp=1, tp=2, pp=6, micro_batches=4), 12)))
    p = reasons(out)["big"]
    assert (p.reason, p.needs_gpus) == ("no-fit", 12)
    assert "no execution plan of it fits" in sentence(p)


def test_an_arrival_kept_from_a_held_job_is_held():
    core, c, out = grown_then_arrival(156.0)
    assert reasons(out)["b"].reason == "held"
    assert "restart rule" in sentence(reasons(out)["b"], restart_cost_s=78.0)
    out = core.handle(tick(c, 2, 160.0))  # the hold is over: b starts, and is no longer pending
    assert "b" in pending_events(out)[0].cleared


def test_explain_turns_the_reason_into_sentences():
    core, c, out = grown_then_arrival(156.0)
    text = render_explain(core.explain("b"))
    line = next(x for x in text.splitlines() if x.strip().startswith("why it waits"))
    assert "(held)" in line and "It holds no GPUs" in line and "{" not in line


def test_every_reason_published_is_in_the_documented_set_and_the_stream_replays(tmp_path):
    """A busy cluster, twice: the reasons are all documented ones, and the same inputs give the same bytes."""
    def run():
        core = core_for("rubick", quotas={"team-a": 8}, hold_s=100.0, batch_s=60.0)
        c = Clock()
        out = []
        for i in range(2):
            out += core.handle(c.ev("node.registered", node(f"n{i}")))
        out += core.handle(tick(c, 0, 0.0))
        for i in range(12):
            model, gbs, plan, gpus = [("bert", 32, Plan(dp=2), 2), ("gpt2", 16, Plan(dp=4, zero_stage=2), 4),
                                      ("llama30", 4, LLAMA30, 12)][i % 3]
            out += core.handle(c.ev("job.submitted", job(f"j{i}", model, gbs, plan, gpus, guaranteed=i % 4 == 0)))
        for k in range(1, 6):
            out += core.handle(tick(c, k, 60.0))
            out += core.handle(c.ev("job.completed", completed(f"j{k}")))
        return out, core
    first, core = run()
    second, _ = run()
    assert [encode(e) for e in first] == [encode(e) for e in second]
    seen = {p.reason for e in pending_events(first) for p in e.pending}
    assert seen and seen <= set(PENDING_REASONS)
    # the fold agrees with the core on who waits and why
    waiting = {j: core.state.jobs[j].pending.reason for j in core.state.jobs if core.state.jobs[j].pending}
    assert waiting == {j: p.reason for j, p in core.pending.items() if j in core.state.open_jobs}


def test_requested_host_memory_is_allocated_per_gpu_and_a_node_without_it_is_no_fit():
    from controlplane.events import Resources
    core = core_for("rubick", hold_s=0, batch_s=0)
    c = Clock()
    core.handle(c.ev("node.registered", node("n0", mem_gb=1600.0)))
    asked = replace(job("m", "bert", 32, Plan(dp=2), 2), resources=Resources(gpus=2, cpus=16, mem_gb=64.0))
    out = core.handle(c.ev("job.submitted", asked))
    [d] = [d for e in out if e.base == "plan.decided" for d in e.payload.decisions if d.job_id == "m"]
    held = sum(s.gpus for s in d.allocation)
    assert held >= 1 and sum(s.mem_gb for s in d.allocation) == 32.0 * held, "64 GB for 2 GPUs: 32 GB per GPU held"
    small = core_for("rubick", hold_s=0, batch_s=0)
    for n in ("n0", "n1"):  # 120 GB in the cluster, 60 GB on a node: 100 GB for one GPU fits no node
        small.handle(c.ev("node.registered", node(n, mem_gb=60.0)))
    big = replace(job("m", "bert", 32, Plan(dp=1), 1), resources=Resources(gpus=1, cpus=8, mem_gb=100.0))
    out = small.handle(c.ev("job.submitted", big))
    assert reasons(out)["m"].reason == "no-fit", "GPUs free, host memory not"
