"""Time of one full scheduling round of a policy, at several cluster sizes.

For each size, a cluster of N nodes x 8 GPUs and J jobs (models, sizes and plans drawn, with a
fixed seed, from the Base trace; one job in three guaranteed, four tenants whose quotas add up to half
the cluster) is built in the policy core, the
first round places them (reported apart: it fills the curve caches), then every measured round
follows one completion and one new submission, the steady state of a live cluster. Between rounds
the node agents' answers are applied as a live cluster would see them: a job given resources
starts (`job.started`), a running job given others restarts (`job.reconfigured`), one given none
stops (`job.preempted`); `changed/round` is how many decisions a round publishes. The oracle is
the fitted performance model, as in a live cluster.

`cold first`: the first round again, each time in a fresh process (`--first-runs` of them, the median printed): in
the process of the runs above, the first round at a size finds the plan enumerations and rank layouts of the sizes
before it cached already (a process keeps them for the placements it saw), which a policy service just started
does not.

Each size is run `--runs` times and once more. `median`/`p99`: the events between rounds are handed to the core as a
deployed one takes them (`PolicyCore.fold`: `handle` without the round each would run), so a round
makes again only the inputs of the jobs they touched; `median` is the median of the runs' median rounds (each run a
fresh core, built again from the same seed), `runs` the lowest and highest of them (the spread a shared machine
gives), `p99` over the rounds of every run. `whole` (once): the same events folded into the
core's state behind its back, so that every round looks at every input again (what a core that
kept nothing between rounds would cost); `same` says whether both runs published the same
`plan.decided` bytes.

The policy core has handled a `clock.tick` (60 s) before the first round, as every deployed one has
(`rubick up`, the chart and the simulator publish them): a job a decision changed less than the hold
ago keeps its allocation against best-effort reasons (`RubickEngine.hold_s`), and the rounds, one
simulated second apart, see those holds. `--no-ticks` times a core that never saw a tick: no job is
held, so every round may move every job (tens to hundreds of restarts a round; no deployment runs so).

    .venv/bin/python bench/policy_round.py                 # 64/50, 1024/1000, 8192/5000
    .venv/bin/python bench/policy_round.py --sizes 64:50 --rounds 50 --policy rubick
    .venv/bin/python bench/policy_round.py --sizes 8192:5000 --instructions   # the first round, counted

`--instructions` counts instead of timing: the instructions of the first round in a fresh process, under valgrind's
callgrind (the set-up counted apart and taken off), with a digest of the events the round published. The count is
the same from run to run of the same code within a few parts in a thousand, whatever else the machine runs; the
time of the same round swings by half on a shared machine. It needs `valgrind` and takes minutes a size.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane.gc_tuning import tune  # noqa: E402
from machine import line as machine_line  # noqa: E402
from controlplane.events import (JobCompleted, JobPreempted, JobReconfigured, JobStarted,  # noqa: E402
                                 JobSubmitted, ModelRef, NodeRegistered, Plan, Resources, encode, make)
from modeler.service import make_core  # noqa: E402
from policy.oracle import from_modeler  # noqa: E402
from policy.registry import POLICIES, make_policy  # noqa: E402

TRACE = ROOT / "data" / "rubick-artifact" / "workload-base.csv"


def decode_plan(code: str, gpus: int) -> Plan:
    if code.isdigit() and len(code) == 3:
        return Plan(pp=int(code[0]), tp=int(code[1]), dp=int(code[2]), micro_batches=1)
    return {"ga": Plan(dp=gpus), "gc": Plan(dp=gpus, gc=True), "zero-dp": Plan(dp=gpus, zero_stage=2),
            "zero-offload": Plan(dp=gpus, zero_stage=2, offload=True)}[code]


def trace_jobs(models) -> list[tuple[str, int, int, Plan]]:
    rows = list(csv.DictReader(open(TRACE)))
    return [(r["application"], int(r["num_gpus"]), int(r["num_cpus"]), decode_plan(r["exec_plan"], int(r["num_gpus"])))
            for r in rows]


def build(policy: str, nodes: int, jobs: int, seed: int, modeler, through_core: bool = True):
    """The core, a function submitting one job at a time, and the random source. `through_core`: the submissions
    after the first round are handed to the core (`PolicyCore.fold`); else folded into its state behind its back."""
    oracle, models = from_modeler(modeler)
    quotas = {f"t{i}": nodes * 8 // 8 for i in range(4)}  # half the cluster guaranteed, split over 4 tenants
    core = make_policy(policy, oracle=oracle, models=models, quotas=quotas)
    rng = random.Random(seed)
    pool = trace_jobs(models)
    t = 0.0
    for i in range(nodes):
        ev = make("node.registered", NodeRegistered(node=f"n{i:04d}", gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0),
                  time=t, id=f"b-node-{i}", source="bench")
        core.state.apply(ev)
    counter = [0]

    def submit(time_s: float):
        model, gpus, cpus, plan = rng.choice(pool)
        spec = models[model].spec
        counter[0] += 1
        jid = f"{model}-{counter[0]:05d}"
        sub = JobSubmitted(job_id=jid, tenant=f"t{counter[0] % 4}", guaranteed=counter[0] % 3 == 0,
                           model=ModelRef(type=model), global_batch_size=spec.global_batch_size, plan=plan,
                           resources=Resources(gpus=gpus, cpus=cpus), target_iterations=1000)
        ev = make("job.submitted", sub, time=time_s, id=f"b-sub-{jid}", source="bench")
        if through_core and time_s > 0:
            core.fold(ev)
        else:
            core.state.apply(ev)
            core.order[jid] = len(core.order)
        return jid

    for _ in range(jobs):
        submit(t)
    return core, submit, rng


def agents(core, decided: list, t: float, through_core: bool = True) -> None:
    """What the node agents answer to a round: a job given resources starts, a running job given
    others restarts under them, a running job given none stops (as in a live cluster)."""
    feed = core.fold if through_core else core.state.apply
    for ev in decided:
        if ev.base != "plan.decided":
            continue  # plan.pending: why jobs wait, nothing for the agents to do
        for d in ev.payload.decisions:
            job = core.state.jobs[d.job_id]
            if d.allocation and job.status != "running":
                out = make("job.started", JobStarted(job_id=d.job_id, allocation=d.allocation, plan=d.plan),
                           time=t, id=f"b-start-{d.job_id}-{ev.id}", source="bench")
            elif d.allocation:
                out = make("job.reconfigured", JobReconfigured(job_id=d.job_id, allocation=d.allocation, plan=d.plan,
                                                               restart_cost_s=78.0),
                           time=t, id=f"b-reconf-{d.job_id}-{ev.id}", source="bench")
            elif job.status == "running":
                out = make("job.preempted", JobPreempted(job_id=d.job_id, reason="bench", iterations_done=0),
                           time=t, id=f"b-stop-{d.job_id}-{ev.id}", source="bench")
            else:
                continue
            feed(out)


def run(policy: str, nodes: int, jobs: int, rounds: int, seed: int, modeler, reasons: bool = True,
        ticks: bool = True, through_core: bool = True) -> dict:
    core, submit, rng = build(policy, nodes, jobs, seed, modeler, through_core)
    core.reasons = core.engine.reasons = reasons
    if ticks:  # the period it announces is what holds are counted against (nothing is dirty: no round runs)
        assert not core.handle(make("clock.tick", _tick(0), time=0.0, id="b-tick-start", source="bench"))
    tick = make("clock.tick", _tick(0), time=1.0, id="b-tick-0", source="bench")
    t0 = time.perf_counter()
    decided = core.run_round(tick)
    first = time.perf_counter() - t0
    published = hashlib.sha256()
    _digest(published, decided, "plan.decided")
    agents(core, decided, 1.0, through_core)
    changed = []
    times = []
    for r in range(1, rounds + 1):
        active = [j for j in core.state.jobs_in("running", "queued", "preempted")]
        running = [j for j in active if j.decided_allocation] or active
        victim = rng.choice(running)
        done = make("job.completed", JobCompleted(job_id=victim.job_id, iterations=1000), time=1.0 + r,
                    id=f"b-done-{r}", source="bench")
        if through_core:
            core.fold(done)
        else:
            core.state.apply(done)
            core.last.pop(victim.job_id, None)
        submit(1.0 + r)
        tick = make("clock.tick", _tick(r), time=1.0 + r, id=f"b-tick-{r}", source="bench")
        t0 = time.perf_counter()
        decided = core.run_round(tick)
        times.append(time.perf_counter() - t0)
        changed.append(sum(len(ev.payload.decisions) for ev in decided if ev.base == "plan.decided"))
        _digest(published, decided, "plan.decided")
        agents(core, decided, 1.0 + r, through_core)
    times.sort()
    placed = sum(1 for j in core.state.jobs_in("running", "queued", "preempted") if j.decided_allocation)
    return {"policy": policy, "gpus": nodes * 8, "jobs": jobs, "first_s": first, "median_s": statistics.median(times),
            "p99_s": times[min(len(times) - 1, int(0.99 * len(times)))], "placed": placed, "times": times,
            "evaluations": core.engine.book.evaluations, "changed": statistics.median(changed),
            "decided_sha": published.hexdigest()}


def overhead(args, modeler) -> int:
    """The cost of working out and publishing the pending reasons: the same rounds, reasons on and off,
    alternating in one process; the ratio of the medians of the runs' median round times."""
    print(f"policy {args.policy}; pending reasons on vs off, {args.repeats} alternating runs per setting")
    print(f"{'GPUs':>6} {'jobs':>6} {'off median':>11} {'on median':>10} {'on/off':>7}")
    for item in args.sizes.split(","):
        gpus, jobs = (int(x) for x in item.split(":"))
        rounds = args.rounds if gpus <= 1024 else max(5, args.rounds // 3)
        on, off = [], []
        for _ in range(args.repeats):
            off.append(run(args.policy, gpus // 8, jobs, rounds, args.seed, modeler, reasons=False,
                           ticks=args.ticks)["median_s"])
            on.append(run(args.policy, gpus // 8, jobs, rounds, args.seed, modeler, reasons=True,
                          ticks=args.ticks)["median_s"])
        a, b = statistics.median(off), statistics.median(on)
        print(f"{gpus:>6} {jobs:>6} {a * 1e3:>9.2f}ms {b * 1e3:>8.2f}ms {b / a:>7.3f}")
    return 0


def cold_first(args, gpus: int, jobs: int) -> list[float]:
    """Seconds of the first round at a size, each in a fresh process (`--first-runs` of them)."""
    out = []
    for _ in range(args.first_runs):
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--cold-first", f"{gpus}:{jobs}",
                               "--policy", args.policy, "--seed", str(args.seed)] + ([] if args.ticks else ["--no-ticks"]),
                              capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1])["first_s"])
    return out


