"""The speed ceiling (`PlanBook.ceiling`, `ModelOracle.time_floor`): no plan of a kind, on any placement of up to so
many GPUs and at any count of CPUs per GPU, is faster than it, on the fitted parameters and on random ones; where the
GPUs fit on one node it is the best plan's speed there, exactly; and where the model gives no floor, there is none."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from modeler.perf_model import PARAM_NAMES, PerfParams
from modeler.service import make_core
from policy.curves import JobKind, PlanBook
from policy.oracle import from_modeler

MODELER = make_core()
NAMES = ["gpt2", "bert", "vit", "roberta", "t5", "llama7", "llama30"]


def placements(most: int, node: int) -> list[tuple[int, ...]]:
    """Every placement of 1 to `most` GPUs on nodes of at most `node` each (canonical: largest node first)."""
    out: list[tuple[int, ...]] = []

    def grow(left: int, cap: int, head: tuple[int, ...]) -> None:
        if head:
            out.append(head)
        for g in range(min(left, cap), 0, -1):
            grow(left - g, g, head + (g,))

    grow(most, node, ())
    return out


def random_params(rng: random.Random) -> PerfParams:
    base = PerfParams().as_dict()
    return PerfParams(**{k: base[k] * rng.uniform(0.2, 5.0) + (0.01 if k == "k_pp" else 0.0) for k in PARAM_NAMES})


def check(book: PlanBook, kind: JobKind, most: int, node: int, counts: tuple[int, ...]) -> int:
    """Every placement up to `most` GPUs at each CPU count against the ceiling; the placements with a plan."""
    places = placements(most, node)
    book.fill(kind, [(p, c) for p in places for c in counts])
    ran = 0
    for place in places:
        top = book.ceiling(kind, sum(place), node)
        assert top is not None
        for c in counts:
            best = book.best(kind, place, c)
            assert best.throughput <= top, (place, c, best, top)
            ran += best.plan is not None
    tops = [book.ceiling(kind, g, node) for g in range(1, most + 1)]
    assert tops == sorted(tops)  # up to more GPUs, never less
    return ran


@pytest.mark.parametrize("name", NAMES)
def test_no_placement_beats_the_ceiling_on_the_fitted_parameters(name):
    oracle, models = from_modeler(MODELER)
    model = models[name]
    for batch in (model.spec.global_batch_size, model.spec.global_batch_size * 2):
        kind = JobKind(model, batch)
        book = PlanBook(oracle)
        assert check(book, kind, 14, 8, (1, 4, book.max_cpus_per_gpu)) > 5
        # up to one node, the ceiling is the best plan on one node at the most CPUs, exactly: the floor is that time
        cpus = book.max_cpus_per_gpu
        for g in range(1, 9):
            assert book.ceiling(kind, g, 8) == max(book.best(kind, (h,), cpus).throughput for h in range(1, g + 1))
        # past one node, at least what the packed placements give (the policy's curve at the most CPUs)
        curve = book.gpu_curve(kind, cpus)
        assert all(book.ceiling(kind, g, 8) >= curve[g] for g in range(1, book.max_gpus + 1))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_placement_beats_the_ceiling_on_random_parameters(seed):
    rng = random.Random(seed)
    oracle, models = from_modeler(MODELER)
    for name in rng.sample(NAMES, 3):
        oracle.params[name] = random_params(rng)
        oracle.versions[name] = oracle.versions.get(name, 0) + 1
        kind = JobKind(models[name], models[name].spec.global_batch_size)
        assert check(PlanBook(oracle), kind, 12, 8, (1, 3, 12)) > 5


def test_a_node_larger_than_the_books_counts():
    """On nodes of 16 GPUs, more than 8 GPUs may sit on one node, no group crossing: the ceiling the policy asks with
    its largest node (`RubickEngine._node_most`) covers them."""
    oracle, models = from_modeler(MODELER)
    kind = JobKind(models["bert"], models["bert"].spec.global_batch_size)
    book = PlanBook(oracle)
    assert check(book, kind, 16, 16, (1,)) > 20
    one = [g for g in range(9, 17) if book.best(kind, (g,), 1).plan is not None]
    assert one and all(book.ceiling(kind, g, 16) >= book.best(kind, (g,), 1).throughput for g in one)


def test_no_ceiling_where_the_model_gives_no_floor():
    oracle, models = from_modeler(MODELER)
    kind = JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    book = PlanBook(oracle)
    assert book.ceiling(kind, book.max_gpus + 1, 8) is None  # past the curves
    assert book.ceiling(kind, 4, 0) is None  # no node with a GPU: no placement to bound
    oracle.params["gpt2"] = replace(oracle.params.get("gpt2", PerfParams()), k_sync=0.0)
    oracle.versions["gpt2"] = oracle.versions.get("gpt2", 0) + 1
    calls = []
    real = oracle.time_floor
    oracle.time_floor = lambda *args: calls.append(args) or real(*args)
    assert book.ceiling(kind, 4, 8) is None  # an overlap exponent of 0: the overlap is not monotone
    assert book.ceiling(kind, 6, 8) is None and len(calls) == 1  # asked once for the model's version
    oracle.params["gpt2"] = PerfParams()
    oracle.versions["gpt2"] += 1
    assert book.ceiling(kind, 4, 8) is not None
    fast_link = replace(oracle, env=replace(oracle.env, b_inter_gbps=oracle.env.b_intra_gbps * 100))
    assert PlanBook(fast_link).ceiling(kind, 4, 8) is None  # crossing nodes would be faster: no floor

    class Measured:  # an oracle without a floor (a table of measured times)
        def version(self, model_type):
            return 0

    assert PlanBook(Measured()).ceiling(kind, 4, 8) is None


@pytest.mark.parametrize("host_gb", [24.0, 60.0, 100.0, 140.0])
def test_no_placement_beats_the_ceiling_where_host_memory_is_short(host_gb):
    """With little host memory a node, ZeRO-Offload fits only on enough nodes: the ceiling still covers every
    placement (a plan's host memory is worked out on as many nodes as it has GPUs)."""
    oracle, models = from_modeler(MODELER)
    oracle = replace(oracle, env=replace(oracle.env, host_mem_gb=host_gb))
    for name in ("llama7", "gpt2", "t5"):
        kind = JobKind(models[name], models[name].spec.global_batch_size)
        assert check(PlanBook(oracle), kind, 12, 8, (1, 12)) > 5
