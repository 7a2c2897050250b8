"""`_mark_in_tail` marks the same tail positions whichever way it looks the nodes up: by bisection in the tail's
names (a few nodes) or in its arrays (many). Each list of nodes is checked against reading the tail name by name, with
nodes outside the tail, before its first name and after its last, repeated nodes and none."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest

from policy import engine_index
from policy.engine_index import _NodeIndex


def _case(rng: random.Random) -> tuple[SimpleNamespace, list[str], np.ndarray]:
    by_name = sorted(f"node-{i:03d}" for i in rng.sample(range(1000), rng.randint(1, 300)))
    nidx = {n: i for i, n in enumerate(by_name)}
    tidx = np.array(sorted(rng.sample(range(len(by_name)), rng.randint(1, len(by_name)))), dtype=np.intp)
    return SimpleNamespace(_nidx=nidx, _by_name=by_name), [by_name[i] for i in tidx], tidx


@pytest.mark.parametrize("count", [0, 1, 3, engine_index._MARK_BY_NAME, engine_index._MARK_BY_NAME + 1, 60])
def test_the_marks_are_the_tail_positions_of_the_nodes_given(count: int) -> None:
    rng = random.Random(count)
    for _ in range(200):
        index, tail, tidx = _case(rng)
        nodes = [rng.choice(index._by_name) for _ in range(count)]
        if nodes and rng.random() < 0.5:
            nodes[0] = tail[0] if rng.random() < 0.5 else tail[-1]  # the tail's ends
        mask = np.zeros(len(tail), dtype=bool)
        _NodeIndex._mark_in_tail(index, mask, tail, tidx, nodes)
        assert mask.tolist() == [name in nodes for name in tail]


def test_marks_already_set_stay_set() -> None:
    rng = random.Random(7)
    for count in (2, engine_index._MARK_BY_NAME + 5):
        index, tail, tidx = _case(rng)
        before = np.array([rng.random() < 0.3 for _ in tail], dtype=bool)
        nodes = [rng.choice(index._by_name) for _ in range(count)]
        mask = before.copy()
        _NodeIndex._mark_in_tail(index, mask, tail, tidx, nodes)
        assert mask.tolist() == [b or name in nodes for b, name in zip(before.tolist(), tail)]