def _cold_first_here(args) -> int:
    """The child of `cold_first` and `first_instructions`: build one size, time its first round, print it as JSON
    with a digest of the events it published (`--set-up-only`: build it and stop there)."""
    gpus, jobs = (int(x) for x in args.cold_first.split(":"))
    core, _, _ = build(args.policy, gpus // 8, jobs, args.seed, make_core())
    if args.ticks:
        core.handle(make("clock.tick", _tick(0), time=0.0, id="b-tick-start", source="bench"))
    if args.set_up_only:
        return 0
    tick = make("clock.tick", _tick(0), time=1.0, id="b-tick-0", source="bench")
    t0 = time.perf_counter()
    out = core.run_round(tick)
    first_s = time.perf_counter() - t0
    published = hashlib.sha256()
    _digest(published, out)
    print(json.dumps({"first_s": first_s, "sha": published.hexdigest()[:16]}))
    return 0


def first_instructions(args, gpus: int, jobs: int) -> tuple[int, int, str]:
    """(Instructions of the first round in a fresh process, those of the set-up before it, a digest of the round's
    events), counted by valgrind's callgrind: the child runs once to the end of its set-up and once through the first
    round, both with `PYTHONHASHSEED=0`, and the round is the difference. A count of instructions is the same from run
    to run of the same code whatever else the machine does (within a few parts in a thousand here), where the time of
    a round on a shared machine is not: it tells whether a change to the code made the round cheaper."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit("--instructions counts with valgrind's callgrind: no `valgrind` on the PATH")
    child = [sys.executable, str(Path(__file__).resolve()), "--cold-first", f"{gpus}:{jobs}", "--policy", args.policy,
             "--seed", str(args.seed)] + ([] if args.ticks else ["--no-ticks"])
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(child + ["--set-up-only"], env=env, capture_output=True, check=True)  # byte code written, if it may
    counts, sha = {}, ""
    for mode in ("set-up", "round"):
        done = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null"] + child
                              + (["--set-up-only"] if mode == "set-up" else []),
                              env=env, capture_output=True, text=True, check=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            sys.exit(f"callgrind printed no count of instructions: {done.stderr.strip()[-500:]}")
        counts[mode] = int(found[1])
        if mode == "round":
            sha = json.loads(done.stdout.strip().splitlines()[-1])["sha"]
    return counts["round"] - counts["set-up"], counts["set-up"], sha


def instructions(args) -> int:
    """`--instructions`: the first round's instructions at each size (see `first_instructions`)."""
    print(f"policy {args.policy}; first round in a fresh process, instructions counted by callgrind "
          f"(PYTHONHASHSEED=0; the set-up taken off)")
    print(f"{'GPUs':>6} {'jobs':>6} {'first round':>14} {'set-up':>10} {'events':>18}")
    for item in args.sizes.split(","):
        gpus, jobs = (int(x) for x in item.split(":"))
        first, setup, sha = first_instructions(args, gpus, jobs)
        print(f"{gpus:>6} {jobs:>6} {first / 1e9:>12.3f} G {setup / 1e9:>8.3f} G {sha:>18}")
    return 0


def _digest(h, events, base: str | None = None) -> None:
    """Add the encoded bytes of `events` (only those of subject `base`, where given) to the hash `h`, in order."""
    for ev in events:
        if base is None or ev.base == base:
            h.update(encode(ev))


def _tick(seq: int):
    from controlplane.events import ClockTick
    return ClockTick(seq=seq, period_s=60.0)


def main(argv=None) -> int:
    tune()  # the collector's thresholds of a `rubick service policy` process
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64:50,1024:1000,8192:5000", help="GPUS:JOBS,...")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--policy", default="rubick", choices=POLICIES)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--reasons-overhead", action="store_true",
                    help="time each size with and without the pending reasons (plan.pending), alternating, "
                         "and print the ratio of the medians")
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting with --reasons-overhead")
    ap.add_argument("--no-ticks", dest="ticks", action="store_false",
                    help="a policy core that never saw a clock tick: no job is held (see above)")
    ap.add_argument("--runs", type=int, default=3,
                    help="runs per size through the core (`median`: the median of their median rounds)")
    ap.add_argument("--first-runs", type=int, default=3,
                    help="cold first rounds per size, each in a fresh process (the median is printed; 0: none)")
    ap.add_argument("--instructions", action="store_true",
                    help="count the instructions of each size's first round in a fresh process with valgrind's "
                         "callgrind instead of timing rounds (minutes a size; see first_instructions)")
    ap.add_argument("--cold-first", help=argparse.SUPPRESS)
    ap.add_argument("--set-up-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cold_first:
        return _cold_first_here(args)
    if args.instructions:
        return instructions(args)
    modeler = make_core()
    if args.reasons_overhead:
        return overhead(args, modeler)
    print(machine_line())
    print(f"policy {args.policy}; oracle: fitted performance model; {args.rounds} rounds per size "
          f"(8,192 GPUs and over: a third), {args.runs} runs; "
          + ("clock ticks every 60 s (holds on)" if args.ticks else "no clock tick seen (no job held)"))
    print(f"{'GPUs':>6} {'jobs':>6} {'first round':>12} {'cold first':>11} {'median':>10} {'runs':>17} {'p99':>10} "
          f"{'whole':>10} "
          f"{'same':>5} {'placed':>7} {'changed/round':>14} {'plans evaluated':>16}")
    rows = []
    for item in args.sizes.split(","):
        gpus, jobs = (int(x) for x in item.split(":"))
        rounds = args.rounds if gpus <= 1024 else max(5, args.rounds // 3)
        runs = [run(args.policy, gpus // 8, jobs, rounds, args.seed, modeler, ticks=args.ticks)
                for _ in range(max(1, args.runs))]
        if len({x["decided_sha"] for x in runs}) != 1:
            sys.exit(f"{gpus} GPUs: the runs published different plan.decided bytes")
        medians = sorted(x["median_s"] for x in runs)
        pooled = sorted(t for x in runs for t in x["times"])
        p99 = pooled[min(len(pooled) - 1, int(0.99 * len(pooled)))]
        r = dict(runs[0], median_s=statistics.median(medians), p99_s=p99)
        spread = f"{medians[0] * 1e3:.2f}-{medians[-1] * 1e3:.2f}ms"
        w = run(args.policy, gpus // 8, jobs, rounds, args.seed, modeler, ticks=args.ticks, through_core=False)
        rows.append(r)
        cold = cold_first(args, gpus, jobs)
        cold_text = f"{statistics.median(cold) * 1e3:>9.1f}ms" if cold else f"{'-':>11}"
        print(f"{r['gpus']:>6} {r['jobs']:>6} {r['first_s'] * 1e3:>10.1f}ms {cold_text} {r['median_s'] * 1e3:>8.2f}ms "
              f"{spread:>17} {r['p99_s'] * 1e3:>8.2f}ms {w['median_s'] * 1e3:>8.2f}ms "
              f"{str(r['decided_sha'] == w['decided_sha']):>5} "
              f"{r['placed']:>7} {r['changed']:>14.0f} {r['evaluations']:>16}")
    if len(rows) > 1:
        base = rows[0]
        for r in rows[1:]:
            print(f"growth {base['gpus']}->{r['gpus']} GPUs, {base['jobs']}->{r['jobs']} jobs: "
                  f"median x{r['median_s'] / base['median_s']:.1f} "
                  f"(jobs x{r['jobs'] / base['jobs']:.0f}, nodes x{r['gpus'] / base['gpus']:.0f})")
        if len(rows) > 2:
            xs = [math.log(r["gpus"]) for r in rows]
            js = [math.log(r["jobs"]) for r in rows]
            ys = [math.log(r["median_s"]) for r in rows]
            print(f"exponent of the median round (least squares over {len(rows)} sizes, log-log): "
                  f"{_slope(xs, ys):.2f} in the GPUs, {_slope(js, ys):.2f} in the jobs")
    print(machine_line(), "(after)")
    return 0


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


if __name__ == "__main__":
    sys.exit(main())
