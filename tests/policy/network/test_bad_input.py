"""What the network package does with inputs it cannot use: a clear NetworkError (a ValueError), never a
ZeroDivisionError, an infinite rate or a flow silently dropped."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.events import Plan
from policy.network.echelon import EchelonFlow, Flow, tardiness
from policy.network.fluid import Pattern, Task, simulate
from policy.network.pattern import iteration_pattern, timing
from policy.network.rates import MODES, Active, allocate
from policy.network.topology import Network, NetworkError
from replay.config import load_parts

NAN, INF = float("nan"), float("inf")


def net2() -> Network:
    return Network.hose(["a", "b"], 1.0)


def one_task(task: Task, echelons=("e",)) -> Pattern:
    return Pattern("j", (task,), echelons)


def test_network_error_is_a_value_error():
    assert issubclass(NetworkError, ValueError)


# --- flow sizes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0.0, -1.0, NAN, INF, -INF, 0])
def test_a_flow_needs_a_finite_positive_size(size):
    with pytest.raises(NetworkError, match="size must be a finite number of bytes > 0"):
        Flow("a", "b", size).check()
    h = EchelonFlow("h", (Flow("a", "b", 1.0), Flow("a", "b", size)))
    with pytest.raises(NetworkError, match="EchelonFlow h flow 1 a->b: size must be"):
        h.check()


@pytest.mark.parametrize("size, message", [
    (-1.0, r"a flow \(a->b\) needs a finite size > 0 bytes"),
    (-INF, r"a flow \(a->b\) needs a finite size > 0 bytes"),
    (INF, r"a flow \(a->b\) needs a finite size > 0 bytes"),
])
def test_a_pattern_flow_with_a_bad_size_is_refused(size, message):
    p = one_task(Task(src="a", dst="b", size=size, echelon=0))
    with pytest.raises(NetworkError, match=message):
        p.check(net2())
    with pytest.raises(NetworkError, match=message):
        simulate(net2(), [p], "fair", iterations=1)


def test_a_pattern_flow_of_nan_bytes_is_refused():
    p = one_task(Task(src="a", dst="b", size=NAN, echelon=0))
    with pytest.raises(NetworkError, match="size"):
        p.check(net2())


def test_a_pattern_flow_of_zero_bytes_is_refused():
    p = one_task(Task(src="a", dst="b", size=0.0, echelon=0))
    with pytest.raises(NetworkError, match="bytes"):
        p.check(net2())


@pytest.mark.parametrize("duration", [-1.0, NAN, INF])
def test_a_compute_task_needs_finite_non_negative_seconds(duration):
    with pytest.raises(NetworkError, match="a compute task needs finite seconds >= 0"):
        one_task(Task(duration=duration)).check(net2())


@pytest.mark.parametrize("offset", [-1.0, NAN, INF])
def test_an_offset_must_be_finite_and_non_negative(offset):
    with pytest.raises(NetworkError, match="offset must be finite and >= 0"):
        one_task(Task(src="a", dst="b", size=1.0, echelon=0, offset=offset)).check(net2())
    with pytest.raises(NetworkError, match="offset must be a finite number of seconds >= 0"):
        Flow("a", "b", 1.0, offset).check()


# --- nodes --------------------------------------------------------------------------------------------------


def test_a_flow_naming_an_unknown_node_is_refused():
    with pytest.raises(NetworkError, match="unknown node 'z'"):
        net2().path("a", "z")
    with pytest.raises(NetworkError, match="unknown node 'z'"):
        net2().path("z", "a")
    p = one_task(Task(src="a", dst="z", size=1.0, echelon=0))
    with pytest.raises(NetworkError, match="unknown node 'z'"):
        simulate(net2(), [p], "echelonflow", iterations=1)


@pytest.fixture(scope="module")
def gpt2():
    parts = load_parts()
    m = parts.models["gpt2"]
    pp = parts.perf_params()["gpt2"]
    return parts, m, pp, parts.batches["gpt2"]


def test_a_placement_on_a_node_the_network_lacks_is_refused(gpt2):
    parts, m, pp, batch = gpt2
    plan = Plan(dp=16)
    tm = timing(m, parts.env, pp, plan, (8, 8), batch)
    p = iteration_pattern("j", plan, [("n0", 8), ("n1", 8)], m, tm, batch)
    assert p is not None and p.flows  # the ring crosses n0 <-> n1
    with pytest.raises(NetworkError, match="unknown node 'n1'"):
        simulate(Network.hose(["n0", "n2"], 12.5e9), [p], "echelonflow", iterations=1)


@pytest.mark.parametrize("placement, message", [
    ([], "an empty placement"),
    ([("n0", 0)], "an empty placement"),
    ([("n0", 4), ("n0", 4)], "a node appears twice"),
    ([("n0", 4), ("n1", 2)], "has 6 GPUs"),
])
def test_a_bad_placement_is_refused(gpt2, placement, message):
    parts, m, pp, batch = gpt2
    tm = timing(m, parts.env, pp, Plan(dp=8), (8,), batch)
    with pytest.raises(NetworkError, match=message):
        iteration_pattern("j", Plan(dp=8), placement, m, tm, batch)


def test_a_job_on_one_node_puts_nothing_on_the_network(gpt2):
    parts, m, pp, batch = gpt2
    tm = timing(m, parts.env, pp, Plan(dp=8), (8,), batch)
    assert iteration_pattern("j", Plan(dp=8), [("n0", 8)], m, tm, batch) is None


def test_a_flow_from_a_node_to_itself_is_refused():
    with pytest.raises(NetworkError, match="a flow from a to itself crosses no network link"):
        net2().path("a", "a")
    with pytest.raises(NetworkError, match="a flow from a to itself is not a network flow"):
        Flow("a", "a", 1.0).check()
    with pytest.raises(NetworkError, match="to itself"):
        simulate(net2(), [one_task(Task(src="b", dst="b", size=1.0, echelon=0))], "fair", iterations=1)


# --- topology -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [0.0, -1.0, NAN, INF, -INF, True])
def test_a_nic_capacity_must_be_finite_and_positive(cap):
    with pytest.raises(NetworkError, match="NIC capacity must be a finite number > 0"):
        Network.hose(["a", "b"], cap)
    with pytest.raises(NetworkError, match="node b: NIC capacity"):
        Network.hose({"a": 1.0, "b": cap})


@pytest.mark.parametrize("over", [0.5, 0.0, -2.0, NAN, INF])
def test_an_oversubscription_below_one_is_refused(over):
    with pytest.raises(NetworkError, match="oversubscription must be a finite number >= 1"):
        Network.hose(["a", "b"], 1.0, rack_size=1, oversubscription=over)


@pytest.mark.parametrize("kw, message", [
    (dict(nics=[], nic_bps=1.0), "at least one node"),
    (dict(nics=["a", "a"], nic_bps=1.0), "unique"),
    (dict(nics=["a", "b"], nic_bps=None), "give each node's NIC capacity"),
    (dict(nics=["a", "b"], nic_bps=1.0, rack_size=-1), "rack_size must be a whole number"),
    (dict(nics=["a", "b"], nic_bps=1.0, rack_size=1.5), "rack_size must be a whole number"),
])
def test_a_malformed_network_is_refused(kw, message):
    nics = kw.pop("nics")
    with pytest.raises(NetworkError, match=message):
        Network.hose(nics, **kw)


def test_capacities_and_node_count_must_agree():
    with pytest.raises(NetworkError, match="2 nodes but 1 NIC capacities"):
        Network(("a", "b"), (1.0,))


# --- patterns and runs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after", [(1,), (0,), (-1,)])
def test_a_task_may_only_come_after_earlier_tasks(after):
    # task 0 after task 1 (a later one), after itself, or after a negative index
    p = Pattern("j", (Task(after=after, duration=1.0), Task(duration=1.0)))
    with pytest.raises(NetworkError, match="task 0: it may come only after earlier tasks"):
        p.check(net2())


def test_other_malformed_patterns_are_refused():
    with pytest.raises(NetworkError, match="an iteration with no tasks"):
        Pattern("j", ()).check(net2())
    with pytest.raises(NetworkError, match="unknown EchelonFlow 1"):
        one_task(Task(src="a", dst="b", size=1.0, echelon=1)).check(net2())
    with pytest.raises(NetworkError, match="unknown EchelonFlow -1"):
        one_task(Task(src="a", dst="b", size=1.0)).check(net2())  # a flow without an EchelonFlow
    p = one_task(Task(src="a", dst="b", size=1.0, echelon=0))
    with pytest.raises(NetworkError, match="each job may appear once"):
        simulate(net2(), [p, p], "fair")
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        simulate(net2(), [p], "fair", iterations=0)
    with pytest.raises(ValueError, match="one start time per job"):
        simulate(net2(), [p], "fair", starts=[0.0, 1.0])
    with pytest.raises(ValueError, match="unknown network mode 'fastest'"):
        simulate(net2(), [p], "fastest", iterations=1)


@pytest.mark.parametrize("weight", [0.0, -1.0, NAN])
def test_a_pattern_weight_must_be_finite_and_positive(weight):
    p = Pattern("j", (Task(src="a", dst="b", size=1.0, echelon=0),), ("e",), weight=weight)
    q = Pattern("k", (Task(src="a", dst="b", size=2.0, echelon=0),), ("e",))
    with pytest.raises(NetworkError, match="weight"):
        simulate(net2(), [p, q], "echelonflow", iterations=1)


@pytest.mark.parametrize("start", [NAN, INF])
def test_a_start_time_must_be_finite(start):
    p = Pattern("j", (Task(src="a", dst="b", size=1.0, echelon=0),), ("e",))
    with pytest.raises(ValueError, match="start"):
        simulate(net2(), [p], "fair", iterations=1, starts=[start])


def test_malformed_echelonflows_are_refused():
    with pytest.raises(NetworkError, match="EchelonFlow h: no flows"):
        EchelonFlow("h", ()).check()
    for w in (0.0, -1.0, NAN, INF):
        with pytest.raises(NetworkError, match="weight must be a finite number > 0"):
            EchelonFlow("h", (Flow("a", "b", 1.0),), weight=w).check()
    with pytest.raises(ValueError, match="one finish time per ideal finish time"):
        tardiness([], [])
    with pytest.raises(ValueError, match="one finish time per ideal finish time"):
        tardiness([1.0], [1.0, 2.0])


# --- rates at awkward instants ------------------------------------------------------------------------------------


def active(net: Network, remaining, deadline, group=None) -> Active:
    n = len(remaining)
    paths = np.asarray([net.path("a", "b")] * n, dtype=np.int64)
    return Active(net.capacity, paths, np.asarray(remaining, dtype=float), np.asarray(deadline, dtype=float),
                  np.zeros(n, dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64))


def test_allocate_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="unknown network mode 'x'; expected one of fair, coflow"):
        allocate("x", active(net2(), [1.0], [0.0]), 0.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("remaining, deadline", [
    ([1.0], [0.0]),                      # ideal finish now: no time left at all
    ([1.0, 1.0], [0.0, 0.0]),            # two of them
    ([1.0, 2.0], [-5.0, 0.0]),           # one already late
    ([1e-12, 1.0], [0.0, 1e-12]),        # almost done, ideal finish almost now
    ([1.0, 1.0], [1e9, -1e9]),           # far apart
])
def test_rates_stay_finite_when_ideal_times_are_now_or_past(mode, remaining, deadline):
    net = net2()
    rates = allocate(mode, active(net, remaining, deadline, group=range(len(remaining))), 0.0)
    assert np.all(np.isfinite(rates)) and np.all(rates >= 0)
    # both share a's up link (1 byte/s): full, never over
    assert sum(rates) == pytest.approx(1.0)
    rates = allocate(mode, active(net, remaining, deadline), 0.0)  # the same flows in one EchelonFlow
    assert np.all(np.isfinite(rates)) and sum(rates) == pytest.approx(1.0)


def test_an_empty_flow_set_gets_no_rates():
    net = net2()
    a = Active(net.capacity, np.zeros((0, 2), dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64))
    for mode in MODES:
        assert allocate(mode, a, 0.0).shape == (0,)


def test_a_nearly_done_late_flow_beside_another_does_not_divide_by_zero():
    # One EchelonFlow, two flows on a's up link of 1e9 bytes/s: 1 byte due now, 1e-9 bytes 8 s late.
    # The start of the search, max(1 / 1e9 - 0, 1e-9 / 1e9 + 8), is 8 + 1e-18 = 8.0 in floating point,
    # so the late flow's x + T is exactly 0.
    net = Network.hose(["a", "b"], 1e9)
    rates = allocate("echelonflow", active(net, [1.0, 1e-9], [0.0, -8.0]), 0.0)
    assert np.all(np.isfinite(rates)) and sum(rates) == pytest.approx(1e9)
