"""The plan book on the fitted model: the plans without ZeRO-Offload are asked of the oracle once per placement, not
once per CPU count, and every best plan is the one the book finds asking each of them at every count (the same
plan, throughput and placement, ties going to the first plan as before)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from controlplane.events import Plan
from modeler.service import make_core
from policy.curves import JobKind, PlanBook, packed, trims
from policy.oracle import ModelOracle, from_modeler
from policy.plans import _DP_PLANS, DP_FAMILIES, enumerate_plans, restrict, shape

MODELER = make_core()
DEPENDS = {"llama7"}  # where an offload plan is the best on some placements at some CPU counts only


@dataclass
class EveryCount:
    """The same oracle, without its promise that the CPUs change only offload's times: the book asks every plan at
    every CPU count."""

    inner: ModelOracle

    def version(self, model_type: str) -> int:
        return self.inner.version(model_type)

    def evaluate_many(self, model, global_batch, items):
        return self.inner.evaluate_many(model, global_batch, items)


@pytest.mark.parametrize("name", ["gpt2", "bert", "vit", "roberta", "t5", "llama7", "llama30"])
def test_every_best_plan_is_the_one_asking_every_plan_at_every_cpu_count_gives(name):
    oracle, models = from_modeler(MODELER)
    kind = JobKind(models[name], models[name].spec.global_batch_size)
    assert kind.offload and oracle.cpus_offload_only
    once, every = PlanBook(oracle), PlanBook(EveryCount(oracle))
    places = sorted({t for g in (1, 2, 3, 5, 8, 12, 16, 24) for t in trims(packed(g, 8))} | {(4, 4), (2, 2, 2, 2),
                                                                                             (5, 3), (6, 6, 4)})
    wanted = [(p, c) for p in places for c in (1, 4, 12)]
    once.fill(kind, wanted)
    every.fill(kind, wanted)
    assert 0 < once.evaluations < every.evaluations  # the plans without offload: once per placement
    found = 0
    for place in places:
        for cpg in range(1, once.max_cpus_per_gpu + 1):
            a, b = once.best(kind, place, cpg), every.best(kind, place, cpg)
            assert (a.throughput, a.plan, a.placement) == (b.throughput, b.plan, b.placement), (place, cpg)
            found += a.plan is not None
    assert found  # some placement runs a plan
    # and the best plan does depend on the CPUs somewhere (offload's times do), or the check above proves little
    if name in DEPENDS:
        assert any(once.best(kind, p, 1).throughput != once.best(kind, p, 12).throughput for p in places)


@dataclass
class Levelled:
    """The same oracle, with every plan that runs taking the same time: plans with and without offload tie
    everywhere, and the first listed must win, as when every plan is asked at every count."""

    inner: ModelOracle
    cpus_offload_only = True  # still true: no time depends on the CPUs

    def version(self, model_type: str) -> int:
        return self.inner.version(model_type)

    def evaluate_many(self, model, global_batch, items):
        times, plans = self.inner.evaluate_many(model, global_batch, items)
        return np.where(np.isfinite(times) & (times > 0), 1.0, times), plans


def test_a_tie_between_plans_with_and_without_offload_goes_to_the_plan_listed_first():
    oracle, models = from_modeler(MODELER)
    first = {True: 0, False: 0}  # ties the plan listed first wins, by whether it offloads
    for name in ("gpt2", "llama7"):
        kind = JobKind(models[name], models[name].spec.global_batch_size)
        levelled = Levelled(oracle)
        once, every = PlanBook(levelled), PlanBook(EveryCount(levelled))
        places = sorted({t for g in (1, 2, 4, 8, 16) for t in trims(packed(g, 8))})
        wanted = [(p, c) for p in places for c in (1, 6, 12)]
        once.fill(kind, wanted)
        every.fill(kind, wanted)
        for place in places:
            plans = kind.plans(place)
            for cpg in range(1, once.max_cpus_per_gpu + 1):
                a, b = once.best(kind, place, cpg), every.best(kind, place, cpg)
                assert (a.throughput, a.plan, a.placement) == (b.throughput, b.plan, b.placement), (name, place, cpg)
                if a.plan is None:
                    continue
                runs = np.isfinite(oracle.evaluate(kind.model, kind.global_batch, place, cpg, plans)[0])
                if {p.offload for p, r in zip(plans, runs) if r} == {True, False}:
                    first[a.plan.offload] += 1
    assert first[True] and first[False]  # ties won by a plan with offload, and by one without


@dataclass
class Counting:
    """The same oracle, counting the configurations it is asked about."""

    inner: ModelOracle
    asked: int = 0
    cpus_offload_only = True

    def version(self, model_type: str) -> int:
        return self.inner.version(model_type)

    def evaluate_many(self, model, global_batch, items):
        self.asked += len(items)
        return self.inner.evaluate_many(model, global_batch, items)


def _fastest_plans(book: PlanBook, kind: JobKind, place: tuple[int, ...], cpg: int) -> tuple[float, list]:
    """(samples/s, plans) of the fastest plans on `place`, every plan asked directly: the first of them, and those
    within 1e-12 of its speed. Asked one placement at a time, the oracle's array kernels may round a time in its
    last bits otherwise than in the book's batches (AVX-512 against AVX2), so where plans tie within rounding either
    may come out first (exact ties go to the plan listed first: `test_a_tie_between_plans_with_and_without_offload_
    goes_to_the_plan_listed_first`)."""
    speeds = [(kind.global_batch / seconds, plan) for plan, seconds in book.considered(kind, place, cpg)
              if seconds > 0 and seconds != float("inf")]
    top = (0.0, None)
    for speed, plan in speeds:
        if speed > top[0]:
            top = (speed, plan)
    return top[0], [top[1]] + [plan for speed, plan in speeds
                               if plan != top[1] and speed == pytest.approx(top[0], rel=1e-12)]


@pytest.mark.parametrize("name", ["gpt2", "llama7"])
def test_placements_without_plans_cost_no_question_and_the_best_within_a_placement_is_the_best_of_its_trims(name):
    oracle, models = from_modeler(MODELER)
    kind = JobKind(models[name], models[name].spec.global_batch_size)
    counting = Counting(oracle)
    book = PlanBook(counting)
    planless = [p for g in (17, 23, 29, 31) for p in trims(packed(g, 8)) if not kind.plans(p)]
    assert planless  # some GPU counts run no plan of this kind (its batch does not split over them)
    book.fill(kind, [(p, 8) for p in planless])
    for place in planless:
        for cpg in range(1, book.max_cpus_per_gpu + 1):
            assert book.best(kind, place, cpg).plan is None
    assert counting.asked == 0
    reference = PlanBook(oracle)
    for place in [packed(23, 8), (8, 8, 7), (8, 5, 3, 1), (6, 6, 4)]:
        for cpg in (1, 3, 8, 12):
            found = book.best_within(kind, place, cpg)
            best = (0.0, [None], ())  # the first of the trims whose best plan is the fastest
            for t in trims(place):
                speed, plans = _fastest_plans(reference, kind, t, cpg)
                each = book.best(kind, t, cpg)
                assert each.throughput == pytest.approx(speed, rel=1e-12) and each.plan in plans, (t, cpg)
                if speed > best[0] * (1 + 1e-9):
                    best = (speed, plans, t)
            assert found.throughput == pytest.approx(best[0], rel=1e-12), (place, cpg)
            assert found.plan in best[1] and found.placement == best[2], (place, cpg)
            assert found.plan is not None
    assert counting.asked > 0


@pytest.mark.parametrize("template", [None, Plan(dp=4, zero_stage=2), Plan(dp=4, pp=2, micro_batches=4)])
def test_the_plans_a_kind_keeps_per_placement_are_those_it_would_enumerate_again(template):
    """A kind keeps the plans of each placement it was asked about (a search asks for those of every trim of the
    allocations it gathers, round after round): asked again, it gives what enumerating them afresh gives."""
    _, models = from_modeler(MODELER)
    model = models["gpt2"]
    kind = JobKind(model, model.spec.global_batch_size, template=template)
    places = sorted({t for g in (1, 3, 4, 8, 12, 16, 31) for t in trims(packed(g, 8))}
                    | {(4, 4), (6, 6), (2, 2, 2, 2), (7, 5), (6, 5, 1)})  # the last two: one shape
    for _ in range(2):
        for place in places:
            plans = enumerate_plans(model, kind.global_batch, place, kind.families)
            if template is not None:
                plans = restrict(plans, template, scale_dp=True)
            assert kind.plans(place) == plans, place
    assert any(kind.plans(p) for p in places) and any(not kind.plans(p) for p in places)
    assert kind.__dict__["_plans"].keys() == {shape(p) for p in places}  # kept per shape: fewer than the places
    assert len({shape(p) for p in places}) < len(places)
    for place in places:
        assert kind.planned_trims(place) == tuple(t for t in trims(place) if kind.plans(t))
    assert kind == JobKind(model, model.spec.global_batch_size, template=template)  # what it keeps is not a field
    assert hash(kind) == hash(JobKind(model, model.spec.global_batch_size, template=template))


def _placements(nodes: int, most: int):
    """Every canonical placement of 1 to `nodes` nodes of 1 to `most` GPUs each."""
    out = [()]
    for _ in range(nodes):
        out += [p + (g,) for p in out if len(p) < nodes for g in range(1, (p[-1] if p else most) + 1)]
    return sorted({p for p in out if p})


@pytest.mark.parametrize("name", ["gpt2", "llama7", "llama30", "bert"])
def test_plans_depend_on_a_placement_only_through_its_gpus_and_whether_tp_fits_its_nodes(name):
    """The plans of every placement of up to four nodes of 1-8 GPUs (and of five of 1-4), enumerated by shape (GPUs,
    the greatest common divisor of the nodes' counts), are the plans the definition gives on that very placement:
    the DP families where the batch splits over every GPU, then each TP x PP x DP whose TP groups the rank layout
    (`modeler.configs.layout`, TP innermost) keeps inside the nodes."""
    from modeler.configs import divisors, layout

    _, models = from_modeler(MODELER)
    model = models[name]
    spec, gbs = model.spec, model.spec.global_batch_size
    places = _placements(4, 8) + _placements(5, 4)
    with_3d = 0
    for place in places:
        total = sum(place)
        want = [Plan(dp=total, **_DP_PLANS[f]) for f in DP_FAMILIES] if gbs % total == 0 else []
        if model.tensor_pipeline:
            for tp in divisors(total):
                for pp in divisors(total // tp):
                    dp = total // (tp * pp)
                    if (tp * pp == 1 or spec.num_heads % tp or spec.num_layers % pp or gbs % dp
                            or layout(place, dp, tp, pp).tp_inter):
                        continue
                    want.append(Plan(dp=dp, tp=tp, pp=pp, micro_batches=gbs // dp if pp > 1 else 1))
                    with_3d += tp > 1
        assert enumerate_plans(model, gbs, place) == tuple(want), place
        assert enumerate_plans(model, gbs, place[::-1] + (0,)) == tuple(want), place  # any order, empty nodes
    assert len(places) > 500
    assert with_3d or not model.tensor_pipeline


def test_the_shapes_of_a_placements_trims_are_worked_out_as_each_trims_own():
    """`curves._trim_shapes` puts a placement's shape (its GPUs, its nodes' gcd) in front of the list of the placement
    one GPU fewer on its smallest node: each is the shape of that trim worked out alone, in the trims' order, and the
    trims are those `trims` lists, one GPU fewer each time, down to one GPU."""
    from policy.curves import _trim_shapes

    places = _placements(4, 8) + _placements(6, 3)
    for place in places:
        assert _trim_shapes(place) == tuple((t, shape(t)) for t in trims(place)), place
        listed = trims(place)
        assert listed[0] == place and sum(listed[-1]) == 1, place
        assert [sum(t) for t in listed] == list(range(sum(place), 0, -1)), place
        assert all(b == (a[:-1] + (a[-1] - 1,) if a[-1] > 1 else a[:-1]) for a, b in zip(listed, listed[1:])), place
    assert len(places) > 400


def test_slope_tables_are_the_slopes_worked_out_one_by_one():
    """`up_table` and `down_table` work a whole curve out in one pass; each entry must be the very float `slope_up` or
    `slope_down` gives at that count (the job's slopes and the index's keys are compared exactly), for running
    maxima like the book's curves and for curves that fall, at every want and floor in and around the curve."""
    import random

    from policy.curves import down_table, slope_down, slope_up, up_table

    rng = random.Random(5)
    checked = 0
    for _ in range(400):
        size = rng.choice([1, 2, 3, 9, 17, 65])
        raw = np.array([0.0] + [rng.choice([0.0, rng.random() * 100, rng.random()]) for _ in range(size - 1)])
        for curve in (np.maximum.accumulate(raw) / rng.choice([1.0, 3.7, 0.013]), raw):
            for at in range(-1, size + 2):
                assert up_table(curve, at).tolist() == [slope_up(curve, g, at) for g in range(size)]
                assert down_table(curve, at).tolist() == [slope_down(curve, g, at) for g in range(size)]
                checked += 1
    assert checked > 10_000


