"""The network the flows cross: each node's NIC (up and down), optionally racks behind a core.

Hose model: every node has one link up (its NIC sending) and one down (receiving), each of the NIC's
capacity; the fabric between NICs is non-blocking. Two-tier: nodes sit in racks of `rack_size`; a
flow between racks also crosses its source rack's uplink and its destination rack's downlink, each
of capacity (sum of the rack's NIC capacities) / `oversubscription`. A flow inside one node crosses
no link and is never a network flow.

Links are numbered: node i's up link is 2i, its down link 2i + 1; rack k's uplink is 2N + 2k and its
downlink 2N + 2k + 1 (N nodes). Capacities are bytes per second. Pure code: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np


class NetworkError(ValueError):
    """A network description or a flow the network cannot carry."""


@dataclass(frozen=True)
class Network:
    nodes: tuple[str, ...]
    nic_bps: tuple[float, ...]
    """Each node's NIC capacity, bytes/s, up and down alike."""
    rack_size: int = 0
    """Nodes per rack (in `nodes` order); 0: one non-blocking tier (the hose model alone)."""
    oversubscription: float = 1.0
    """Rack uplink capacity = the rack's NIC capacity / this (two-tier only)."""
    index: dict[str, int] = field(init=False, repr=False, compare=False)
    capacity: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise NetworkError("a network needs at least one node")
        if len(set(self.nodes)) != len(self.nodes):
            raise NetworkError("node names must be unique")
        if len(self.nic_bps) != len(self.nodes):
            raise NetworkError(f"{len(self.nodes)} nodes but {len(self.nic_bps)} NIC capacities")
        for node, c in zip(self.nodes, self.nic_bps):
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0:
                raise NetworkError(f"node {node}: NIC capacity must be a finite number > 0 bytes/s, got {c!r}")
        if isinstance(self.rack_size, bool) or not isinstance(self.rack_size, int) or self.rack_size < 0:
            raise NetworkError(f"rack_size must be a whole number >= 0, got {self.rack_size!r}")
        o = self.oversubscription
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not math.isfinite(o) or o < 1:
            raise NetworkError(f"oversubscription must be a finite number >= 1, got {o!r}")
        object.__setattr__(self, "index", {n: i for i, n in enumerate(self.nodes)})
        caps = [c for nic in self.nic_bps for c in (float(nic), float(nic))]
        for k in range(self.racks):
            rack = self.nic_bps[k * self.rack_size:(k + 1) * self.rack_size]
            up = sum(rack) / float(self.oversubscription)
            caps += [up, up]
        object.__setattr__(self, "capacity", np.asarray(caps, dtype=np.float64))

    @staticmethod
    def hose(nics: Mapping[str, float] | Sequence[str], nic_bps: float | None = None, *, rack_size: int = 0,
             oversubscription: float = 1.0) -> "Network":
        """`hose({"a": 12.5e9, ...})`, or `hose(["a", "b"], 12.5e9)` for equal NICs."""
        if isinstance(nics, Mapping):
            nodes = tuple(nics)
            caps = tuple(nics[n] for n in nodes)
        else:
            nodes = tuple(nics)
            if nic_bps is None:
                raise NetworkError("give each node's NIC capacity, or one for all")
            caps = (nic_bps,) * len(nodes)
        return Network(nodes, caps, rack_size=rack_size, oversubscription=oversubscription)

    @property
    def racks(self) -> int:
        return 0 if self.rack_size == 0 else -(-len(self.nodes) // self.rack_size)

    @property
    def links(self) -> int:
        return len(self.capacity)

    def node(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise NetworkError(f"unknown node {name!r} (the network has {len(self.nodes)} nodes)") from None

    def path(self, src: str, dst: str) -> tuple[int, ...]:
        """The links a flow from `src` to `dst` crosses (2 in one tier or one rack, 4 across racks)."""
        i, j = self.node(src), self.node(dst)
        if i == j:
            raise NetworkError(f"a flow from {src} to itself crosses no network link")
        links = (2 * i, 2 * j + 1)
        if self.rack_size:
            ri, rj = i // self.rack_size, j // self.rack_size
            if ri != rj:
                base = 2 * len(self.nodes)
                links = (2 * i, base + 2 * ri, base + 2 * rj + 1, 2 * j + 1)
        return links

    def link_name(self, link: int) -> str:
        n = len(self.nodes)
        if link < 2 * n:
            return f"{self.nodes[link // 2]} {'up' if link % 2 == 0 else 'down'}"
        k = (link - 2 * n) // 2
        return f"rack {k} {'uplink' if link % 2 == 0 else 'downlink'}"
