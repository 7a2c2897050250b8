"""Small flow sets take a Python path through max-min, large ones numpy's: both must give the same rates."""

from __future__ import annotations

import numpy as np
import pytest

import policy.network.rates as rates
from policy.network.rates import MODES, Active, allocate
from policy.network.topology import Network


def random_active(seed: int, flows: int) -> tuple[Network, Active]:
    rng = np.random.default_rng(seed)
    nodes = [f"n{i}" for i in range(8)]
    net = Network.hose(dict(zip(nodes, rng.uniform(1.0, 4.0, len(nodes)).tolist())), rack_size=4,
                       oversubscription=2.0)
    L = net.links
    paths = []
    for _ in range(flows):
        a, b = rng.choice(len(nodes), 2, replace=False)
        p = net.path(nodes[a], nodes[b])
        paths.append(p + (L,) * (4 - len(p)))
    return net, Active(net.capacity, np.asarray(paths, dtype=np.int64), rng.uniform(0.5, 3.0, flows),
                       rng.uniform(-1.0, 2.0, flows), rng.integers(0, 6, flows), klass=rng.integers(0, 3, flows))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(5))
def test_the_python_and_numpy_paths_agree(mode, seed, monkeypatch):
    net, active = random_active(seed, 40)
    small = allocate(mode, active, 0.0)
    monkeypatch.setattr(rates, "SMALL", 0)
    large = allocate(mode, active, 0.0)
    assert small == pytest.approx(large, rel=1e-9, abs=1e-12)
    load = np.bincount(active.paths.ravel(), weights=np.repeat(small, 4), minlength=net.links + 1)[:net.links]
    assert np.all(load <= net.capacity * (1 + 1e-9))