def test_observe_reads_the_answer_the_book_was_given_as_a_fresh_evaluation_gives_it():
    """`ModelOracle.observe` compares a job's first measured iteration with the prediction for its configuration. An
    answer `evaluate_many` gave before under the same version stands in for asking again: the same seconds to the
    bit and the same resolved plan, whatever GA steps the measured plan carries, at any CPU count for a plan without
    offload; none after a refit."""
    from dataclasses import replace

    oracle, models = from_modeler(MODELER)
    fresh, _ = from_modeler(MODELER)
    served = 0
    for name in ("gpt2", "llama7", "bert"):
        model = models[name]
        gbs = model.spec.global_batch_size
        for place in ((8,), (8, 8), (8, 4), (6, 6, 6), (5, 5)):
            plans = enumerate_plans(model, gbs, place)
            items = [(place, c, p) for p in plans for c in (1, 3)]
            if not items:
                continue
            oracle.evaluate_many(model, gbs, items)
            for _, c, p in items:
                for ga in (1, 2, 4):
                    asked, cpg = replace(p, ga_steps=ga), c if p.offload else c + 5  # a count never asked
                    kept = oracle._kept_answer(model, gbs, place, cpg, asked)
                    assert kept is not None
                    times, resolved = fresh.evaluate_many(model, gbs, [(place, cpg, asked)])
                    assert kept[0].tolist() == times.tolist() and kept[1] == resolved
                    served += 1
    assert served > 100
    model = models["gpt2"]
    gbs = model.spec.global_batch_size
    plan = enumerate_plans(model, gbs, (8,))[0]
    oracle.versions["gpt2"] = oracle.versions.get("gpt2", 0) + 1  # what `update` does to the version
    assert oracle._kept_answer(model, gbs, (8,), 1, plan) is None  # read in before the refit
    four = enumerate_plans(model, gbs, (4,))[0]
    oracle.evaluate_many(model, gbs, [((4,), 1, four)])
    oracle.versions["gpt2"] += 1
    assert oracle._kept_answer(model, gbs, (4,), 1, four) is None  # answered before the refit, read in after it


