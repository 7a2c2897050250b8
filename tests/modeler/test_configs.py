from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.events import Plan
from modeler.configs import Config, ConfigBatch, ConfigError, batch_from_records, divisors, layout, measured_times

ROW = {"model": "gpt2", "dp": "2", "tp": "4", "pp": "1", "zero_stage": "0", "offload": "0", "gc": "0",
       "ga_steps": "", "gpus_per_node": "8", "cpu_threads": "", "global_batch_size": "16"}


def test_layout_keeps_tp_inside_nodes_and_dp_across():
    lay = layout((4, 4, 4, 4), 4, 4, 1)
    assert (lay.tp_inter, lay.dp_inter, lay.pp_inter, lay.nodes) == (False, True, False, 4)
    # PP=2 over two full nodes: each stage is one node, so DP stays inside and PP crosses
    lay = layout((8, 8), 4, 2, 2)
    assert (lay.tp_inter, lay.dp_inter, lay.pp_inter) == (False, False, True)
    # TP=2 on nodes of 5 GPUs: some pairs must straddle two nodes
    assert layout((5,) * 8, 4, 2, 5).tp_inter


def test_single_node_has_no_crossing():
    assert layout((8,), 2, 2, 2) == layout((8,), 2, 2, 2)
    lay = layout((8,), 2, 2, 2)
    assert not (lay.tp_inter or lay.dp_inter or lay.pp_inter)


def test_row_is_read_and_empty_ga_left_to_the_modeler():
    batch = batch_from_records([ROW])
    assert len(batch) == 1 and batch.tp[0] == 4 and batch.ga_steps[0] == 0
    assert batch.cpus[0] != batch.cpus[0]  # NaN: the environment's default applies


@pytest.mark.parametrize("change, words", [
    ({"dp": "3"}, "dp*tp*pp = 3*4*1 = 12 but the placement 8 has 8 GPUs"),
    ({"zero_stage": "5"}, "zero_stage must be 0, 1, 2 or 3"),
    ({"offload": "2"}, "offload must be 0 or 1"),
    ({"offload": "1"}, "offload needs a ZeRO stage"),
    ({"gpus_per_node": "4;x"}, "gpus_per_node must be ';'-separated whole numbers"),
    ({"tp": "1.5"}, "tp must be a whole number"),
    ({"global_batch_size": "15"}, "not divisible by dp*ga_steps*micro_batches"),
])
def test_bad_rows_name_the_row(change, words):
    rows = [ROW, {**ROW, **change}]
    with pytest.raises(ConfigError) as err:
        batch_from_records(rows)
    assert err.value.row == 2
    assert words in str(err.value) and str(err.value).startswith("row 2:")


def test_tp_across_nodes_refused_when_the_spec_forbids_it():
    row = {**ROW, "dp": "1", "tp": "8", "pp": "1", "gpus_per_node": "4;4"}
    with pytest.raises(ConfigError, match="row 1: tp=8 does not fit inside the nodes"):
        batch_from_records([row], allow_tp_across_nodes=False)
    assert batch_from_records([row], allow_tp_across_nodes=True).tp_inter[0]


@pytest.mark.parametrize("value", ["nan", "", "0", "-1.5", "abc"])
def test_bad_measured_times_name_the_row(value):
    with pytest.raises(ConfigError, match="row 2: iter_time_s"):
        measured_times([{"iter_time_s": "1.0"}, {"iter_time_s": value}])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=8), st.data())
def test_layout_agrees_with_a_rank_walk(nodes, data):
    gpus = sum(nodes)
    divisors = [k for k in range(1, gpus + 1) if gpus % k == 0]
    tp = data.draw(st.sampled_from(divisors))
    pp = data.draw(st.sampled_from([k for k in divisors if (gpus // tp) % k == 0]))
    dp = gpus // (tp * pp)
    node_of = [n for n, g in enumerate(nodes) for _ in range(g)]

    def rank(i_tp, i_dp, i_pp):
        return i_tp + tp * (i_dp + dp * i_pp)

    tp_x = any(len({node_of[rank(i, j, k)] for i in range(tp)}) > 1 for j in range(dp) for k in range(pp))
    dp_x = any(len({node_of[rank(i, j, k)] for j in range(dp)}) > 1 for i in range(tp) for k in range(pp))
    pp_x = any(len({node_of[rank(i, j, k)] for k in range(pp)}) > 1 for i in range(tp) for j in range(dp))
    lay = layout(tuple(nodes), dp, tp, pp)
    assert (lay.tp_inter, lay.dp_inter, lay.pp_inter) == (tp_x, dp_x, pp_x)


def _walked(nodes: tuple[int, ...], dp: int, tp: int, pp: int) -> tuple[bool, bool, bool]:
    """(dp, tp, pp crossing nodes) read off every rank's node: rank = i_tp + tp * (i_dp + dp * i_pp)."""
    node_of = [n for n, g in enumerate(nodes) for _ in range(g)]

    def rank(i_tp, i_dp, i_pp):
        return i_tp + tp * (i_dp + dp * i_pp)

    return (any(len({node_of[rank(i, j, k)] for j in range(dp)}) > 1 for i in range(tp) for k in range(pp)),
            any(len({node_of[rank(i, j, k)] for i in range(tp)}) > 1 for j in range(dp) for k in range(pp)),
            any(len({node_of[rank(i, j, k)] for k in range(pp)}) > 1 for i in range(tp) for j in range(dp)))


def test_layout_agrees_with_the_rank_walk_on_every_small_placement():
    """Every placement of up to 3 nodes of 0-8 GPUs and 4 nodes of 1-6 (in any order, empty nodes too), at every
    dp * tp * pp that fills it: the crossings, the node count and the smallest node."""
    import itertools

    places = [p for k in (1, 2, 3) for p in itertools.product(range(9), repeat=k) if sum(p)]
    places += list(itertools.product(range(1, 7), repeat=4))
    checked = 0
    for nodes in places:
        gpus = sum(nodes)
        for tp in (k for k in range(1, gpus + 1) if gpus % k == 0):
            for pp in (k for k in range(1, gpus // tp + 1) if (gpus // tp) % k == 0):
                dp = gpus // (tp * pp)
                lay = layout(nodes, dp, tp, pp)
                assert (lay.dp_inter, lay.tp_inter, lay.pp_inter) == _walked(nodes, dp, tp, pp), (nodes, dp, tp, pp)
                assert (lay.nodes, lay.min_node_gpus) == (len(nodes), min(nodes))
                checked += 1
    assert checked > 18_000


@pytest.mark.parametrize("nodes, dp, tp, pp", [((8,), 3, 1, 1), ((4, 4), 2, 2, 3), ((), 1, 1, 1), ((4, -2), 1, 2, 1)])
def test_layout_refuses_ranks_that_do_not_fill_the_placement(nodes, dp, tp, pp):
    with pytest.raises(ValueError):
        layout(nodes, dp, tp, pp)


def test_from_configs_matches_the_table_reader():
    cfg = Config(plan=Plan(dp=2, tp=4), gpus_per_node=(8,), cpus_per_gpu=None, global_batch_size=16, ga_auto=True)
    a = ConfigBatch.from_configs([cfg])
    b = batch_from_records([ROW])
    for name, value in a.__dict__.items():
        assert (value == getattr(b, name)).all() or name == "cpus"


@given(st.integers(min_value=1, max_value=5_000))
def test_divisors_are_every_divisor_lowest_first(n):
    assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)
