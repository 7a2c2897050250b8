"""The placement a round begins from (`_place_current`), kept from the last round and patched (`_PlaceBase`,
`_patch_placement`), is the one placing every job again makes, and decides the same."""

from __future__ import annotations

import pytest

from controlplane.events import Plan
from policy import engine as engine_mod
from policy import engine_place
from policy.oracle import from_modeler
from policy.registry import make_policy

from .test_round_memos import MODELER, drive


def _state(engine) -> tuple:
    """What `_place_current` leaves, floats by their exact bits (a node's free memory is a float sum: its order
    shows in the last bit)."""
    jobs = {j.id: (j.g, dict(j.g_on), dict(j.c_on), {n: m.hex() for n, m in j.mem_on.items()}, j.whole, j.forced,
                   j.reason, j.best, j.placed)
            for j in (*engine._awake, *engine._dormant.values())}  # placing every job wakes the dormant ones
    free = engine._free_index()  # the nodes with free GPUs in order, as the round's first need of them finds them
    assert free == _free_keys(engine.free_g, engine._pos)
    assert engine._free_key_of == {k[2]: k for k in free}
    return (list(engine.free_g.items()), list(engine.free_c.items()), [(n, m.hex()) for n, m in engine.free_m.items()],
            {n: set(ids) for n, ids in engine.on_node.items() if ids}, list(engine.on_node), set(engine.placed), jobs,
            list(free))


def _free_keys(free_g: dict, pos: dict) -> list:
    """The nodes with free GPUs in `RubickEngine._free_keys`' order, made from every node's free GPUs."""
    return sorted((-g, pos[n], n) for n, g in free_g.items() if g > 0)


def _kept(base) -> tuple:
    assert base.free_keys == _free_keys(base.free_g, base.layout[10])  # kept in order by the patch
    assert base.free_key_of == {k[2]: k for k in base.free_keys}
    return (dict(base.free_g), dict(base.free_c), {n: m.hex() for n, m in base.free_m.items()},
            {n: frozenset(ids) for n, ids in base.on_node.items()}, dict(base.placed), dict(base.rows),
            list(base.free_keys), dict(base.free_key_of))


@pytest.mark.parametrize(("seed", "owners", "cpus", "mem_gb"),
                         [(1, True, 96, 1600.0), (2, False, 96, 1600.0), (3, True, 12, 160.0), (4, False, 24, 120.0)])
def test_the_placement_patched_from_the_last_rounds_is_the_one_made_whole(monkeypatch, seed, owners, cpus, mem_gb):
    """After every round's `_place_current`, the free GPUs, CPUs and memory of every node (memory to the bit), the jobs
    on each node, the jobs placed, the nodes with free GPUs in order (kept with the placement, and copied) and every
    record awake or dormant are what placing every job again from the nodes' capacities makes, on the same records;
    the kept placement is as the last round left it when the next round comes (a round writes only its own copies);
    and the events are the bytes of a core that places every job again every round.
    `owners` loses every node for a while (the layout changes: placed whole again); few CPUs and little memory a node
    make memory and CPUs short."""
    seen = _check_every_placement(monkeypatch)
    patched, _ = drive(seed, owners=owners, cpus=cpus, mem_gb=mem_gb)
    assert seen["patched"] > seen["rounds"] // 3, seen
    monkeypatch.setattr(engine_mod.RubickEngine, "_place_current", seen["real"])
    monkeypatch.setattr(engine_place._Placing, "_patch_placement", lambda self, base: False)
    whole, _ = drive(seed, owners=owners, cpus=cpus, mem_gb=mem_gb)
    assert patched == whole


