"""Invariants of the rate allocation and the fluid simulator on random networks and flow sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.network.fluid import Pattern, Task, simulate
from policy.network.rates import MODES, Active, allocate
from policy.network.topology import Network

REL = 1e-6

sizes = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
capacities = st.floats(min_value=1e-2, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def networks(draw, max_nodes: int = 6) -> Network:
    n = draw(st.integers(2, max_nodes))
    nodes = [f"n{i}" for i in range(n)]
    caps = draw(st.lists(capacities, min_size=n, max_size=n))
    if draw(st.booleans()):
        return Network.hose(dict(zip(nodes, caps)))
    rack = draw(st.integers(1, n))
    over = draw(st.floats(min_value=1.0, max_value=8.0))
    return Network.hose(dict(zip(nodes, caps)), rack_size=rack, oversubscription=over)


def padded(net: Network, pairs) -> np.ndarray:
    k = 4 if net.rack_size else 2
    return np.asarray([net.path(s, d) + (net.links,) * (k - len(net.path(s, d))) for s, d in pairs], dtype=np.int64)


@st.composite
def flow_sets(draw):
    net = draw(networks())
    f = draw(st.integers(1, 12))
    g = draw(st.integers(1, 4))
    pairs = []
    for _ in range(f):
        i = draw(st.integers(0, len(net.nodes) - 1))
        j = draw(st.integers(0, len(net.nodes) - 2))
        j = j + 1 if j >= i else j
        pairs.append((net.nodes[i], net.nodes[j]))
    now = draw(st.floats(min_value=0.0, max_value=100.0))
    active = Active(
        capacity=net.capacity,
        paths=padded(net, pairs),
        remaining=np.asarray(draw(st.lists(sizes, min_size=f, max_size=f))),
        deadline=now + np.asarray(draw(st.lists(st.floats(-20.0, 20.0), min_size=f, max_size=f))),
        group=np.asarray(draw(st.lists(st.integers(0, g - 1), min_size=f, max_size=f)), dtype=np.int64),
        weight=np.asarray(draw(st.lists(st.floats(0.1, 10.0), min_size=g, max_size=g))),
        klass=np.asarray(draw(st.lists(st.integers(0, 2), min_size=f, max_size=f)), dtype=np.int64),
    )
    return net, active, now


def link_load(net: Network, active: Active, rates: np.ndarray) -> np.ndarray:
    k = active.paths.shape[1]
    return np.bincount(active.paths.ravel(), weights=np.repeat(rates, k), minlength=net.links + 1)[:net.links]


@settings(max_examples=300, deadline=None)
@given(flow_sets())
def test_every_mode_gives_feasible_work_conserving_repeatable_rates(case):
    net, active, now = case
    cap = net.capacity
    for mode in MODES:
        rates = allocate(mode, active, now)
        assert rates.shape == (len(active),)
        assert np.all(np.isfinite(rates)) and np.all(rates >= 0), (mode, rates)
        load = link_load(net, active, rates)
        assert np.all(load <= cap * (1 + REL)), (mode, load, cap)
        saturated = np.append(load >= cap * (1 - REL), False)
        for i in range(len(active)):
            if active.remaining[i] > 0:
                assert saturated[active.paths[i]].any(), (mode, i, rates, load, cap)
        again = allocate(mode, active, now)
        assert again.tobytes() == rates.tobytes(), mode
        copy = Active(*(None if v is None else v.copy() for v in vars(active).values()))
        assert allocate(mode, copy, now).tobytes() == rates.tobytes(), mode


@settings(max_examples=50, deadline=None)
@given(flow_sets())
def test_allocate_leaves_its_inputs_alone(case):
    net, active, now = case
    before = [a.copy() for a in (active.capacity, active.paths, active.remaining, active.deadline, active.group)]
    for mode in MODES:
        allocate(mode, active, now)
    after = (active.capacity, active.paths, active.remaining, active.deadline, active.group)
    assert all(b.tobytes() == a.tobytes() for b, a in zip(before, after))


# --- the fluid simulator ---------------------------------------------------------------------------------


@st.composite
def staged_echelonflow(draw):
    """One EchelonFlow released in steps: a compute task of g_k seconds, then a set of flows that share no link
    (each alone moves at its path's line rate b / c), the next compute once all of them are in. With the
    step's release R_k known, each flow's ideal finish is set to R_k + b / c + slack (slack >= 0) after the
    reference r = R_0: every flow can be on time, so the EchelonFlow's smallest tardiness is
    max over flows of -slack <= 0, reached by giving each flow its line rate."""
    net = draw(networks(max_nodes=8))
    tasks: list[Task] = []
    released = 0.0
    expected = -math.inf
    ref = None
    before: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        gap = draw(st.floats(0.0, 3.0))
        tasks.append(Task(after=tuple(before), duration=gap))
        gate = len(tasks) - 1
        released += gap
        ref = released if ref is None else ref
        used: set[int] = set()
        step: list[int] = []
        longest = 0.0
        for _ in range(draw(st.integers(1, 3))):
            s, d = draw(st.sampled_from([(a, b) for a in net.nodes for b in net.nodes if a != b]))
            path = net.path(s, d)
            if used & set(path):
                continue
            used |= set(path)
            b = draw(st.floats(0.01, 10.0))
            alone = b / min(float(net.capacity[link]) for link in path)
            slack = draw(st.floats(0.0, 2.0))
            tasks.append(Task(after=(gate,), src=s, dst=d, size=b, echelon=0,
                              offset=released - ref + alone + slack))
            step.append(len(tasks) - 1)
            longest = max(longest, alone)
            expected = max(expected, -slack)
        released += longest
        before = step
    return net, Pattern("E", tuple(tasks), ("staged",)), expected


@settings(max_examples=100, deadline=None)
@given(staged_echelonflow())
def test_a_lone_echelonflow_with_slack_is_never_late(case):
    net, pattern, expected = case
    r = simulate(net, [pattern], "echelonflow", iterations=1)
    [(_, _, _, t)] = r.tardiness
    # A link with at most EPS * max(capacity, 1) left counts as full (rates.EPS = 1e-9), so a flow given a
    # just-in-time rate with a sliver of slack is not back-filled to line rate; it and the steps after it may land
    # that sliver later: "zero" is up to a millionth of the run.
    tol = 1e-6 * max(1.0, r.end_s)
    assert t <= tol
    assert t == pytest.approx(expected, abs=tol)


@pytest.mark.parametrize("offsets, smallest", [
    # FSDP prefetch: the first two all-gathers leave together, ideal finishes 0 and 1 (Tf = 1), 1 byte each on a
    # 1 byte/s link. In ideal-time order: e = 1, 2 -> max(1 - 0, 2 - 1) = 1, and the head flow alone needs 1 s,
    # so 1 is the smallest. Constant rates solve 1/T + 1/(1 + T) = 1 -> T = golden ratio ~ 1.618.
    ((0.0, 1.0), 1.0),
    # The same with one second of slack each (ideal finishes 1 and 2): in order e = 1, 2, tardiness 0;
    # constant rates: 1/(1 + T) + 1/(2 + T) = 1 -> T = 1/golden ratio ~ 0.618.
    ((1.0, 2.0), 0.0),
])
def test_a_lone_echelonflow_reaches_its_smallest_tardiness(offsets, smallest):
    net = Network.hose(["a", "b"], 1.0)
    p = Pattern("E", tuple(Task(src="a", dst="b", size=1.0, echelon=0, offset=o) for o in offsets), ("ag",))
    r = simulate(net, [p], "echelonflow", iterations=1)
    [(_, _, _, t)] = r.tardiness
    assert t == pytest.approx(smallest, abs=1e-9)


@pytest.mark.parametrize("mode", ["fair", "classes"])
def test_tiny_capacities_still_carry_their_flows(mode):
    net = Network.hose(["a", "b"], 1e-10)
    active = Active(net.capacity, padded(net, [("a", "b")]), np.asarray([1.0]), np.asarray([0.0]),
                    np.asarray([0]))
    # one flow alone on its links: the whole 1e-10 byte/s
    assert allocate(mode, active, 0.0) == pytest.approx([1e-10])


@st.composite
def workloads(draw):
    net = draw(networks(max_nodes=5))
    pairs = [(a, b) for a in net.nodes for b in net.nodes if a != b]
    patterns = []
    for j in range(draw(st.integers(1, 3))):
        tasks: list[Task] = []
        echelons = draw(st.integers(1, 3))
        for i in range(draw(st.integers(1, 6))):
            after = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=2)))) if i else ()
            if draw(st.booleans()):
                s, d = draw(st.sampled_from(pairs))
                tasks.append(Task(after=after, src=s, dst=d, size=draw(st.floats(0.01, 10.0)),
                                  echelon=draw(st.integers(0, echelons - 1)), offset=draw(st.floats(0.0, 5.0))))
            else:
                tasks.append(Task(after=after, duration=draw(st.floats(0.0, 3.0))))
        patterns.append(Pattern(f"j{j}", tuple(tasks), tuple(f"e{k}" for k in range(echelons)),
                                weight=draw(st.floats(0.5, 4.0)), klass=draw(st.integers(0, 2))))
    starts = draw(st.lists(st.floats(0.0, 5.0), min_size=len(patterns), max_size=len(patterns)))
    return net, patterns, starts


@settings(max_examples=80, deadline=None)
@given(workloads(), st.sampled_from(MODES))
def test_the_fluid_simulation_finishes_and_repeats_exactly(case, mode):
    net, patterns, starts = case
    a = simulate(net, patterns, mode, iterations=2, starts=starts)
    b = simulate(net, patterns, mode, iterations=2, starts=starts)
    assert a == b
    assert repr(a) == repr(b)
    # every job ran its two iterations, and every flow of each finished once per iteration
    assert sorted(a.finished) == sorted(p.job for p in patterns)
    for p, start in zip(patterns, starts):
        assert len(a.iterations[p.job]) == 2
        assert a.finished[p.job] >= start - 1e-12
        n_flows = sum(t.is_flow for t in p.tasks)
        assert sum(1 for j, *_ in a.flow_finish if j == p.job) == 2 * n_flows
        # one tardiness entry per EchelonFlow that has flows, per iteration
        used = {t.echelon for t in p.tasks if t.is_flow}
        assert sorted((it, e) for j, it, e, _ in a.tardiness if j == p.job) == \
            sorted((it, e) for it in range(2) for e in used)
    assert all(math.isfinite(t) for *_, t in a.tardiness)
