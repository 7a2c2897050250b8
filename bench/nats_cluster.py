"""The control plane against a three-server NATS cluster on 127.0.0.1 (JetStream, stream replicas 3).

Scaling out is NATS clustering: three real nats-servers form one JetStream cluster (tests/faults/harness.py:
routes on loopback, each its own store); once it has a meta leader, the stream and the lease bucket are made
with 3 replicas and every client is given all three URLs.

Throughput, per run (a fresh cluster and folder each; medians over --runs), with bench/bus_throughput.py's
own functions:
  1. raw JetStream limits of the cluster with nats-py alone (a stream of 3 replicas): async publish, the
     same with a Nats-Msg-Id header, pull + ack;
  2. end to end: N `metrics.iteration` events published while the real recorder (`rubick service recorder`)
     writes them into Parquet; events/s into Parquet and its ratio to the raw publish rate.
With --baseline, the same once against a single server, for comparison on the same machine and moment.

Faults (tests/faults/cluster.py), --fault-runs times for each of --kills: N events published as fast as
the stream acknowledges, kill -9 of one server in the middle (a follower of the stream, the publisher's own
server where it is one, or the stream's leader); publishes not acknowledged in time are published again with
the same id; at the end, the 100 events acknowledged just before the kill are published again with their ids
(the stream must answer each as a duplicate). Prints publish failures, events lost and duplicated in the
Parquet log (read back with `controlplane.eventlog.scan`), gaps, the manifest check, and the times to recover.
--runs 0 runs the faults only, --fault-n 0 the throughput only.

    python bench/nats_cluster.py [--n 50000] [--runs 3] [--fault-n 50000] [--fault-runs 1]
                                 [--kills follower,leader] [--baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bus_throughput import end_to_end, one_run, raw_limits  # noqa: E402
from controlplane.gc_tuning import tune  # noqa: E402
from tests.faults.cluster import KILLS, ClusterOutcome, run_cluster_kill  # noqa: E402
from tests.faults.harness import Nats  # noqa: E402

KEYS = ["raw_publish_rate", "raw_publish_id_rate", "raw_consume_rate", "publish_rate", "recorded_rate", "ratio",
        "ratio_id", "p50_ms", "p99_ms", "lost", "doubled", "files"]


async def cluster_run(n: int, roll_seconds: float) -> dict:
    """bus_throughput's run against a fresh three-server cluster (replicas 3)."""
    with tempfile.TemporaryDirectory(prefix="rubick-cluster-") as tmp:
        nats = Nats(Path(tmp), 3)
        try:
            elected = await nats.meta_leader()
            raw_pub, raw_pub_id, raw_con = await raw_limits(nats.url, n, replicas=3)
            result = await end_to_end(nats.url, Path(tmp) / "events", n, roll_seconds, replicas=3)
        finally:
            nats.stop()
    result.update(raw_publish_rate=raw_pub, raw_publish_id_rate=raw_pub_id, raw_consume_rate=raw_con,
                  ratio=result["recorded_rate"] / raw_pub, ratio_id=result["recorded_rate"] / raw_pub_id,
                  elected_s=elected)
    return result


async def fault_run(n: int, kill: str) -> ClusterOutcome:
    with tempfile.TemporaryDirectory(prefix="rubick-cluster-kill-") as tmp:
        return await run_cluster_kill(Path(tmp), n, kill, chunk=1000)


def row(r: dict) -> str:
    return " ".join(f"{r[k]:>12,.2f}" if isinstance(r[k], float) else f"{r[k]:>12,}" for k in KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="events per throughput run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--roll-seconds", type=float, default=0.5, help="the recorder's file roll interval")
    parser.add_argument("--fault-n", type=int, default=50_000, help="events per fault run (0: no fault runs)")
    parser.add_argument("--fault-runs", type=int, default=1, help="fault runs per kind of kill")
    parser.add_argument("--kills", default=",".join(KILLS), help="comma-separated, of: " + ", ".join(KILLS))
    parser.add_argument("--baseline", action="store_true", help="also one run against a single server")
    args = parser.parse_args()
    tune()  # the collector's thresholds of a `rubick` process, as bench/bus_throughput.py's
    logging.getLogger("controlplane.bus.nats").setLevel(logging.ERROR)  # "connect failed" while a server is down

    if args.runs > 0:
        throughput(args)
    kills = [k.strip() for k in args.kills.split(",") if k.strip()]
    if args.fault_n > 0 and kills:
        faults(args.fault_n, args.fault_runs, kills)