def _check_every_placement(monkeypatch) -> dict:
    """`_place_current` checked after every round (the test above says what); the counts of rounds and patches."""
    real = engine_mod.RubickEngine._place_current
    seen = {"rounds": 0, "patched": 0, "snapshot": None, "real": real}

    def checked(self):
        before = getattr(self, "_place_base", None)
        if before is not None and seen["snapshot"] is not None:
            assert _kept(before) == seen["snapshot"]  # the last round wrote its own copies only
        real(self)
        base = self._place_base
        seen["rounds"] += 1
        seen["patched"] += base is not None and base is before
        mine = _state(self)
        free = (self._free_keys, self._free_key_of)
        for job in self._awake:  # as `_prepare` left them: the records not carried held nothing yet
            if job.inp.current and not job.carried:
                self._clear(job)
        self._place_base = None
        real(self)
        assert _state(self) == mine
        if base is not None:
            assert self.free_g is not base.free_g and self.on_node is not base.on_node
        self._place_base = base  # the patched one goes on, and the round on what it made
        self._free_keys, self._free_key_of = free
        seen["snapshot"] = _kept(base) if base is not None else None

    monkeypatch.setattr(engine_mod.RubickEngine, "_place_current", checked)
    return seen


def test_a_nodes_free_memory_patched_is_summed_in_the_rounds_order(monkeypatch):
    """Jobs holding host memory on one node, one going and one coming between rounds: the node's free memory is the
    capacity less each job's memory in the round's order (priority, then submission), to the bit, as placing every
    job again makes it; taking the one gone out and the one come in (another order of the same sums) would differ in
    the last bit here. Where the memory or the GPUs the jobs hold are more than the node's, nothing is patched: the last
    job in order is cut, as placing every job finds; so is a job on a node the round does not have."""
    seen = _check_every_placement(monkeypatch)
    oracle, models = from_modeler(MODELER)
    engine = make_policy("rubick", oracle=oracle, models=models).engine
    kind = engine_mod.JobKind(models["gpt2"], models["gpt2"].spec.global_batch_size)
    nodes = [engine_mod.NodeCap("n0", 8, 96, 1.0), engine_mod.NodeCap("n1", 8, 96, 1.0)]
    plan = Plan(dp=1)

    def running(name: str, order: int, mem: float, gpus: int = 1) -> engine_mod.JobIn:
        return engine_mod.JobIn(name, "t0", False, kind, order, gpus, 4 * gpus, plan, current={"n0": (gpus, 4 * gpus)},
                                current_mem={"n0": mem} if mem else {}, current_plan=plan, running=True, changed_s=0.0,
                                remaining_iters=1e6)

    a, b, c, d = running("a", 0, 0.1), running("b", 1, 0.2), running("c", 2, 0.15), running("d", 3, 0.3)
    engine.schedule(nodes, [a, b, c])
    assert engine.free_m["n0"] == ((1.0 - 0.1) - 0.2) - 0.15
    engine.schedule(nodes, [b, c, d])
    assert seen["patched"] == 1
    assert engine.free_m["n0"].hex() == (((1.0 - 0.2) - 0.15) - 0.3).hex()
    assert engine.free_m["n0"].hex() != ((((1.0 - 0.1) - 0.2) - 0.15) + 0.1 - 0.3).hex()
    big = running("e", 4, 0.5)  # b, c, d and e hold 1.15 GB of the node's 1.0: e is cut
    engine.schedule(nodes, [b, c, d, big])
    assert seen["patched"] == 1 and seen["rounds"] == 3
    assert not engine.jobs["e"].whole
    engine.schedule(nodes, [b, c, d])  # placed whole again: the last round cut a job, so nothing was kept
    wide = running("f", 5, 0.0, gpus=6)  # 6 GPUs where 5 are free: f is cut
    engine.schedule(nodes, [b, c, d, wide])
    assert seen["patched"] == 1 and seen["rounds"] == 5
    assert not engine.jobs["f"].whole and engine.jobs["f"].g == 5
    engine.schedule(nodes, [b, c, d])
    lost = engine_mod.JobIn("g", "t0", False, kind, 6, 1, 4, plan, current={"n9": (1, 4)}, current_plan=plan,
                            running=True, changed_s=0.0, remaining_iters=1e6)  # on a node the round does not have
    engine.schedule(nodes, [b, c, d, lost])
    assert seen["patched"] == 1 and seen["rounds"] == 7
    assert engine.jobs["g"].reason == "node-lost" and not engine.jobs["g"].whole
