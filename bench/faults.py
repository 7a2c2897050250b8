"""The fault matrix as a table: each fault tried --runs times against a fresh deployment of separate
`rubick service` processes on real nats-servers on 127.0.0.1 (the harness of tests/faults/), and, with
--outage S, NATS unreachable for S seconds while a real agent trains.

    python bench/faults.py [--runs 3] [--outage 60] [--faults policy,recorder,...]

Prints, per fault: tried, survived (every acknowledged event in the log exactly once, no sequence
missing, the state folded from the log equal to the live one, `rubick replay` verifies), acknowledged
events (per run), events lost (must be 0) and the time to recover (median over the runs: from the kill
until the target is back: restarted and ready, its standby active and ready, or the server back in the
cluster with a current copy of the stream; for the outage, how long NATS was away).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.harness import FAULTS, Outcome, run_fault  # noqa: E402
from tests.faults.outage import run_outage  # noqa: E402


async def one(fault: str, outage_s: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="rubick-faults-") as tmp, contextlib.redirect_stdout(io.StringIO()):
        if fault == "nats unreachable":
            return await run_outage(Path(tmp), outage_s)
        return await run_fault(fault, Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--outage", type=float, default=0.0, help="also NATS unreachable for this many seconds "
                                                                   "(once; 0: not)")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    args = parser.parse_args()
    logging.getLogger("controlplane.bus.nats").setLevel(logging.ERROR)  # "connect failed" while a server is down
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    rows = [(f, args.runs) for f in faults] + ([("nats unreachable", 1)] if args.outage > 0 else [])
    print(f"{'fault':<18} {'tried':>5} {'survived':>8} {'acked/run':>9} {'lost':>5} {'recover s (median)':>19}")
    total_lost = 0
    for fault, runs in rows:
        outcomes: list[Outcome] = []
        for _ in range(runs):
            try:
                outcomes.append(asyncio.run(one(fault, args.outage)))
            except Exception as exc:  # a run that did not finish is tried and not survived
                failed = Outcome(fault, settled=False)
                failed.notes.append(f"did not finish, its log unchecked: {type(exc).__name__}: {exc}")
                outcomes.append(failed)
        lost = sum(o.lost for o in outcomes)  # acknowledged events the log lacks (a run that raised: not known)
        total_lost += lost
        recover = [o.recover_s for o in outcomes if o.survived]
        print(f"{fault:<18} {len(outcomes):>5} {sum(o.survived for o in outcomes):>8} "
              f"{statistics.median(o.acked for o in outcomes):>9.0f} {lost:>5} "
              f"{statistics.median(recover) if recover else float('nan'):>19.2f}", flush=True)
        for o in outcomes:
            for note in o.notes if not o.survived or fault in ("nats server", "nats unreachable") else ():
                print(f"    {note[:4000]}", flush=True)
    print(f"events lost in all: {total_lost}")


if __name__ == "__main__":
    main()
