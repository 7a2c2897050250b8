"""The network scheduler's bus core: `plan.decided` in, `network.decided` out (a pure core)."""

from __future__ import annotations

import pytest

from controlplane.events import (Decision, JobCompleted, JobSubmitted, ModelRef, ModelUpdated, NodeRegistered,
                                 NodeShare, Plan, PlanDecided, decode, encode, make)
from policy.network.core import NetworkCore
from replay.config import load_parts


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return load_parts(cache_dir=tmp_path_factory.mktemp("fit"))


def core(parts, mode="echelonflow", classes=4) -> NetworkCore:
    return NetworkCore(mode, dict(parts.models), parts.env,
                       parts.perf_params(), classes=classes)


def ev(subject, payload, t=0.0, n=[0]):
    n[0] += 1
    return make(subject, payload, time=t, id=f"e{n[0]}", source="test")


def submit(job, model="gpt2", batch=32):
    return ev("job.submitted", JobSubmitted(job_id=job, tenant="t", model=ModelRef(type=model), global_batch_size=batch,
                                            plan=Plan(dp=1), target_iterations=10))


def decided(r, *decisions):
    return ev("plan.decided", PlanDecided(round=r, policy="rubick", decisions=tuple(decisions)))


def place(job, plan, *shares):
    return Decision(job_id=job, allocation=tuple(NodeShare(n, g) for n, g in shares), plan=plan)


def feed(c, events):
    out = []
    for e in events:
        out += c.handle(e)
    return out


def script():
    return [*(ev("node.registered", NodeRegistered(node=f"n{i}", gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0)) for i in range(4)),
            submit("dp"), submit("pp"), submit("solo"),
            decided(1, place("dp", Plan(dp=16), ("n0", 8), ("n1", 8)),
                    place("pp", Plan(dp=2, tp=2, pp=4, micro_batches=8), ("n0", 8), ("n1", 8)),
                    place("solo", Plan(dp=8), ("n2", 8)))]


def test_jobs_with_flows_between_nodes_get_classes_and_one_node_jobs_none(parts):
    c = core(parts)
    out = feed(c, script())
    assert [e.base for e in out] == ["network.decided"]
    x = out[0].payload
    assert x.mode == "echelonflow" and x.round == 1 and x.classes == 4 and x.cleared == ()
    by = {d.job_id: d for d in x.decisions}
    assert set(by) == {"dp", "pp"}  # solo stays inside n2
    # the pipeline's small, spread activations can meet their ideal times; the all-reduce cannot
    assert by["pp"].rank == 0 and by["pp"].traffic_class == 0 and by["dp"].traffic_class == 1
    assert by["pp"].tardiness_s < by["dp"].tardiness_s
    assert by["dp"].bytes_per_iteration == pytest.approx(2 * 2 * (16 - 1) / 16 * 2 * parts.models["gpt2"].spec.num_params)
    assert decode(encode(out[0])).payload == x


def test_fair_puts_everyone_in_class_zero(parts):
    x = feed(core(parts, "fair"), script())[0].payload
    assert {d.traffic_class for d in x.decisions} == {0}


def test_only_changes_are_published_and_ended_jobs_are_cleared(parts):
    c = core(parts)
    feed(c, script())
    assert c.handle(decided(2, place("solo", Plan(dp=4), ("n2", 4)))) == []  # nothing crossing nodes changed
    out = c.handle(ev("job.completed", JobCompleted(job_id="pp", iterations=10)))
    x = out[0].payload
    assert x.round == 2 and x.cleared == ("pp",)
    assert [(d.job_id, d.rank, d.traffic_class) for d in x.decisions] == [("dp", 0, 0)]
    out = c.handle(decided(3, Decision(job_id="dp", allocation=(), plan=None)))
    assert out[0].payload.cleared == ("dp",) and out[0].payload.decisions == ()
    assert c.handle(decided(4, Decision(job_id="dp", allocation=(), plan=None))) == []


def test_the_same_inputs_give_byte_identical_decisions(parts):
    a = [encode(e) for e in feed(core(parts), script())]
    b = [encode(e) for e in feed(core(parts), script())]
    assert a == b and a


def test_a_refit_changes_the_compute_times_the_arrangement_is_built_from(parts):
    c = core(parts)
    feed(c, script())

    def longest_compute(job):
        return max(t.duration for p in c.patterns() if p.job == job for t in p.tasks if not t.is_flow)

    before = longest_compute("dp")
    params = parts.perf_params()["gpt2"].as_dict()
    params["k_bwd"] = params["k_bwd"] * 3
    out = c.handle(ev("model.updated", ModelUpdated(model_type="gpt2", version=2, params=params, n_points=9, rmsle=0.1)))
    assert all(e.base == "network.decided" for e in out)  # published only if an order changed
    assert c.params["gpt2"].k_bwd == params["k_bwd"]
    assert longest_compute("dp") > 1.5 * before  # the backward dominates the DP job's compute
    bad = dict(params, k_bwd=-1.0)
    assert c.handle(ev("model.updated", ModelUpdated(model_type="gpt2", version=3, params=bad, n_points=9,
                                                     rmsle=0.1))) == []
    assert c.params["gpt2"].k_bwd == params["k_bwd"]  # refused parameters are not taken


def test_bad_input_leaves_the_job_out_never_crashes(parts):
    c = core(parts)
    feed(c, [ev("node.registered", NodeRegistered(node="n0", gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0)), submit("ghost", model="no-such-model"),
             submit("ok")])
    out = c.handle(decided(1, place("ghost", Plan(dp=16), ("n0", 8), ("n1", 8)),
                           place("ok", Plan(dp=16), ("n0", 8), ("n1", 8))))
    assert [d.job_id for d in out[0].payload.decisions] == ["ok"]
    assert "no-such-model" in c.errors["ghost"]
    # a plan that does not match its allocation: an error recorded, not an exception
    out = c.handle(decided(2, place("ok", Plan(dp=16), ("n0", 8), ("n1", 4))))
    assert "ok" in c.errors and out[0].payload.cleared == ("ok",)
    # a decision for a job never submitted is ignored
    assert c.handle(decided(3, place("nobody", Plan(dp=16), ("n0", 8), ("n1", 8)))) == []
    with pytest.raises(ValueError, match="unknown network mode"):
        core(parts, mode="tcp")
    with pytest.raises(ValueError, match="classes"):
        core(parts, classes=0)
