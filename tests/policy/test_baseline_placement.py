"""Baselines run a fixed-size request where a plan of it runs: the packed placement first, else an
equal split over more nodes (a LLaMA-30B plan measured only on six 4-GPU nodes)."""

from __future__ import annotations

import pytest

from controlplane.events import Plan
from policy.curves import request_placements

from .helpers import Clock, decisions, job, node, table_core

PP6_TP4 = Plan(dp=1, tp=4, pp=6)
"""Code 641 of the artifact: measured on 4;4;4;4;4;4 only, never on 8;8;8."""


def test_request_placements_start_packed_then_split_equally_over_more_nodes():
    assert request_placements(24, 8) == [(8, 8, 8), (6, 6, 6, 6), (4,) * 6, (3,) * 8, (2,) * 12, (1,) * 24]
    assert request_placements(20, 8)[:2] == [(8, 8, 4), (5, 5, 5, 5)]
    assert request_placements(3, 8) == [(3,), (1, 1, 1)]


@pytest.mark.parametrize("policy", ["synergy", "antman", "sia"])
def test_a_request_measured_only_on_a_split_runs_there_instead_of_waiting(policy):
    core = table_core(policy, ["llama30"])
    c = Clock()
    for i in range(6):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    out = core.handle(c.ev("job.submitted", job("big", "llama30", 4, PP6_TP4, 24, 24 * 8)))
    d = decisions(out)["big"]
    assert d.plan is not None and (d.plan.pp, d.plan.tp, d.plan.dp) == (6, 4, 1)
    assert sorted(s.gpus for s in d.allocation) == [4] * 6


def test_the_split_goes_to_the_nodes_with_the_fewest_free_gpus_that_hold_a_share():
    core = table_core("synergy", ["llama30", "vit"])
    c = Clock()
    for i in range(7):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    core.handle(c.ev("job.submitted", job("small", "vit", 64, Plan(dp=4), 4, 32)))  # 4 GPUs left on its node
    out = core.handle(c.ev("job.submitted", job("big", "llama30", 4, PP6_TP4, 24, 24 * 8)))
    d = decisions(out)["big"]
    nodes = {s.node: s.gpus for s in d.allocation}
    assert sorted(nodes.values()) == [4] * 6
    held = {n for n, (g, _, _) in core.last["small"].shares.items()}
    assert held <= set(nodes), "the node with 4 GPUs left is used before whole free nodes"


def test_without_room_for_any_split_the_request_waits():
    core = table_core("synergy", ["llama30"])
    c = Clock()
    for i in range(3):
        core.handle(c.ev("node.registered", node(f"n{i}")))
    out = core.handle(c.ev("job.submitted", job("big", "llama30", 4, PP6_TP4, 24, 24 * 8)))
    assert "big" not in decisions(out)  # nothing changed for it: it stays queued
    assert not core.last["big"].shares and core.last["big"].reason == "queued"
