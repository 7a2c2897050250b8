"""Where a simulation's policy time goes: its rounds by what set them off, its attempts (ScheduleJob) by job and end.

One simulation, in this process, with the policy engine's attempts and the policy core's rounds timed one by one:

- rounds, by the event that ran them (`clock.tick`, `job.completed`, ...), whether anything but clock ticks and
  measured iterations came in since the last round (`quiet` or `events`), whether the last round held a job back
  (`held_back`: a hold kept something from happening, so ticks run the round again), and what the round published
  (`decided`: a `plan.decided`; `pending`: reasons only; `nothing`);
- attempts, by who asked (`queue`: the round's queue and its sleepers; `repack`: a guarantee's repack), whether the
  job was running and could grow (`running`: at its minimum or over, under what it wants; `waiting`: holding nothing
  or under its minimum), whether the round had held a job back before the attempt began, and how it ended: `kept`
  (its changes stay), `held` (it changes nothing and says `held`: the restart rule refused the change, or a hold
  stopped it) or `failed: <reason>`. A waiting job's kept attempt whose GPUs a later attempt of the same round took
  back, every one, ends `kept, taken back`: the round published nothing of it.

The timings include the wrappers' own cost (a few microseconds a call), so read the shares and counts, not the
seconds: on a shared machine they move by a quarter from run to run. The decisions are those of a run without them:
the wrappers only time and count.

    .venv/bin/python bench/search_anatomy.py                      # the 10x trace on 80x8
    .venv/bin/python bench/search_anatomy.py --scale 1 --cluster 8x8
    .venv/bin/python bench/search_anatomy.py --trace runs/pai/pai_task_table.csv --layout pai --cluster 80x8 \
        --scale 1 --max-time-h 6                                  # rows written by bench/pai_day.py --write

On the 10x trace (1 December 2026), 20% of the rounds' time went to attempts of running jobs to grow, begun once the
round had held a job back, that ended `held` (22,387 attempts, 81 us each; 28% and 91 us before the speed ceiling
answered some without a search): the restart rule refused what they gathered. Rounds a tick set off after nothing
but ticks and measurements took 7% (316 rounds, 58 of them publishing a decision).

`--scale` is 10 unless given, for any trace: without `--scale 1` the PAI-shaped rows are replayed ten times over. On
the PAI-shaped day (`bench/pai_day.py`, 20,000 rows, seed 1) on 80x8, its first 24 simulated hours (2 December 2026):
12,353 rounds, 87% of their time in rounds after a completion (13.8 ms each); attempts took 44% of the rounds' time,
the largest parts running jobs' growth the restart rule refused (15%: 123,887 attempts, 194 us each) and waiting jobs
that failed `held` (12%: 315,429 attempts, 25 a round, 61 us each); the rest of the rounds' time is their own
bookkeeping over the jobs held, dormant and asleep (840 records in a round on average over its first 7,270 rounds).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUIET = frozenset({"clock.tick", "metrics.iteration", "plan.decided", "plan.pending"})
"""What a round's own events and the agents' measurements are: a round after only these is `quiet`."""


class Anatomy:
    """The counters, and the wrappers that fill them."""

    def __init__(self) -> None:
        self.rounds_s: Counter = Counter()
        self.rounds_n: Counter = Counter()
        self.attempts_s: Counter = Counter()
        self.attempts_n: Counter = Counter()
        self._since: set[str] = set()

    @contextmanager
    def installed(self, core_cls: type, engine_cls: type) -> Iterator[None]:
        """`core_cls`'s `_handle` and `run_round`, and `engine_cls`'s `_schedule_job`, wrapped within; as they were
        after."""
        handle, run_round, schedule = core_cls._handle, core_cls.run_round, engine_cls._schedule_job
        own = [(cls, name, cls.__dict__.get(name)) for cls, name in
               ((core_cls, "_handle"), (core_cls, "run_round"), (engine_cls, "_schedule_job"))]
        since = self._since
        placed: list[tuple[tuple, float, object]] = []
        """(key, seconds, record) of the round's kept attempts of waiting jobs: counted at the round's end, as
        `kept, taken back` where a later attempt of the same round took every GPU the job was given"""

        @functools.wraps(handle)
        def _handle(core, event, rounds):
            since.add(event.base)
            return handle(core, event, rounds)

        @functools.wraps(run_round)
        def _run_round(core, event):
            held_back = bool(getattr(core.engine, "held_back", False))
            t0 = time.perf_counter()
            try:
                out = run_round(core, event)
            finally:
                for key, seconds, job in placed:
                    if not job.g:
                        key = (*key[:3], "kept, taken back")
                    self.attempts_s[key] += seconds
                    self.attempts_n[key] += 1
                placed.clear()
            dt = time.perf_counter() - t0
            said = ("decided" if any(e.base == "plan.decided" for e in out) else "pending" if out else "nothing")
            key = (event.base, "quiet" if since <= QUIET else "events", "held_back" if held_back else "-", said)
            self.rounds_s[key] += dt
            self.rounds_n[key] += 1
            since.clear()
            return out

        @functools.wraps(schedule)
        def _schedule_job(engine, job, jr=None, only=None):
            kept, held_back = engine._kept, engine.held_back
            growing = job.inp.running and job.g >= max(1, job.min_g)
            t0 = time.perf_counter()
            ok = schedule(engine, job, jr, only)
            dt = time.perf_counter() - t0
            why = engine.why.get(job.id)
            if engine._kept != kept:
                end = "kept"
            elif ok and why == "held":
                end = "held"
            else:
                end = f"{'ok' if ok else 'failed'}: {why or '-'}"
            key = ("queue" if jr is None and only is None else "repack", "running" if growing else "waiting",
                   "held_back" if held_back else "-", end)
            if end == "kept" and not growing:
                placed.append((key, dt, job))
            else:
                self.attempts_s[key] += dt
                self.attempts_n[key] += 1
            return ok

        core_cls._handle, core_cls.run_round, engine_cls._schedule_job = _handle, _run_round, _schedule_job
        try:
            yield
        finally:
            for cls, name, was in own:
                if was is None:
                    delattr(cls, name)
                else:
                    setattr(cls, name, was)

    def report(self, top: int) -> str:
        total = sum(self.rounds_s.values())
        searched = sum(self.attempts_s.values())
        return "\n".join(
            [f"rounds: {sum(self.rounds_n.values()):,}, {total:.2f} s"]
            + _table(self.rounds_s, self.rounds_n, total, top, [("event", 18), ("since last", 10), ("held_back", 10),
                     ("published", 10)], ("rounds", 8), ("per round", 10, 1e3, ">8.2f", "ms"))
            + [(f"attempts: {sum(self.attempts_n.values()):,}, {searched:.2f} s "
                f"({searched / max(total, 1e-12):.0%} of the rounds' time)")]
            + _table(self.attempts_s, self.attempts_n, total, top, [("asked by", 8), ("job", 8), ("held_back", 10),
                     ("end", 18)], ("attempts", 9), ("per attempt", 12, 1e6, ">9.1f", "us")))


def _table(seconds: Counter, counts: Counter, total: float, top: int, keys: list[tuple[str, int]],
           count: tuple[str, int], per: tuple[str, int, float, str, str]) -> list[str]:
    """The `top` rows of most seconds: a header, then each key's parts, its count, seconds, share of `total` and
    time per count (`per`: title, width, scale, number format, unit)."""
    title, width, scale, spec, unit = per
    lines = ["  " + " ".join(f"{name:<{w}}" for name, w in keys)
             + f" {count[0]:>{count[1]}} {'seconds':>8} {'share':>6} {title:>{width}}"]
    for key, s in seconds.most_common(top):
        n = counts[key]
        lines.append("  " + " ".join(f"{part:<{w}}" for part, (_, w) in zip(key, keys))
                     + f" {n:>{count[1]},} {s:>8.2f} {s / max(total, 1e-12):>6.1%} "
                     f"{s / n * scale:{spec}} {unit}")
    return lines

def run(trace: str, out: Path, scale: int = 10, cluster: str | None = None, policy: str = "rubick",
        layout: str = "auto", max_time_h: float | None = None) -> tuple[Anatomy, dict]:
    """Simulate `trace` into `out` with the policy timed; (the counters, the run's summary.json)."""
    from controlplane.cli import main as rubick
    from policy.engine import RubickEngine
    from policy.service import PolicyCore

    anatomy = Anatomy()
    cmd = ["simulate", "--trace", str(trace), "--layout", layout, "--scale", str(scale),
           "--cluster", cluster or f"{8 * scale}x8", "--policy", policy, "--out", str(out), "--no-progress"]
    if max_time_h is not None:
        cmd += ["--max-time-h", str(max_time_h)]
    with anatomy.installed(PolicyCore, RubickEngine):
        rc = rubick(cmd)
    if rc:
        raise SystemExit(rc)
    return anatomy, json.loads((out / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default=str(ROOT / "data" / "rubick-artifact" / "workload-base.csv"))
    p.add_argument("--layout", default="auto")
    p.add_argument("--scale", type=int, default=10)
    p.add_argument("--cluster", help="default: 8x8 times the scale")
    p.add_argument("--policy", default="rubick")
    p.add_argument("--max-time-h", type=float, help="stop the simulated clock here (the trace's own end else)")
    p.add_argument("--top", type=int, default=12, help="rows of each table (the largest first)")
    args = p.parse_args(argv)
    cluster = args.cluster or f"{8 * args.scale}x8"
    with tempfile.TemporaryDirectory() as tmp:
        anatomy, _ = run(args.trace, Path(tmp) / "run", args.scale, cluster, args.policy, args.layout, args.max_time_h)
    print(f"trace {Path(args.trace).name} x{args.scale} on {cluster}, policy {args.policy} (timed with wrappers)")
    print(anatomy.report(args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
