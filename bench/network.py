"""Network scheduling figures: EchelonFlow against fair sharing and Coflow ordering.

1. The seed's cases (echelonflow-proofs.txt) as small contended scenarios, and a generated mix of DP,
   PP and FSDP (ZeRO-3) jobs placed across racks behind an oversubscribed core, each run in the
   flow-level simulator (`policy.network.fluid`) under per-flow rate control: `fair` (max-min, what
   the fabric does today), `coflow` (Varys SEBF + MADD) and `echelonflow`. Printed: total tardiness
   (sum over EchelonFlow instances of max(0, tardiness)), average iteration time and average job
   completion time (the time to finish `--iterations` iterations), medians over `--seeds` mixes, and
   EchelonFlow's margins (its figure over the others'); then the same mixes with each job in the traffic
   class `network.decided` gives it (strict priority between 4 classes: what a real fabric carries out).
2. The Base trace simulated with `--network none|fair|coflow|echelonflow` (traffic classes on the
   fabric): average JCT and its change against `none`.
3. Scheduler cost: one rate decision (`rates.allocate`, every flow of one iteration of every job active at
   once) and one class decision (`decide.classify`, what the network core does per change) at 64, 1,024
   and 8,192 GPUs, median of `--repeat` runs.

    .venv/bin/python bench/network.py
    .venv/bin/python bench/network.py --seeds 3 --skip-trace
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane.events import Plan  # noqa: E402
from controlplane.events.payloads import NETWORK_SETTINGS  # noqa: E402
from policy.network.decide import classify  # noqa: E402
from policy.network.echelon import fsdp_offsets  # noqa: E402
from policy.network.fluid import Pattern, Task, simulate  # noqa: E402
from policy.network.pattern import iteration_pattern, timing  # noqa: E402
from policy.network.rates import Active, allocate  # noqa: E402
from policy.network.topology import Network  # noqa: E402

MODES = ("fair", "coflow", "echelonflow")


# --- the seed's cases ----------------------------------------------------------------------------

def _flow(src, dst, size, echelon, offset=0.0, after=()):
    return Task(after=tuple(after), src=src, dst=dst, size=size, echelon=echelon, offset=offset)


def _compute(seconds, after=()):
    return Task(after=tuple(after), duration=seconds)


def seed_cases() -> dict[str, tuple[Network, list[Pattern]]]:
    """Unit capacities and sizes, so every figure can be checked by hand."""
    two = Network.hose(["a", "b"], 1.0)
    three = Network.hose(["w1", "w2", "w3"], 1.0)
    cases = {}
    # Case I: Coflows. A three-flow all-reduce ring and a one-flow all-reduce on one of its links.
    ring = Pattern("ring", (_compute(1.0), *(_flow(s, d, 1.0, 0, after=[0]) for s, d in
                                             (("w1", "w2"), ("w2", "w3"), ("w3", "w1")))), ("all-reduce",))
    small = Pattern("pair", (_compute(1.0), _flow("w1", "w2", 0.5, 0, after=[0])), ("all-reduce",))
    cases["I coflow"] = (three, [ring, small])
    # Case II: a pipeline over three workers (Eq. S8; T_2 = T_3 = 1 s per micro-batch, 3 micro-batches)
    # against a bulk all-reduce on the w1 -> w2 link.
    tasks, f_prev = [], {}
    for j in range(3):
        tasks.append(_compute(1.0, [len(tasks) - 1] if j else []))              # worker 1, micro-batch j
        c1 = len(tasks) - 1
        tasks.append(_flow("w1", "w2", 0.5, 0, offset=j * 1.0, after=[c1]))    # H_1
        f1 = len(tasks) - 1
        after = [f1] + ([f_prev[2]] if j else [])
        tasks.append(_compute(1.0, after))                                      # worker 2
        c2 = len(tasks) - 1
        tasks.append(_flow("w2", "w3", 0.5, 1, offset=j * 1.0, after=[c2]))    # H_2
        f2 = len(tasks) - 1
        tasks.append(_compute(1.0, [f2] + ([f_prev[3]] if j else [])))           # worker 3
        f_prev = {2: c2, 3: len(tasks) - 1}
    pipe = Pattern("pipeline", tuple(tasks), ("H1 w1->w2", "H2 w2->w3"))
    bulk = Pattern("dp", (_compute(0.5), _flow("w1", "w2", 2.0, 0, after=[0])), ("all-reduce",))
    cases["II pipeline"] = (three, [pipe, bulk])
    # Case III: FSDP, 3 units: all-gathers (one EchelonFlow, Eq. S12, T_fwd = 1, T_bwd = 2) prefetched one
    # ahead, reduce-scatters another; against an all-reduce on the same link.
    units, fwd, bwd = 3, 1.0, 2.0
    offs = fsdp_offsets(units, fwd, bwd)
    t: list[Task] = []
    t.append(_flow("a", "b", 0.5, 0, offs[0]))
    gate, prev = [], [0]
    for u in range(2 * units):
        start = prev + gate
        nxt = []
        if u + 1 < 2 * units:
            t.append(_flow("a", "b", 0.5, 0, offs[u + 1], after=gate))
            nxt = [len(t) - 1]
        t.append(_compute(fwd if u < units else bwd, start))
        c = len(t) - 1
        if u >= units:
            t.append(_flow("a", "b", 0.5, 1, (u - units) * bwd, after=[c]))
        gate, prev = [c], nxt
    fsdp = Pattern("fsdp", tuple(t), ("all-gathers", "reduce-scatters"))
    dp = Pattern("dp", (_compute(1.0), _flow("a", "b", 3.0, 0, after=[0])), ("all-reduce",))
    cases["III fsdp"] = (two, [fsdp, dp])
    # The two-job example: a pipeline EchelonFlow (ideal times 0 and 2) and a one-flow Coflow.
    pipe2 = Pattern("A", (_flow("a", "b", 1.0, 0, 0.0), _flow("a", "b", 1.0, 0, 2.0)), ("pipeline",))
    co = Pattern("B", (_flow("a", "b", 1.0, 0, 0.0),), ("coflow",))
    cases["two jobs"] = (two, [pipe2, co])
    return cases


# --- a generated mix -----------------------------------------------------------------------------

def load():
    from replay.config import load_parts
    parts = load_parts()
    return parts, parts.perf_params()


KINDS = (  # (model, plan, GPUs per node on each of two nodes)
    ("gpt2", Plan(dp=16), 8),
    ("bert", Plan(dp=16), 8),
    ("gpt2", Plan(dp=2, tp=2, pp=4, micro_batches=8), 8),
    ("t5", Plan(dp=2, tp=2, pp=2, micro_batches=4), 4),
    ("gpt2", Plan(dp=8, zero_stage=3), 4),
    ("roberta", Plan(dp=8, zero_stage=3), 4),
)


def mix(parts, params, seed: int, nodes: int = 16, rack: int = 4, jobs: int = 12):
    rng = random.Random(seed)
    names = [f"n{i:02d}" for i in range(nodes)]
    net = Network.hose(names, parts.env.b_inter, rack_size=rack, oversubscription=4.0)
    pats, starts = [], []
    for j in range(jobs):
        model, plan, per = KINDS[rng.randrange(len(KINDS))]
        racks = rng.sample(range(nodes // rack), 2)  # its two nodes in two racks: it crosses the core
        place = [(names[r * rack + rng.randrange(rack)], per) for r in racks]
        m = parts.models[model]
        batch = parts.batches[model]
        tm = timing(m, parts.env, params[model], plan, tuple(g for _, g in place), batch)
        pats.append(iteration_pattern(f"j{j:02d}-{model}-{plan.code()}", plan, place, m, tm, batch))
        starts.append(rng.uniform(0.0, 0.5))
    return net, pats, starts


def figures(net, pats, starts, mode, iterations):
    r = simulate(net, pats, mode, iterations=iterations, starts=starts)
    iters = [np.mean(r.iterations[p.job]) for p in pats]
    jct = [r.finished[p.job] - s for p, s in zip(pats, starts)]
    return r.total_tardiness(), float(np.mean(iters)), float(np.mean(jct))


def print_rows(label, rows):
    t = {m: rows[m][0] for m in MODES}
    print(f"{label:<14}" + "".join(f"  {m}: tard {rows[m][0]:8.3f} s, iter {rows[m][1]:7.3f} s, JCT {rows[m][2]:8.3f} s"
                                   for m in MODES))
    base = t["echelonflow"]
    print(f"{'':<14}  echelonflow tardiness / fair = {base / t['fair']:.3f}, / coflow = {base / t['coflow']:.3f}"
          if t["fair"] > 0 and t["coflow"] > 0 else "")


def bench_cases(args):
    print("== the seed's cases (per-flow rates; sizes in bytes, capacities in bytes/s: unit scale)")
    for name, (net, pats) in seed_cases().items():
        rows = {m: figures(net, pats, [0.0] * len(pats), m, 1) for m in MODES}
        print_rows(name, rows)


def bench_mix(args, parts, params):
    print(f"\n== generated mix: {args.jobs} DP/PP/FSDP jobs on 16 nodes in racks of 4 behind a 4:1 core, "
          f"{args.iterations} iterations each, {args.seeds} mixes")
    per_mode = {m: [] for m in MODES}
    by_class = {m: [] for m in MODES}
    for seed in range(args.seeds):
        net, pats, starts = mix(parts, params, seed, jobs=args.jobs)
        for m in MODES:
            per_mode[m].append(figures(net, pats, starts, m, args.iterations))
            # what a fabric does with network.decided: strict priority between the classes `classify` gives jobs
            cls = {c.job: c.traffic_class for c in classify(m, net, pats, 4)}
            ranked = [dataclasses.replace(p, klass=cls[p.job]) for p in pats]
            by_class[m].append(simulate(net, ranked, "classes", iterations=args.iterations,
                                        starts=starts).total_tardiness())
    rows = {m: tuple(statistics.median(x[i] for x in per_mode[m]) for i in range(3)) for m in MODES}
    print("medians over the mixes:")
    print_rows("mix", rows)
    e = per_mode["echelonflow"]
    for other in ("fair", "coflow"):
        o = per_mode[other]
        ratios = [[e[k][i] / o[k][i] for k in range(args.seeds)] for i in range(3)]
        wins = sum(1 for k in range(args.seeds) if e[k][0] < o[k][0])
        print(f"  echelonflow / {other:<6} per mix, median (min-max): tardiness {statistics.median(ratios[0]):.3f} "
              f"({min(ratios[0]):.3f}-{max(ratios[0]):.3f}), iteration time {statistics.median(ratios[1]):.3f}, "
              f"JCT {statistics.median(ratios[2]):.3f}; lower tardiness in {wins} of {args.seeds} mixes")
    print("as 4 traffic classes per job (network.decided, strict priority on the fabric), total tardiness:")
    print("  " + "  ".join(f"{m}: median {statistics.median(by_class[m]):.3f} s, sum {sum(by_class[m]):.3f} s"
                           for m in MODES))
    e = by_class["echelonflow"]
    for other in ("fair", "coflow"):
        wins = sum(1 for k in range(args.seeds) if e[k] < by_class[other][k])
        print(f"  echelonflow classes lower than {other} classes in {wins} of {args.seeds} mixes")


def bench_trace(args, parts):
    from replay.config import RunConfig
    from replay.importers import read_trace
    from replay.run import simulate as run_trace, trace_inputs

    print("\n== Base trace (workload-base.csv, 8x8, rubick) with --network")
    jobs = read_trace(ROOT / "data" / "rubick-artifact" / "workload-base.csv", parts.batches).jobs
    base = None
    for net in NETWORK_SETTINGS:
        cfg = RunConfig(policy="rubick", cluster="8x8", network=net)
        walls = []
        for _ in range(args.trace_runs):
            t0 = time.perf_counter()
            out = run_trace(cfg, trace_inputs(cfg, jobs, parts), parts)
            walls.append(time.perf_counter() - t0)
        s = out.summary
        jct = s["jct"]["avg_h"]
        base = jct if base is None else base
        extra = s.get("network", {})
        print(f"  {net:<12} avg JCT {jct:.4f} h ({(jct / base - 1) * 100:+.2f}% against none), "
              f"network.decided {s['events'].get('network.decided', 0)}, slowed {extra.get('slowed_s', 0):.0f} s, "
              f"wall {statistics.median(walls):.2f} s")


def snapshot(parts, params, gpus: int, seed: int = 0):
    """Every multi-node job of a cluster of `gpus` GPUs with one iteration's flows all active at once."""
    rng = random.Random(seed)
    nodes = gpus // 8
    names = [f"n{i:04d}" for i in range(nodes)]
    net = Network.hose(names, parts.env.b_inter, rack_size=min(32, nodes), oversubscription=2.0)
    order = list(range(nodes))
    rng.shuffle(order)
    pats = []
    i = 0
    while i + 2 <= nodes:
        model, plan, per = KINDS[rng.randrange(len(KINDS))]
        if per == 4:
            per, plan = 8, Plan(dp=16, zero_stage=plan.zero_stage) if plan.pp == 1 else plan
        if plan.gpus != 2 * per:
            plan = Plan(dp=16)
        place = [(names[order[i]], per), (names[order[i + 1]], per)]
        i += 2
        m = parts.models[model]
        tm = timing(m, parts.env, params[model], plan, (per, per), parts.batches[model])
        pats.append(iteration_pattern(f"j{len(pats)}", plan, place, m, tm, parts.batches[model]))
    return net, pats


