"""The modeler service core on real events: drift triggers a refit, versions increase, impossible
measurements are answered with metrics.rejected, a replay gives the same state and outputs, and
the core runs under the service shell on the in-memory bus."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.bus import MemoryBus
from controlplane.events import (JobSubmitted, MetricsIteration, ModelRef, ModelUpdated, Plan, Resources, decode,
                                 encode, make)
from controlplane.service import ServiceShell
from tests.shells import run_until_done
from modeler.configs import Config
from modeler.perf_model import PerfParams
from modeler.service import ModelerCore, make_core
from modeler.spec import load_model
from tests.modeler.conftest import MODELS

SEED = PerfParams(k_bwd=2.0, k_sync=1.2, k_opt=0.09, k_opt_off=6.0, k_off=1.5, k_swap=1.5, k_const=0.06)
PLACEMENTS = [(1,), (2,), (4,), (8,), (4, 4), (2, 2, 2, 2), (8, 8), (2, 6), (3, 5)]


@pytest.fixture
def core(env):
    return ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})


def metric(n: int, gpn: tuple[int, ...], t: float, *, plan: Plan | None = None, model: str = "gpt2",
           job: str = "gpt2-0001", **extra) -> object:
    payload = MetricsIteration(job_id=job, model_type=model, iteration=n, iter_time_s=t,
                               plan=plan or Plan(dp=sum(gpn)), gpus_per_node=gpn, **extra)
    return make("metrics.iteration", payload, time=1000.0 + n, id=f"m-{n}", source="test")


def drifted(core: ModelerCore, factor: float, start: int = 0) -> list:
    """Measurements `factor` times what the core predicts now, on varied placements."""
    events = []
    for i, gpn in enumerate(PLACEMENTS * 2):
        cfg = Config(plan=Plan(dp=sum(gpn)), gpus_per_node=gpn, cpus_per_gpu=None, global_batch_size=16)
        pred = float(core.predict("gpt2", [cfg])[0])
        events.append(metric(start + i, gpn, pred * factor))
    return events


def run(core: ModelerCore, events: list) -> list:
    return [out for e in events for out in core.handle(e)]


def test_accurate_measurements_do_not_refit(core):
    assert run(core, drifted(core, 1.02)) == []
    assert core.types["gpt2"].version == 0


def test_drift_triggers_a_refit_and_versions_increase(core):
    events = drifted(core, 1.3)
    out = run(core, events)
    updates = [e for e in out if e.subject == "model.updated"]
    assert updates, "30% slower measurements must trigger a refit"
    first = updates[0].payload
    assert isinstance(first, ModelUpdated) and first.version == 1 and first.model_type == "gpt2"
    assert updates[0].id == "model-gpt2-v1" and updates[0].time == events[6].time  # 7th point: enough to fit
    assert "rolling error" in first.reason and first.n_points >= 7 and first.rmsle < 0.1
    assert [u.payload.version for u in updates] == list(range(1, len(updates) + 1))
    # the refitted model predicts the drifted times
    cfg = Config(plan=Plan(dp=8), gpus_per_node=(8,), cpus_per_gpu=None, global_batch_size=16)
    seeded = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, core.env, {"gpt2": SEED})
    ratio = core.predict("gpt2", [cfg])[0] / seeded.predict("gpt2", [cfg])[0]
    assert 1.15 < ratio < 1.45
    # a second drift refits again with the next version, once its points outweigh the first drift's
    # (kept beside them, up to 4 per configuration) enough for a refit to beat the current fit
    more = []
    for start in (100, 200, 300, 400):
        more = [e for e in run(core, drifted(core, 1.3, start=start)) if e.subject == "model.updated"]
        if more:
            break
    assert more and more[0].payload.version == updates[-1].payload.version + 1


def test_a_refit_no_better_than_the_current_fit_is_not_published(env):
    """Measurements swinging 30% over and 23% under the prediction on configurations the model cannot
    tell apart (plain DP on 8 GPUs, different CPU counts): the rolling error passes the threshold, but
    no parameters predict them better, so the current ones stay."""
    def swinging(core):
        cfg = Config(plan=Plan(dp=8), gpus_per_node=(8,), cpus_per_gpu=None, global_batch_size=16)
        pred = float(core.predict("gpt2", [cfg])[0])
        return [metric(i, (8,), pred * (0.77 if i % 2 else 1.3), cpus_per_gpu=1 + i) for i in range(12)]

    strict = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})
    assert run(strict, swinging(strict)) == [] and strict.types["gpt2"].version == 0
    assert strict.types["gpt2"].params == SEED and len(strict.types["gpt2"].errors) < 12  # the window restarted
    eager = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED}, min_gain=0.0)
    assert "model.updated" in [e.subject for e in run(eager, swinging(eager))]


def test_a_refit_keeps_the_agreed_fitting_points_and_publishes_its_bound(env):
    """With the fitting points as anchors, a refit fits them and the measured points together (less a
    fitting point whose configuration the cluster measured: the measurements replace it). A drift
    measured on plain DP moves the DP predictions; the anchors' other configurations stay closer to
    what they say than without them. Its error bound rides on model.updated."""
    from modeler.service import seed_fits
    from tests.modeler.conftest import DATA

    seeds = seed_fits({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, DATA / "fit_points.csv")
    params, bounds, anchors = seeds["gpt2"]
    # the type's bound, and one per plan family of gpt2's fitting points
    assert set(bounds) == {"all", "DP", "GC", "ZeRO", "ZeRO-Offload", "3D"} and all(v > 0 for v in bounds.values())
    assert bounds["DP"] < bounds["all"] < bounds["3D"]  # one pipeline point and one TP one: the least known
    make_one = lambda **kw: ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": params},  # noqa: E731
                                        bounds={"gpt2": bounds}, **kw)
    anchored, loose = make_one(anchors={"gpt2": anchors}), make_one()
    assert anchored.types["gpt2"].bounds == bounds
    out, kept = {}, {}
    for name, core in (("anchored", anchored), ("loose", loose)):
        for event in drifted(core, 1.4):
            updates = [e for e in core.handle(event) if e.subject == "model.updated"]
            if updates:
                out[name], kept[name] = updates[0].payload, sum(map(len, core.types["gpt2"].points.values()))
                break
        assert name in out
    # gpt2's 7 fitting points less the two plain-DP ones the drift measured again (dp=4 on (4,) and dp=2
    # on (2,)), beside the measured points
    assert out["anchored"].n_points == kept["anchored"] + 5 and out["loose"].n_points == kept["loose"]
    published = out["anchored"].error_bounds
    assert published and "all" in published and published == anchored.types["gpt2"].bounds
    # the anchors' own points: predicted closer by the anchored refit than by the one without them
    from modeler.memory import resolve_ga
    from modeler.perf_model import t_iter

    model = load_model(MODELS / "gpt2.yaml")
    batch = resolve_ga(model, env, anchors.batch)
    err = {n: float(np.mean(np.abs(np.log(t_iter(model, env, c.types["gpt2"].params, batch) / anchors.iter_time_s))))
           for n, c in (("anchored", anchored), ("loose", loose))}
    assert err["anchored"] < err["loose"], err
    # an adopted update brings its bound; one without a bound keeps the last
    later = ModelUpdated(model_type="gpt2", version=50, params=params.as_dict(), n_points=9, rmsle=0.01,
                         error_bounds={"all": 0.25, "DP": 0.05, "XL": 1.0, "GC": float("nan"), "3D": -1.0})
    anchored.handle(make("model.updated", later, time=5000.0, id="model-gpt2-v50", source="cli"))
    assert anchored.types["gpt2"].bounds == {"all": 0.25, "DP": 0.05}  # unknown families, NaN, negative: dropped
    unbounded = ModelUpdated(model_type="gpt2", version=51, params=params.as_dict(), n_points=9, rmsle=0.01)
    anchored.handle(make("model.updated", unbounded, time=5001.0, id="model-gpt2-v51", source="cli"))
    assert anchored.types["gpt2"].bounds == {"all": 0.25, "DP": 0.05} and anchored.types["gpt2"].version == 51


def test_first_fit_once_enough_points(env):
    core = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env)
    truth = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})
    out = run(core, drifted(truth, 1.0)[:7])
    assert [e.subject for e in out] == ["model.updated"]
    assert out[0].payload.version == 1 and out[0].payload.reason == "first fit"
    assert out[0].time == 1006.0


def test_impossible_measurements_are_rejected_and_not_used(core, env):
    bad = [
        metric(1, (8,), 1.0, model="resnet"),                                      # unknown type
        metric(2, (4, 4), 1.0, plan=Plan(dp=1, tp=8)),                             # TP across nodes
        metric(3, (8,), 1.0, plan=Plan(dp=8, ga_steps=3)),                         # 16 not divisible by 24
        metric(4, (8,), 1.0, fwd_s=2.0),                                           # part longer than the whole
    ]
    out = run(core, bad)
    assert [e.subject for e in out] == ["metrics.rejected"] * 4
    fields = [(e.payload.field, e.payload.event_id, e.payload.job_id, e.id) for e in out]
    assert fields == [("model_type", "m-1", "gpt2-0001", "rej-m-1"), ("plan", "m-2", "gpt2-0001", "rej-m-2"),
                      ("plan", "m-3", "gpt2-0001", "rej-m-3"), ("fwd_s", "m-4", "gpt2-0001", "rej-m-4")]
    assert "TP groups would cross nodes" in out[1].payload.reason
    assert core.types["gpt2"].points == {} and core.types["gpt2"].errors == []


def test_job_batch_and_new_types_from_submissions(env):
    core = ModelerCore({}, env)
    spec = load_model(MODELS / "bert.yaml").spec
    job = JobSubmitted(job_id="b-1", tenant="t", guaranteed=False, model=ModelRef(type="bert", spec=spec),
                       global_batch_size=64, plan=Plan(dp=2), resources=Resources(gpus=2, cpus=8, mem_gb=10.0),
                       target_iterations=10)
    assert core.handle(make("job.submitted", job, time=1.0, id="s-1", source="test")) == []
    assert "bert" in core.types and core.job_batch["b-1"] == 64
    core.handle(metric(1, (2,), 0.5, model="bert", job="b-1"))
    (points,) = core.types["bert"].points.values()
    assert points[0].config.global_batch_size == 64


def test_points_are_bounded_per_configuration(core):
    core.per_config = 3
    run(core, [metric(i, (8,), 0.6) for i in range(10)])
    (kept,) = core.types["gpt2"].points.values()
    assert [p.event_id for p in kept] == ["m-7", "m-8", "m-9"]
    assert len(core.types["gpt2"].errors) <= core.window


def test_a_measurement_id_is_taken_once_within_the_last_max_seen(core):
    core.max_seen = 3
    run(core, [metric(i, (8,), 0.6) for i in range(5)])
    (kept,) = core.types["gpt2"].points.values()
    assert [p.event_id for p in kept] == ["m-0", "m-1", "m-2", "m-3", "m-4"][-core.per_config:]
    assert list(core.types["gpt2"].seen) == ["m-2", "m-3", "m-4"]  # the oldest ids forgotten, in order
    errors = list(core.types["gpt2"].errors)
    run(core, [metric(4, (8,), 0.6), metric(2, (8,), 0.6)])  # still remembered: nothing taken
    assert core.types["gpt2"].errors == errors
    run(core, [metric(0, (8,), 0.6)])  # forgotten (beyond the last three): taken again
    assert len(core.types["gpt2"].errors) == min(len(errors) + 1, core.window)
    assert list(core.types["gpt2"].seen) == ["m-3", "m-4", "m-0"]


def test_replay_is_deterministic_and_idempotent(env):
    def fresh():
        return ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})

    events = drifted(fresh(), 1.3) + [metric(90, (4, 4), 1.0, plan=Plan(dp=1, tp=8))]
    a, b = fresh(), fresh()
    out_a, out_b = run(a, events), run(b, events)
    assert out_a and [encode(e) for e in out_a] == [encode(e) for e in out_b]
    assert a.snapshot() == b.snapshot()
    # the same events again (a redelivery) change nothing
    state = a.snapshot()
    assert [e for e in run(a, events) if e.subject == "model.updated"] == []
    assert a.snapshot() == state
    # a core fed the log including its own outputs (a restart) ends with the same parameters
    c = fresh()
    for e in events + out_a:
        c.handle(e)
    assert c.types["gpt2"].version == a.types["gpt2"].version
    assert c.types["gpt2"].params == a.types["gpt2"].params


def test_published_parameters_are_adopted_by_version(core):
    newer = ModelUpdated(model_type="gpt2", version=5, params={**SEED.as_dict(), "k_const": 0.5}, n_points=9,
                         rmsle=0.01)
    core.handle(make("model.updated", newer, time=1.0, id="model-gpt2-v5", source="cli"))
    assert core.types["gpt2"].version == 5 and core.types["gpt2"].params.k_const == 0.5
    older = ModelUpdated(model_type="gpt2", version=4, params=SEED.as_dict(), n_points=9, rmsle=0.01)
    core.handle(make("model.updated", older, time=2.0, id="model-gpt2-v4", source="cli"))
    assert core.types["gpt2"].params.k_const == 0.5


def test_make_core_loads_the_builtin_models():
    core = make_core()
    assert core.name == "modeler" and set(core.subjects) >= {"metrics.iteration", "model.updated"}
    assert {"vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30"} <= set(core.types)
    assert all(core.types[k].params is not None for k in ("gpt2", "llama7"))
    cfg = Config(plan=Plan(dp=8), gpus_per_node=(8,), cpus_per_gpu=None, global_batch_size=16)
    assert np.isclose(core.predict("gpt2", [cfg])[0], 0.626, rtol=0.15)


async def _run_shell(bus: MemoryBus, core: ModelerCore) -> ServiceShell:
    """Run the shell until it has consumed every stored event of its subjects (its own outputs too)."""
    return await run_until_done(ServiceShell(core, bus), bus)


async def test_under_the_service_shell(env):
    def fresh():
        return ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})

    bus = MemoryBus()
    events = drifted(fresh(), 1.3)[:9] + [metric(50, (4, 4), 1.0, plan=Plan(dp=1, tp=8))]
    for e in events:
        await bus.publish(e.subject, encode(e), e.id)
    core = fresh()
    await _run_shell(bus, core)
    published = [decode(d, s) for _, s, d in bus.messages()][len(events):]
    subjects = [e.subject for e in published]
    assert "model.updated" in subjects and subjects[-1] == "metrics.rejected"
    # a restarted service rebuilds its state from the log (its own model.updated included)
    again = fresh()
    shell = await _run_shell(bus, again)
    assert shell.restored > 0
    assert again.types["gpt2"].version == core.types["gpt2"].version
    assert again.types["gpt2"].params == core.types["gpt2"].params


def test_a_refit_of_the_same_points_as_the_last_unpublished_one_is_answered_without_fitting(env, monkeypatch):
    """A job measured again and again on two configurations the model cannot tell apart (plain DP on 8 GPUs, two CPU
    counts), 30% over and 23% under the prediction: the window passes the threshold every few measurements, and no
    refit beats the current parameters. Once each configuration keeps its last four measurements, every refit sees
    the same points as the one before: it is answered as that one was, without fitting. A new time, or parameters
    adopted from `model.updated`, make the next refit fit again. Outputs and state after every event are those of a
    core that fits at every refit."""
    import modeler.service as service

    fits = {"n": 0}
    real_fit = service.fit

    def counted(*args, **kwargs):
        fits["n"] += 1
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(service, "fit", counted)
    cfg = Config(plan=Plan(dp=8), gpus_per_node=(8,), cpus_per_gpu=None, global_batch_size=16)

    def events(core, start, slow=1.3):
        pred = float(core.predict("gpt2", [cfg])[0])
        return [metric(start + i, (8,), pred * (0.77 if i % 2 else slow), cpus_per_gpu=1 + i % 2) for i in range(60)]

    memo = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})
    every = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED})
    real_refit = ModelerCore._refit

    def forgetful(self, event, key, st, reason):
        if self is every:
            st.unpaid = None
        return real_refit(self, event, key, st, reason)

    monkeypatch.setattr(ModelerCore, "_refit", forgetful)
    counts = {}
    stream = events(memo, 0)
    stream += events(memo, 100, slow=1.31)  # a new time on one configuration
    adopted = make("model.updated", ModelUpdated(model_type="gpt2", version=5, params=SEED.as_dict(), n_points=7,
                                                 rmsle=0.05), time=2000.0, id="elsewhere", source="test")
    stream += [adopted] + events(memo, 200, slow=1.31)
    for name, core in (("memo", memo), ("every", every)):
        fits["n"] = 0
        outs, states, fitted = [], [], []
        for e in stream:
            outs.append(core.handle(e))
            states.append(core.snapshot())
            fitted.append(fits["n"])
        counts[name] = (outs, states, fitted)
    assert counts["memo"][0] == counts["every"][0] and counts["memo"][1] == counts["every"][1]
    assert all(out == [] for out in counts["memo"][0])  # no refit is published
    memo_fits, every_fits = counts["memo"][2], counts["every"][2]
    # once the points repeat (four of each configuration kept), no fit; the core without the memo fits every window
    assert memo_fits[59] == memo_fits[20] and every_fits[59] - every_fits[20] >= 7
    # the new time enters the points one measurement at a time: a fit or two until they repeat again
    assert 1 <= memo_fits[119] - memo_fits[59] <= 3
    # the adopted parameters (the same points): one fit, then none
    assert memo_fits[-1] - memo_fits[120] == 1 and every_fits[-1] - every_fits[120] >= 10


def test_a_configuration_measured_again_is_taken_as_one_checked_afresh(env):
    """The core checks a measurement's configuration and makes its row and key once, and takes them again for a
    measurement of the same plan, placement, CPUs per GPU and batch under a type with the same rule for TP across
    nodes. Over a stream that mixes jobs of two batches, three CPU counts, a plan one type may run across nodes and
    the other may not (in both orders), and a table of configurations emptied as it fills (`max_shapes` 5): every
    kept point holds the configuration, row and key made afresh from its own measurement, every error entered is
    the one against a prediction made afresh, every refit's reason gives the window's mean as `np.mean` does, and
    what is rejected is exactly what a check afresh rejects."""
    from modeler.configs import ConfigError, config_row
    from modeler.service import _config_key

    core = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml"), "llama30": load_model(MODELS / "llama30.yaml")},
                       env, {"gpt2": SEED, "llama30": SEED})
    core.max_shapes = 5
    batches = {"g-16": ("gpt2", 16), "g-64": ("gpt2", 64), "l-16": ("llama30", 16)}
    for job, (model, gbs) in batches.items():
        spec = core.types[model].model.spec
        sub = JobSubmitted(job_id=job, tenant="t", guaranteed=False, model=ModelRef(type=model, spec=spec),
                           global_batch_size=gbs, plan=Plan(dp=2), resources=Resources(gpus=2, cpus=8, mem_gb=10.0),
                           target_iterations=10)
        core.handle(make("job.submitted", sub, time=0.0, id=f"s-{job}", source="test"))
    shapes = [(Plan(dp=8), (8,)), (Plan(dp=8), (4, 4)), (Plan(dp=2, tp=4), (4, 4)), (Plan(dp=1, tp=8), (4, 4)),
              (Plan(dp=4, zero_stage=2, offload=True), (2, 2))]
    rng = np.random.default_rng(11)
    taken: dict[str, Config] = {}
    refits = rejected = 0
    for n in range(400):
        job = ("g-16", "g-64", "l-16")[int(rng.integers(3))]
        model, gbs = batches[job]
        plan, gpn = shapes[int(rng.integers(len(shapes)))]
        cpus = (None, 4, 8)[int(rng.integers(3))]
        cfg = Config(plan=plan, gpus_per_node=gpn, cpus_per_gpu=cpus, global_batch_size=gbs)
        st = core.types[model]
        try:
            row = config_row(cfg, allow_tp_across_nodes=st.model.allow_tp_across_nodes)
        except ConfigError:
            row = None
        pred = float(core.predict(model, [cfg])[0]) if row is not None else 1.0
        t = pred * float(rng.choice([0.7, 1.0, 1.4]))
        before = list(st.errors)
        payload = MetricsIteration(job_id=job, model_type=model, iteration=n, iter_time_s=t, plan=plan,
                                   gpus_per_node=gpn, cpus_per_gpu=cpus)
        out = core.handle(make("metrics.iteration", payload, time=1000.0 + n, id=f"m-{n}", source="test"))
        if row is None:
            assert [e.subject for e in out] == ["metrics.rejected"]
            rejected += 1
            continue
        assert all(e.subject == "model.updated" for e in out)
        taken[f"m-{n}"] = cfg
        window = (before + [abs(pred - t) / t])[-core.window:]
        if st.errors and st.errors != window:  # emptied by a refit
            raise AssertionError(f"event {n}: errors {st.errors} where {window} were expected")
        for e in out:
            refits += 1
            assert e.payload.reason.startswith(f"rolling error {float(np.mean(window)):.1%} > ")
        for key, points in st.points.items():
            for p in points:
                assert p.config == taken[p.event_id] and p.row == config_row(
                    taken[p.event_id], allow_tp_across_nodes=st.model.allow_tp_across_nodes)
                assert key == _config_key(p.config)
    assert rejected > 20 and refits > 0 and len(core._shapes) <= core.max_shapes


def test_refits_that_publish_nothing_back_off_and_a_published_or_adopted_one_ends_the_run(env, monkeypatch):
    """A job measured 30% over and 23% under the prediction in turn, on configurations the model cannot tell apart
    (plain DP on 8 GPUs, twelve CPU counts): the window passes the threshold at every measurement and no refit beats
    the current parameters. Without a backoff the type is refitted every 5 measurements; with `refit_backoff` n,
    after k refits in a row that published nothing the next waits for 5 * 2^min(k, n) measurements. Parameters
    adopted from `model.updated` end the run, and so does a refit that is published (a drift the model can follow):
    the next waits 5 again. The refit set off is the same as without the backoff, only later: the points it sees are
    the last ones kept."""
    set_off: dict[str, list[int]] = {}
    real_refit = ModelerCore._refit

    def counted(self, event, key, st, reason):
        set_off.setdefault(self.name, []).append(self._seq)
        return real_refit(self, event, key, st, reason)

    monkeypatch.setattr(ModelerCore, "_refit", counted)
    cfg = Config(plan=Plan(dp=8), gpus_per_node=(8,), cpus_per_gpu=None, global_batch_size=16)

    def swinging(core, start, n):
        pred = float(core.predict("gpt2", [cfg])[0])
        return [metric(start + i, (8,), pred * (0.77 if i % 2 else 1.3), cpus_per_gpu=1 + i % 12) for i in range(n)]

    def gaps(name):
        seq = set_off[name]
        return [b - a for a, b in zip([0, *seq], seq)]

    cores = {}
    for n in (0, 1, 3):
        core = ModelerCore({"gpt2": load_model(MODELS / "gpt2.yaml")}, env, {"gpt2": SEED}, refit_backoff=n)
        core.name = f"backoff-{n}"
        cores[n] = core
        assert run(core, swinging(core, 0, 400)) == [] and core.types["gpt2"].version == 0
    # the first two refits set off find too few points to fit and leave the window as it is: not a refit that fitted
    assert gaps("backoff-0") == [5, 1, 1] + [5] * 78
    assert gaps("backoff-1") == [5, 1, 1] + [10] * 39
    assert gaps("backoff-3") == [5, 1, 1, 10, 20] + [40] * 9
    st = cores[3].types["gpt2"]
    assert st.unpaid_in_a_row == 12 and st.waited == 400 - sum(gaps("backoff-3"))

    adopted = make("model.updated", ModelUpdated(model_type="gpt2", version=5, params=SEED.as_dict(), n_points=7,
                                                 rmsle=0.05), time=2000.0, id="elsewhere", source="test")
    cores[3].handle(adopted)
    assert (st.version, st.unpaid_in_a_row, st.waited, st.errors) == (5, 0, 0, [])
    before = len(set_off["backoff-3"])
    run(cores[3], swinging(cores[3], 1000, 40))
    assert set_off["backoff-3"][before:] == [405, 415, 435]  # the run starts again from the adopted parameters

    # a drift the model can follow: the refit waits out the backoff and then is published, ending the run
    st.waited, st.errors = 0, []
    before = len(set_off["backoff-3"])
    published = []
    for start in range(2000, 3000, 100):
        for e in drifted(cores[3], 1.3, start=start):
            published = [out for out in cores[3].handle(e) if out.subject == "model.updated"]
            if published:
                break
        if published:
            break
    assert published and published[0].payload.version == 6
    assert set_off["backoff-3"][before] - set_off["backoff-3"][before - 1] >= 40  # waited 5 * 2^3 measurements
    assert (st.unpaid_in_a_row, st.waited, st.errors) == (0, 0, [])