def throughput(args: argparse.Namespace) -> None:
    print(f"three nats-servers, one JetStream cluster on 127.0.0.1, stream replicas 3; {args.n:,} "
          f"metrics.iteration events per run, {args.runs} runs, recorder roll {args.roll_seconds} s")
    print(" ".join(f"{k[:12]:>12}" for k in KEYS))
    runs = []
    for _ in range(args.runs):
        runs.append(asyncio.run(cluster_run(args.n, args.roll_seconds)))
        print(row(runs[-1]), flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in KEYS}
    print(f"cluster median: raw publish {med['raw_publish_rate']:,.0f} msg/s ({med['raw_publish_id_rate']:,.0f} "
          f"with Nats-Msg-Id), raw pull+ack {med['raw_consume_rate']:,.0f} msg/s; end to end: published "
          f"{med['publish_rate']:,.0f} events/s, into Parquet {med['recorded_rate']:,.0f} events/s = "
          f"{med['ratio']:.2f} x raw publish ({med['ratio_id']:.2f} x with Nats-Msg-Id); latency p50 "
          f"{med['p50_ms']:.0f} ms, p99 {med['p99_ms']:.0f} ms; lost {sum(r['lost'] for r in runs)}, doubled "
          f"{sum(r['doubled'] for r in runs)}; meta leader after {statistics.median(r['elected_s'] for r in runs):.1f} s",
          flush=True)
    if args.baseline:
        single = asyncio.run(one_run(args.n, args.roll_seconds))
        print(row(single))
        print(f"single server (the same machine, just after): raw publish {single['raw_publish_rate']:,.0f} msg/s, "
              f"into Parquet {single['recorded_rate']:,.0f} events/s = {single['ratio']:.2f} x raw publish", flush=True)


def faults(n: int, runs: int, kills: list[str]) -> None:
    print(f"\nkill -9 of one server mid-stream, {n:,} events per run")
    print("killed: the server killed; leader: the stream's leader before the kill -> after it; publisher: the server\n"
          "the publisher was connected to at the kill; fail: publishes not acknowledged within 1 s, published again\n"
          "with the same id (dup-ack: of those, the ones the stream had stored already); recover: from the kill to\n"
          "the first acknowledgement of a publish sent after it; stall: the longest time without an acknowledgement;\n"
          "in log: from the kill to the last event in a Parquet file; stream: messages in the stream at the end;\n"
          "resent: events acknowledged just before the kill, published again with their ids after it, that the\n"
          "stream answered as duplicates / published again")
    print(f"{'kill':<9} {'killed':<9} {'leader':<20} {'publisher':<9} {'fail':>5} {'dup-ack':>7} {'pub ev/s':>9} "
          f"{'recover s':>9} {'stall s':>7} {'in log s':>8} {'stream':>7} {'resent':>7} {'lost':>5} {'dupl':>5} "
          f"{'gaps':>5} {'manifest':>8}")
    lost = duplicated = 0
    for kill in kills:
        for _ in range(runs):
            t0 = time.monotonic()
            try:
                o = asyncio.run(fault_run(n, kill))
            except Exception as exc:  # a run that did not finish: its log unchecked
                print(f"{kill:<9} did not finish: {type(exc).__name__}: {exc}"[:2000], flush=True)
                continue
            lost += o.lost
            duplicated += o.duplicated
            print(f"{kill:<9} {o.killed:<9} {o.leader + ' -> ' + o.leader_after:<20} "
                  f"{o.connected:<9} {o.publish_failures:>5} {o.retried_duplicates:>7} {o.publish_rate:>9,.0f} "
                  f"{o.recover_s:>9.2f} {o.stall_s:>7.2f} {o.recorded_s:>8.2f} {o.stream_messages:>7} "
                  f"{f'{o.resent_duplicates}/{o.resent}':>7} "
                  f"{o.lost:>5} {o.duplicated:>5} {o.gaps:>5} {'ok' if not o.manifest_problems else 'FAILED':>8}"
                  f"   ({time.monotonic() - t0:.0f} s)", flush=True)
            for note in [*o.manifest_problems, *o.notes]:
                print(f"    {note[:2000]}")
    print(f"events lost in all: {lost}, duplicated: {duplicated}")


if __name__ == "__main__":
    main()