def _worked_out(oracle: ModelOracle, model, gbs: int, items) -> tuple[list[float], list]:
    """`evaluate_many` as it was before answers were kept: the whole batch worked out at once."""
    from modeler.perf_model import PerfParams, t_iter

    batch, ok = oracle.resolved(model, gbs, items)
    times = np.where(ok, t_iter(model, oracle.env, oracle.params.get(model.name, PerfParams()), batch), np.inf)
    return times.tolist(), batch.ga_steps.tolist()


def test_answers_read_back_for_the_same_rows_are_those_the_whole_batch_gives_to_the_bit():
    """`ModelOracle.evaluate_many` reads back the answer of a row (what a configuration's answer depends on) asked
    before under the type's version. Asked in batches of every size, in any order, with rows repeated across
    placements and within a batch, every time and GA step is the one working the whole batch out at once gives;
    after a refit the answers are the new parameters'."""
    import random

    from controlplane.events import ModelUpdated
    from modeler.perf_model import PerfParams

    oracle, models = from_modeler(MODELER)
    rng = random.Random(3)
    checked = read_back = 0
    for name in ("gpt2", "llama7", "t5", "bert"):
        model = models[name]
        gbs = model.spec.global_batch_size
        places = sorted({t for g in (7, 12, 20, 33, 64) for t in trims(packed(g, 8))}
                        | {(6, 6, 6), (4, 4, 4, 4), (7, 5), (6, 5, 1), (5, 5, 5, 3), (8, 2, 2)})
        items = [(p, c, q) for p in places for q in enumerate_plans(model, gbs, p) for c in (1, 4, 12)]
        assert len(items) > 100
        for refit in (False, True):
            if refit:  # new parameters: answers kept under the old ones are not read back
                params = {**oracle.params.get(name, PerfParams()).as_dict(), "k_const": 0.25}
                oracle.update(ModelUpdated(model_type=name, version=1, params=params, n_points=9, rmsle=0.1))
            rng.shuffle(items)
            at = 0
            while at < len(items):
                size = rng.choice([1, 2, 5, 8, 17, 40])
                part = items[at:at + size] + rng.sample(items[:at + 1], min(2, at + 1))  # some asked already
                kept = len(oracle._rows_answered.get(name, (0, {}))[1])
                times, plans = oracle.evaluate_many(model, gbs, part)
                want_t, want_ga = _worked_out(oracle, model, gbs, part)
                assert times.tolist() == want_t and [p.ga_steps for p in plans] == want_ga
                read_back += kept and len(oracle._rows_answered[name][1]) - kept < len(part)
                checked += len(part)
                at += size
    assert checked > 2_000 and read_back > 100