def active_of(net, pats):
    L = net.links
    paths, sizes, dead, group = [], [], [], []
    for g, p in enumerate(pats):
        for t in p.flows:
            path = net.path(t.src, t.dst)
            paths.append(path + (L,) * (4 - len(path)))
            sizes.append(t.size)
            dead.append(t.offset)
            group.append(g * 16 + t.echelon)
    return Active(net.capacity, np.asarray(paths, dtype=np.int64), np.asarray(sizes), np.asarray(dead),
                  np.asarray(group, dtype=np.int64))


def bench_cost(args, parts, params):
    print(f"\n== scheduler cost, median of {args.repeat} runs (all flows of one iteration of every job active)")
    for gpus in (64, 1024, 8192):
        net, pats = snapshot(parts, params, gpus)
        active = active_of(net, pats)
        line = f"  {gpus:>5} GPUs, {len(pats):>4} jobs, {len(active):>6} flows:"
        for mode in MODES:
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                allocate(mode, active, 0.0)
                times.append(time.perf_counter() - t0)
            line += f"  rates[{mode}] {statistics.median(times) * 1e3:7.2f} ms"
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            classify("echelonflow", net, pats, 4)
            times.append(time.perf_counter() - t0)
        line += f"  classes {statistics.median(times) * 1e3:7.2f} ms"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=8, help="generated mixes (default 8)")
    ap.add_argument("--jobs", type=int, default=12, help="jobs per mix (default 12)")
    ap.add_argument("--iterations", type=int, default=4, help="iterations per job (default 4)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per cost figure (default 5)")
    ap.add_argument("--trace-runs", type=int, default=1, help="runs per Base-trace figure (default 1)")
    ap.add_argument("--skip-trace", action="store_true")
    args = ap.parse_args()
    bench_cases(args)
    parts, params = load()
    bench_mix(args, parts, params)
    if not args.skip_trace:
        bench_trace(args, parts)
    bench_cost(args, parts, params)


if __name__ == "__main__":
    main()
