"""The case studies of echelonflow-proofs.txt (Coflow, pipeline, FSDP) and the two-job example, with
numbers worked out by hand.

Conventions in the comments: every NIC is 1 byte/s unless said otherwise, so a flow of b bytes alone on
its links takes b seconds; "x->y" is a flow from node x to node y (it crosses x's up link and y's down
link); Delta_j = e_j - d_j is flow j's tardiness (Eq. S1), t_H the EchelonFlow's (Eq. S2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from policy.network.echelon import (EchelonFlow, Flow, coflow_offsets, fsdp_offsets, pipeline_offsets,
                                    tardiness)
from policy.network.fluid import Pattern, Task, simulate
from policy.network.rates import MODES, Active, allocate
from policy.network.topology import Network

PHI = (1 + math.sqrt(5)) / 2


def finish(result, job: str, task: int, iteration: int = 0) -> float:
    hits = [t for j, it, ti, t in result.flow_finish if (j, it, ti) == (job, iteration, task)]
    assert len(hits) == 1, (job, task, result.flow_finish)
    return hits[0]


def late(result, job: str, echelon: int, iteration: int = 0) -> float:
    hits = [t for j, it, e, t in result.tardiness if (j, it, e) == (job, iteration, echelon)]
    assert len(hits) == 1, (job, echelon, result.tardiness)
    return hits[0]


class Builder:
    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def compute(self, seconds: float, after=()) -> int:
        self.tasks.append(Task(after=tuple(after), duration=seconds))
        return len(self.tasks) - 1

    def flow(self, src: str, dst: str, size: float, echelon: int, offset: float, after=()) -> int:
        self.tasks.append(Task(after=tuple(after), src=src, dst=dst, size=size, echelon=echelon, offset=offset))
        return len(self.tasks) - 1

    def pattern(self, job: str, echelons) -> Pattern:
        return Pattern(job, tuple(self.tasks), tuple(echelons))


# --- the arrangement functions ------------------------------------------------------------------------


def test_arrangement_functions_by_hand():
    # Eq. S5: a Coflow's flows all ideally finish at r
    assert coflow_offsets(3) == [0.0, 0.0, 0.0]
    # Eq. S8: d_j = d_{j-1} + T with T = 2
    assert pipeline_offsets(4, 2.0) == pytest.approx([0.0, 2.0, 4.0, 6.0])
    # Eq. S2: max(e_j - d_j) = max(3 - 1, 4 - 3, 4.5 - 5) = 2
    assert tardiness([3.0, 4.0, 4.5], [1.0, 3.0, 5.0]) == pytest.approx(2.0)


@pytest.mark.parametrize("tf, tb", [(1.0, 2.0), (0.5, 3.0)])
def test_fsdp_offsets_follow_eq_s12_for_three_layers(tf, tb):
    # Eq. S12, n = 3: C_0..C_2 forward, C_3..C_5 backward.
    #   d_c0 = r;  d_c1 = d_c0 + Tf;  d_c2 = d_c1 + Tf   (1 <= i <= n - 1 = 2)
    #   d_c3 = d_c2 + Tb;  d_c4 = d_c3 + Tb;  d_c5 = d_c4 + Tb   (n = 3 <= i <= 2n - 1 = 5)
    # (Tf, Tb) = (1, 2): [0, 1, 2, 4, 6, 8]; (0.5, 3): [0, 0.5, 1, 4, 7, 10]
    expected = [0.0, tf, 2 * tf, 2 * tf + tb, 2 * tf + 2 * tb, 2 * tf + 3 * tb]
    assert fsdp_offsets(3, tf, tb) == pytest.approx(expected)
    assert len(fsdp_offsets(3, tf, tb)) == 2 * 3


def test_as_coflow_keeps_the_flows_and_drops_the_arrangement():
    h = EchelonFlow("h", (Flow("a", "b", 1.0, 0.0), Flow("a", "b", 2.0, 3.0)), job="j", weight=2.0, kind="pipeline")
    c = h.as_coflow()
    assert [(f.src, f.dst, f.size, f.offset) for f in c.flows] == [("a", "b", 1.0, 0.0), ("a", "b", 2.0, 0.0)]
    assert (c.job, c.weight, c.kind) == ("j", 2.0, "coflow")


# --- Case I: a Coflow ----------------------------------------------------------------------------------


def one_link_coflow() -> Pattern:
    # a compute task of 1 s, then a Coflow of three flows into c: a->c 1 byte, b->c 3, d->c 2.
    # All three share c's down link: 6 bytes at 1 byte/s.
    b = Builder()
    c0 = b.compute(1.0)
    for src, size in (("a", 1.0), ("b", 3.0), ("d", 2.0)):
        b.flow(src, "c", size, 0, 0.0, [c0])
    return b.pattern("K", ("all-reduce",))


def test_case_i_madd_rates_finish_every_flow_together():
    # One instant, all three flows on c's down link (link 2*2+1 = 5): Gamma = 6 / 1 = 6 s, and MADD gives
    # every flow b_j / Gamma: 1/6, 3/6, 2/6 (the link exactly full, nothing left to back-fill).
    net = Network.hose(["a", "b", "c", "d"], 1.0)
    paths = np.asarray([net.path(s, "c") for s in ("a", "b", "d")], dtype=np.int64)
    active = Active(net.capacity, paths, np.asarray([1.0, 3.0, 2.0]), np.zeros(3), np.zeros(3, dtype=np.int64))
    for mode in ("coflow", "echelonflow"):
        assert allocate(mode, active, 0.0) == pytest.approx([1 / 6, 3 / 6, 2 / 6])


def test_case_i_coflow_tardiness_is_its_completion_time_minus_the_reference():
    net = Network.hose(["a", "b", "c", "d"], 1.0)
    p = one_link_coflow()
    # r = 1 (the flows are released when the compute task ends).
    # coflow / echelonflow: MADD rates 1/6, 3/6, 2/6, all three finish at r + 6 = 7 -> CCT 7, t = 7 - 1 = 6.
    for mode in ("coflow", "echelonflow"):
        r = simulate(net, [p], mode, iterations=1)
        assert [finish(r, "K", i) for i in (1, 2, 3)] == pytest.approx([7.0, 7.0, 7.0])
        assert late(r, "K", 0) == pytest.approx(7.0 - 1.0)
        assert r.finished["K"] == pytest.approx(7.0)
    # fair: 1/3 each; a->c (1 byte) done at 1 + 3 = 4; then d->c (1 left) and b->c (2 left) at 1/2: d->c done at
    # 6, b->c has 1 left and finishes alone at 7. Different finish times, the same CCT (one bottleneck).
    r = simulate(net, [p], "fair", iterations=1)
    assert [finish(r, "K", i) for i in (1, 2, 3)] == pytest.approx([4.0, 7.0, 6.0])
    assert late(r, "K", 0) == pytest.approx(6.0)


def test_case_i_coflow_on_shared_and_distinct_links():
    # Coflow released at 0: a->c 1 byte, b->c 3 bytes, a->d 1 byte.
    # Loads: a up 2, c down 4, b up 3, d down 1 -> Gamma = 4 (c down).
    # coflow: MADD gives b_j / 4: a->c 1/4, b->c 3/4, a->d 1/4; a up then has 1/2 left and d down 3/4, so the
    # back-fill raises a->d by 1/2 to 3/4. a->d is done at 1 / (3/4) = 4/3. At 4/3 a->c has 1 - 1/3 = 2/3 left and
    # b->c 3 - 1 = 2: Gamma = 8/3, rates 1/4, 3/4 again -> both done at 4/3 + 8/3 = 4.
    # The flows on the bottleneck finish together at Gamma; CCT = 4 = Gamma, tardiness 4 - r = 4 - 0.
    net = Network.hose(["a", "b", "c", "d"], 1.0)
    b = Builder()
    b.flow("a", "c", 1.0, 0, 0.0)
    b.flow("b", "c", 3.0, 0, 0.0)
    b.flow("a", "d", 1.0, 0, 0.0)
    p = b.pattern("K", ("all-reduce",))
    for mode in ("coflow", "echelonflow"):
        r = simulate(net, [p], mode, iterations=1)
        assert [finish(r, "K", i) for i in range(3)] == pytest.approx([4.0, 4.0, 4.0 / 3.0])
        assert late(r, "K", 0) == pytest.approx(4.0)
    # fair: a up (a->c, a->d) and c down (a->c, b->c) each give 1/2; a->c and a->d done at 2, then b->c alone
    # (2 left) done at 4: the same CCT.
    r = simulate(net, [p], "fair", iterations=1)
    assert [finish(r, "K", i) for i in range(3)] == pytest.approx([2.0, 4.0, 2.0])
    assert late(r, "K", 0) == pytest.approx(4.0)


# --- Case II: a pipeline ---------------------------------------------------------------------------------

T1, T2, T3 = 1.0, 2.0, 3.0   # compute of one micro-batch on workers w1, w2, w3
M = 3                        # micro-batches
ACT = 1.0                    # activation bytes per micro-batch


def three_stage_pipeline() -> tuple[Pattern, dict[str, list[int]]]:
    """GPipe forward over w1 -> w2 -> w3. H1 (echelon 0): the w1->w2 activations, offsets j*T2 (Eq. S8);
    H2 (echelon 1): the w2->w3 ones, offsets j*T3 (Eq. S9)."""
    b = Builder()
    ids: dict[str, list[int]] = {"F1": [], "A1": [], "F2": [], "A2": [], "F3": []}
    for j in range(M):
        ids["F1"].append(b.compute(T1, ids["F1"][-1:]))
    for j, off in enumerate(pipeline_offsets(M, T2)):
        ids["A1"].append(b.flow("w1", "w2", ACT, 0, off, [ids["F1"][j]]))
        ids["F2"].append(b.compute(T2, [ids["A1"][j]] + ids["F2"][-1:]))
    for j, off in enumerate(pipeline_offsets(M, T3)):
        ids["A2"].append(b.flow("w2", "w3", ACT, 1, off, [ids["F2"][j]]))
        ids["F3"].append(b.compute(T3, [ids["A2"][j]] + ids["F3"][-1:]))
    return b.pattern("P", ("pipeline activations 0->1", "pipeline activations 1->2")), ids


def competitor(src: str, dst: str, size: float) -> Pattern:
    return Pattern("C", (Task(src=src, dst=dst, size=size, echelon=0, offset=0.0),), ("dp all-reduce",))


SCENARIOS = {
    # name: (w1's NIC bytes/s, competing job or None)
    "alone": (1.0, None),
    "slow w1": (0.5, None),
    "competitor on w1 up": (1.0, ("w1", "x", 4.0)),
    "competitor on w2 down": (1.0, ("x", "w2", 3.0)),
}


def run_pipeline(mode: str, scenario: str):
    nic1, comp = SCENARIOS[scenario]
    net = Network.hose({"w1": nic1, "w2": 1.0, "w3": 1.0, "x": 1.0})
    p, ids = three_stage_pipeline()
    jobs = [p] + ([competitor(*comp)] if comp else [])
    return simulate(net, jobs, mode, iterations=1), ids


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("mode", MODES)
def test_case_ii_completion_is_a_constant_plus_the_echelonflow_tardiness(mode, scenario):
    # S11: stage 2's micro-batch j starts at max(end of j - 1, e_j), so its last one ends at
    #   max_j (e_j + (M - j) T2) = max_j (Delta_j + r1 + j T2 + (M - j) T2) = r1 + M T2 + t_H1,
    # r1 = T1 = 1 (the first activation leaves when w1's first micro-batch is done): stage 2 ends at 7 + t_H1.
    # Stage 2's end is seen on the network: the last w2->w3 flow leaves then and, alone on w2 up / w3 down
    # (the w2->w3 flows leave >= T2 = 2 s apart and each takes ACT / 1 = 1 s), finishes 1 s later.
    # Likewise the iteration (w3's last micro-batch) ends at r2 + M T3 + t_H2, r2 the first w2->w3 release.
    r, ids = run_pipeline(mode, scenario)
    t_h1, t_h2 = late(r, "P", 0), late(r, "P", 1)
    stage2_end = finish(r, "P", ids["A2"][-1]) - 1.0
    assert stage2_end - t_h1 == pytest.approx(T1 + M * T2)
    r2 = finish(r, "P", ids["A2"][0]) - 1.0
    assert r.finished["P"] - t_h2 == pytest.approx(r2 + M * T3)
    # t_H1 is the largest Delta_j, and no flow can beat its ideal finish alone: A1[0] takes >= 1 s from r1
    e = [finish(r, "P", i) for i in ids["A1"]]
    assert t_h1 == pytest.approx(max(ej - (T1 + dj) for ej, dj in zip(e, pipeline_offsets(M, T2))))
    assert t_h1 >= 1.0 - 1e-9


@pytest.mark.parametrize("mode, scenario, t_h1, completion", [
    # alone (any mode): A1[j] leaves at 1, 2, 3 and takes 1 s -> e = 2, 3, 4; d = 1, 3, 5 -> t_H1 = 1.
    # Stage 2: 2-4, 4-6, 6-8. A2 leaves at 4, 6, 8 -> e = 5, 7, 9; r2 = 4, d = 4, 7, 10 -> t_H2 = 1.
    # Stage 3: 5-8, 8-11, 11-14 -> 14 = r2 + 9 + t_H2.
    *[(m, "alone", 1.0, 14.0) for m in MODES],
    # competitor C: w1->x, 4 bytes from 0 (r = d = 0), echelonflow (ranked by Gamma, the bytes left on the
    # busiest link / its capacity; rates b / (d + max(T*, I_H, 0) - now)): C alone 0-1 (3 left). At 1: H1
    # (A1[0], d 1, Gamma 1) before C (Gamma 3): A1[0] full rate, done 2 (Delta 1, I_H1 = 1). At 2: A1[1]
    # (d 3, Gamma 1, T* = 0) may land at 3 + 1 at no cost: rate 1 / (1 + 1) = 1/2, C 1/2. At 3: A1[1] 1/2 left
    # (d 3), A1[2] 1 (d 5): Gamma 1.5 before C's 2.5; T* = max(0.5 - 0, 1.5 - 2) = 0.5 < I_H1, so the rates are
    # 0.5 / 1 and 1 / 3 and C takes the rest: A1[1] done at 4 (Delta 1); A1[2] has 2/3 left, rate
    # (2/3) / (1 + 1), done at 6 (Delta 1).
    # e = 2, 4, 6: Delta 1, 1, 1, t_H1 = 1 and stage 2 runs 2-4, 4-6, 6-8 as if alone: 14. C (7 bytes on
    # w1 up with A1's 3 bytes, the link never idle) ends at 7. The competitor is hidden behind the arrangement.
    ("echelonflow", "competitor on w1 up", 1.0, 14.0),
    # fair: C alone 0-1 (3 left). 1-2: A1[0], C at 1/2. 2-3: A1[0], A1[1], C at 1/3: A1[0] has 1/6 left, A1[1] 2/3.
    # From 3 four flows at 1/4: A1[0] done at 3 + 2/3 = 11/3 (A1[1] 1/2, A1[2] 5/6 left); three at 1/3: A1[1]
    # done at 11/3 + 3/2 = 31/6 (A1[2] 1/3 left); two at 1/2: A1[2] done at 31/6 + 2/3 = 35/6.
    # e = 11/3, 31/6, 35/6; d = 1, 3, 5 -> Delta = 8/3, 13/6, 5/6, t_H1 = 8/3.
    # Stage 2 ends at 7 + 8/3 = 29/3; r2 = 11/3 + 2 = 17/3, t_H2 = 1 -> 17/3 + 9 + 1 = 47/3.
    ("fair", "competitor on w1 up", 8.0 / 3.0, 47.0 / 3.0),
    # slow w1 (1/2 byte/s), fair: A1[0] alone 1-2 (1/2 left); 2-3 A1[0], A1[1] at 1/4 (1/4, 3/4 left);
    # 3-4.5 three at 1/6: A1[0] done at 4.5 (A1[1] 1/2, A1[2] 3/4 left); then 1/4 each: A1[1] done at 6.5,
    # A1[2] 1/4 left alone at 1/2 -> 7. Delta = 3.5, 3.5, 2 -> t_H1 = 3.5; stage 2 ends 10.5;
    # r2 = 4.5 + 2 = 6.5 -> 6.5 + 9 + 1 = 16.5.
    ("fair", "slow w1", 3.5, 16.5),
])
def test_case_ii_by_hand(mode, scenario, t_h1, completion):
    r, _ = run_pipeline(mode, scenario)
    assert late(r, "P", 0) == pytest.approx(t_h1)
    assert late(r, "P", 1) == pytest.approx(1.0)
    assert r.finished["P"] == pytest.approx(completion)


# --- Case III: FSDP ---------------------------------------------------------------------------------------

TF, TB = 1.0, 2.0   # one unit's forward / backward
AG, RS = 1.0, 1.0   # bytes per direction of one all-gather / reduce-scatter


def fsdp_pattern() -> tuple[Pattern, dict[str, list[int]]]:
    """Two units on two nodes a, b (a ring of two: each collective is a->b plus b->a). Every all-gather is a
    Coflow; together they are H1 (echelon 0, offsets Eq. S12 with n = 2: 0, Tf, Tf + Tb, Tf + 2 Tb = 0, 1, 3, 5);
    the reduce-scatters are H2 (echelon 1, offsets 0, Tb). The all-gather for the next compute is prefetched as
    the current compute starts (once the previous all-gather is in)."""
    d = fsdp_offsets(2, TF, TB)
    b = Builder()
    ids: dict[str, list[int]] = {}

    def ag(k: int, after) -> list[int]:
        ids[f"AG{k}"] = [b.flow("a", "b", AG, 0, d[k], after), b.flow("b", "a", AG, 0, d[k], after)]
        return ids[f"AG{k}"]

    def rs(k: int, offset: float, after) -> list[int]:
        ids[f"RS{k}"] = [b.flow("a", "b", RS, 1, offset, after), b.flow("b", "a", RS, 1, offset, after)]
        return ids[f"RS{k}"]

    ag0 = ag(0, [])
    f0 = b.compute(TF, ag0)
    ag1 = ag(1, ag0)
    f1 = b.compute(TF, [f0] + ag1)
    ag2 = ag(2, [f0] + ag1)
    b1 = b.compute(TB, [f1] + ag2)
    rs1 = rs(1, 0.0, [b1])
    ag3 = ag(3, [f1] + ag2)
    b0 = b.compute(TB, [b1] + ag3)
    rs0 = rs(0, TB, [b0])
    b.compute(0.0, [b0] + rs1 + rs0)
    return b.pattern("F", ("fsdp all-gathers", "fsdp reduce-scatters")), ids


def dp_job() -> Pattern:
    # a data-parallel job's all-reduce on the same pair of NICs: 4 bytes each way, released at 0 (r = d = 0)
    return Pattern("Q", (Task(src="a", dst="b", size=4.0, echelon=0), Task(src="b", dst="a", size=4.0, echelon=0)),
                   ("dp all-reduce",))


@pytest.mark.parametrize("mode", MODES)
def test_case_iii_fsdp_alone(mode):
    # Alone, each collective crosses its links by itself (a->b and b->a use different links): 1 s each.
    # AG0 0-1 (d 0, Delta 1); F0 1-2; AG1 1-2 (d 1, Delta 1); F1 2-3; AG2 2-3 (d 3, Delta 0);
    # B1 3-5; AG3 3-4 (d 5, Delta -1); RS1 5-6 (r2 = 5, d 5, Delta 1); B0 5-7; RS0 7-8 (d 5 + Tb = 7, Delta 1).
    # t_H1 = 1, t_H2 = 1, iteration 8.
    net = Network.hose(["a", "b"], 1.0)
    p, ids = fsdp_pattern()
    r = simulate(net, [p], mode, iterations=1)
    for name, e in (("AG0", 1.0), ("AG1", 2.0), ("AG2", 3.0), ("AG3", 4.0), ("RS1", 6.0), ("RS0", 8.0)):
        assert [finish(r, "F", i) for i in ids[name]] == pytest.approx([e, e]), name
    assert late(r, "F", 0) == pytest.approx(1.0)
    assert late(r, "F", 1) == pytest.approx(1.0)
    assert r.finished["F"] == pytest.approx(8.0)


def test_case_iii_fsdp_against_a_dp_job_echelonflow():
    # Q competes on both directions; per link (a up; the other three alike). EchelonFlows are ranked by their
    # bottleneck time Gamma (bytes left / capacity; ties by index: Q's EchelonFlow comes before H2); each gets
    # b / (d + max(T*, I_H, 0) - now), T* its least tardiness alone, I_H what its finished flows locked in.
    # t=0: H1 (AG0, Gamma 1) before Q (Gamma 4): T* = 1, full rate, done 1 (Delta 1, I_H1 = 1); Q waits.
    # t=1: AG1 (d 1, Gamma 1) before Q: T = 1, rate 1 / (0 + 1), done 2 (Delta 1). F0 1-2.
    # t=2: AG2 (d 3, Gamma 1) before Q (Gamma 4): it may finish at d + I_H1 = 4 at no cost to t_H1:
    #      rate 1 / (1 + 1) = 1/2; Q the other 1/2. F1 2-3. (At 3 nothing changes: AG2 keeps 1/2.)
    # t=4: AG2 done (Delta 1), Q has 3 left. AG3 (d 5, Gamma 1) likewise 1 / (1 + 1) = 1/2, Q 1/2. B1 4-6.
    # t=6: AG3 done (Delta 1), Q has 2 left. RS1 (H2, r2 = 6, d 6, Gamma 1) before Q (Gamma 2): T = 1, done 7
    #      (Delta 1). B0 6-8. 7-8: Q alone (1 left).
    # t=8: RS0 (d 6 + Tb = 8, Gamma 1) and Q (Gamma 1) tie: Q first, done 9; RS0 9-10 (Delta 2).
    # FSDP: t_H1 = 1, t_H2 = 2, iteration 10; Q's tardiness 9 - 0 = 9. Total 12.
    # (Alone the iteration takes 8: Eq. S12 puts the first backward all-gather Tb = 2 after the last forward one,
    # while the backward needs it Tf = 1 after, so landing it at d + I_H1 delays the backward by Tb - Tf.)
    net = Network.hose(["a", "b"], 1.0)
    p, ids = fsdp_pattern()
    r = simulate(net, [p, dp_job()], "echelonflow", iterations=1)
    for name, e in (("AG0", 1.0), ("AG1", 2.0), ("AG2", 4.0), ("AG3", 6.0), ("RS1", 7.0), ("RS0", 10.0)):
        assert [finish(r, "F", i) for i in ids[name]] == pytest.approx([e, e]), name
    assert late(r, "F", 0) == pytest.approx(1.0)
    assert late(r, "F", 1) == pytest.approx(2.0)
    assert late(r, "Q", 0) == pytest.approx(9.0)
    assert r.finished["F"] == pytest.approx(10.0)
    assert r.total_tardiness() == pytest.approx(12.0)


def test_case_iii_fsdp_against_a_dp_job_fair():
    # 0-2: AG0 and Q at 1/2: AG0 done 2 (Delta 2), Q 3 left. F0 2-3. 2-4: AG1 (d 1) and Q: AG1 done 4 (Delta 3),
    # Q 2 left. F1 4-5. 4-6: AG2 (d 3) and Q: AG2 done 6 (Delta 3), Q 1 left. B1 6-8. 6-8: AG3 (d 5) and Q:
    # both done at 8 (Delta 3; Q's tardiness 8). RS1 (r2 = 8) 8-9 (Delta 1); B0 8-10; RS0 (d 10) 10-11
    # (Delta 1). t_H1 = 3, t_H2 = 1, iteration 11; total 3 + 1 + 8 = 12, the same total as echelonflow's, but
    # the FSDP iteration takes 11 instead of 9.
    net = Network.hose(["a", "b"], 1.0)
    p, ids = fsdp_pattern()
    r = simulate(net, [p, dp_job()], "fair", iterations=1)
    for name, e in (("AG0", 2.0), ("AG1", 4.0), ("AG2", 6.0), ("AG3", 8.0), ("RS1", 9.0), ("RS0", 11.0)):
        assert [finish(r, "F", i) for i in ids[name]] == pytest.approx([e, e]), name
    assert late(r, "F", 0) == pytest.approx(3.0)
    assert late(r, "F", 1) == pytest.approx(1.0)
    assert late(r, "Q", 0) == pytest.approx(8.0)
    assert r.finished["F"] == pytest.approx(11.0)
    assert r.total_tardiness() == pytest.approx(12.0)


# --- two jobs: EchelonFlow beats fair sharing and Coflow ---------------------------------------------------


def two_jobs() -> list[Pattern]:
    # Job A: a pipeline EchelonFlow of two 1-byte flows a->b released at 0, ideal finishes 0 and 2.
    # Job B: a 1-byte Coflow a->b released at 0. All three share a's up link (1 byte/s).
    a = Pattern("A", (Task(src="a", dst="b", size=1.0, echelon=0, offset=0.0),
                      Task(src="a", dst="b", size=1.0, echelon=0, offset=2.0)), ("pipe",))
    b = Pattern("B", (Task(src="a", dst="b", size=1.0, echelon=0, offset=0.0),), ("dp",))
    return [a, b]


def test_two_jobs_fair():
    # 1/3 each, all done at 3: t_A = max(3 - 0, 3 - 2) = 3, t_B = 3; total 6
    r = simulate(Network.hose(["a", "b"], 1.0), two_jobs(), "fair", iterations=1)
    assert [finish(r, "A", 0), finish(r, "A", 1), finish(r, "B", 0)] == pytest.approx([3.0, 3.0, 3.0])
    assert (late(r, "A", 0), late(r, "B", 0)) == pytest.approx((3.0, 3.0))
    assert r.total_tardiness() == pytest.approx(6.0)


def test_two_jobs_coflow():
    # SEBF: B (Gamma 1) before A (Gamma 2): B done at 1; A's two flows (MADD) both at 3.
    # t_A = max(3 - 0, 3 - 2) = 3, t_B = 1; total 4
    r = simulate(Network.hose(["a", "b"], 1.0), two_jobs(), "coflow", iterations=1)
    assert [finish(r, "A", 0), finish(r, "A", 1), finish(r, "B", 0)] == pytest.approx([3.0, 3.0, 1.0])
    assert (late(r, "A", 0), late(r, "B", 0)) == pytest.approx((3.0, 1.0))
    assert r.total_tardiness() == pytest.approx(4.0)


def test_two_jobs_echelonflow():
    # t=0, ranking by the bottleneck time: Gamma_A = 2 bytes / 1 = 2, Gamma_B = 1.
    #   B first, its flow alone on the link: done at 1. A gets nothing (the link is full).
    # t=1: A's flows, ideal times 0 and 2 (x = -1 and 1), are served in ideal-time order: the bound is
    #   max(1/1 + 1, 2/1 - 1) = 2, the reservation max(1 / (-1 + 2), 2 / (1 + 2)) = 1 byte/s, all to A0: done at 2
    #   (its tardiness 2 is now locked in). t=2: A1 (x = 0) needs only 1 / (0 + 2) = 1/2 to land within it, and
    #   the back-fill gives it the rest of the link: done at 3 (tardiness 1 <= 2).
    # t_A = 2, t_B = 1: total 3, the optimum here (serving A0 first gives 1 + 2 too), < 4 (coflow) < 6 (fair).
    r = simulate(Network.hose(["a", "b"], 1.0), two_jobs(), "echelonflow", iterations=1)
    assert [finish(r, "A", 0), finish(r, "A", 1), finish(r, "B", 0)] == pytest.approx([2.0, 3.0, 1.0])
    assert (late(r, "A", 0), late(r, "B", 0)) == pytest.approx((2.0, 1.0))
    assert r.total_tardiness() == pytest.approx(3.0)
    totals = {m: simulate(Network.hose(["a", "b"], 1.0), two_jobs(), m, iterations=1).total_tardiness()
              for m in ("fair", "coflow", "echelonflow")}
    assert totals["echelonflow"] < totals["coflow"] < totals["fair"]


def test_two_jobs_echelonflow_first_decision():
    # The rates at t=0 (B first at 1 byte/s leaves nothing for A): [A0, A1, B] = [0, 0, 1]
    net = Network.hose(["a", "b"], 1.0)
    paths = np.asarray([net.path("a", "b")] * 3, dtype=np.int64)
    active = Active(net.capacity, paths, np.ones(3), np.asarray([0.0, 2.0, 0.0]), np.asarray([0, 0, 1]))
    assert allocate("echelonflow", active, 0.0) == pytest.approx([0.0, 0.0, 1.0])
    # A alone: in ideal-time order the bound is max(1/1 - 0, 2/1 - 2) = 1, the reservation
    # max(1 / (0 + 1), 2 / (2 + 1)) = 1, all of it to A0 first (earliest ideal finish): [1, 0]
    alone = Active(net.capacity, paths[:2], np.ones(2), np.asarray([0.0, 2.0]), np.asarray([0, 0]))
    assert allocate("echelonflow", alone, 0.0) == pytest.approx([1.0, 0.0])