def test_a_kinds_number_in_the_books_keys_is_shared_by_equal_kinds_and_never_given_again(monkeypatch):
    """`PlanBook._key`: kinds equal in every field (at the same model version) share a number, so their best plans
    are found once; another kind, or the same one after a refit, takes a number no key had before, even once the
    registry was emptied (a number read back for other plans would answer for the wrong ones)."""
    from controlplane.events import ModelUpdated
    from policy import curves

    oracle, models = from_modeler(MODELER)
    book = PlanBook(oracle)
    a, b = (JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size) for _ in range(2))
    other = JobKind(models["gpt2"], 2 * models["gpt2"].spec.global_batch_size)
    assert a is not b and a == b
    ka, kb, ko = book._key(a), book._key(b), book._key(other)
    assert ka == kb and ko != ka and book._key(a) is ka
    book.best(a, (4,), 1)
    asked = book.evaluations
    assert asked > 0
    assert book.best(b, (4,), 1) is book.best(a, (4,), 1)  # the same kind: read back, not asked
    assert book.evaluations == asked
    params = dict(MODELER.types["gpt2"].params.as_dict())
    oracle.update(ModelUpdated(model_type="gpt2", version=2, params=params, n_points=12, rmsle=0.05))
    refit = book._key(a)
    assert refit not in (ka, ko) and book._key(b) == refit
    given = {ka, ko, refit}
    monkeypatch.setattr(curves, "_KIND_KEYS", {})  # emptied: every kind takes a new number
    monkeypatch.setattr(curves, "_KIND_KEYS_KEPT", 1)
    fresh = [book._key(JobKind(models[name], models[name].spec.global_batch_size)) for name in ("bert", "vit", "t5")]
    assert len(set(fresh)) == 3 and not given & set(fresh)
