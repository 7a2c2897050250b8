"""Bus and recorder throughput through a real nats-server.

For each run (fresh server and folder):
  1. raw JetStream limits of this machine, with nats-py alone: async publish with
     acks collected at the end, and a durable pull consumer with explicit acks;
  2. end to end: N `metrics.iteration` events published (acks collected per chunk)
     while the recorder runs as its own process (`rubick service recorder`), until
     all N are in Parquet files; then the log is checked for lost and doubled rows;
  3. the recorder's drain rate: N events stored first, with no recorder running, then
     a recorder started on them; events/s from its "ready" to the last of them in
     Parquet. End to end, the publisher, the server and the recorder share the
     machine's cores (two here), so the recorded rate is bounded by what the other two
     leave the recorder; the drain rate is what the recorder writes when it is the one
     busy process.
Prints per run and the median over runs: publish rate, recorded rate, their ratio
to the raw publish rate, p50/p99 publish-to-recorded latency (publish time to the
moment the Parquet file holding the event was renamed into place), bytes per
event on disk, the drain rate with its ratio to the raw publish rate, and the recorder's CPU time per
event in both (user + system, read from /proc on Linux, from its "ready" to the last event in Parquet): a
figure the sharing of the cores does not blur as it does the rates.

The benchmark's own process (the raw client, the publisher) runs with the garbage collector's thresholds every
`rubick` process has (`controlplane.gc_tuning.tune`). With CPython's defaults it spent 7.9 s of one run in the
collector, 47 full collections walking the 100,000 publish futures it held (`gc.callbacks`): the raw publish rate
read 13,559 msg/s, and 21,890 with the product's thresholds, in runs one after the other.

    python bench/bus_throughput.py [--n 100000] [--runs 3] [--roll-seconds 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import numpy as np
import polars as pl
from nats.js import api

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.bus.nats import JetStreamBus  # noqa: E402
from controlplane.eventlog import scan  # noqa: E402
from controlplane.gc_tuning import tune  # noqa: E402
from controlplane.events import MetricsIteration, Plan, encode, make  # noqa: E402
from controlplane.lease import ensure_lease_bucket  # noqa: E402
from controlplane.lifetime import die_with_parent  # noqa: E402
from controlplane.natsserver import NatsServer  # noqa: E402
from controlplane.recorder.writer import FILE_RE  # noqa: E402

PAYLOAD = MetricsIteration(job_id="bench-job", model_type="gpt2", iteration=0, iter_time_s=1.05,
                           plan=Plan(dp=8, zero_stage=2), gpus_per_node=(8,), node="node-0", cpus_per_gpu=8,
                           fwd_s=0.3, bwd_s=0.6, opt_s=0.15)


async def raw_limits(url: str, n: int, replicas: int = 1) -> tuple[float, float, float]:
    """(async publish, the same with Nats-Msg-Id, pull+ack) in msg/s on a stream of `replicas` copies; `url`
    may list a cluster's servers, comma-separated."""
    nc = await nats.connect([u.strip() for u in url.split(",") if u.strip()])
    js = nc.jetstream()
    await js.add_stream(api.StreamConfig(name="RAW", subjects=["raw.>"], storage=api.StorageType.FILE,
                                         num_replicas=replicas))
    data = encode(make("metrics.iteration", PAYLOAD, time=time.time(), id="raw", source="bench"))
    t0 = time.perf_counter()
    futures = [await js.publish_async("raw.metrics", data) for _ in range(n)]
    await asyncio.gather(*futures)
    publish_rate = n / (time.perf_counter() - t0)
    # the same with a Nats-Msg-Id header on every message, which de-duplication needs
    t0 = time.perf_counter()
    futures = [await js.publish_async("raw.ids", data, headers={"Nats-Msg-Id": f"r-{i}"}) for i in range(n)]
    await asyncio.gather(*futures)
    publish_id_rate = n / (time.perf_counter() - t0)
    sub = await js.pull_subscribe("raw.metrics", durable="raw-consumer", stream="RAW")
    got = 0
    t0 = time.perf_counter()
    while got < n:
        msgs = await sub.fetch(1000, timeout=5)
        for m in msgs:
            await m.ack()
        got += len(msgs)
    consume_rate = n / (time.perf_counter() - t0)
    await js.delete_stream("RAW")
    await nc.close()
    return publish_rate, publish_id_rate, consume_rate


async def end_to_end(url: str, log_dir: Path, n: int, roll_seconds: float, chunk: int = 5000,
                     replicas: int = 1, server_pids: tuple[int, ...] = ()) -> dict:
    """`url` may list a cluster's servers (comma-separated): the stream and the recorder's lease bucket are
    then made with `replicas` copies before the recorder starts."""
    bus = await JetStreamBus.connect(url, replicas=replicas)
    await ensure_lease_bucket(bus.js, replicas=replicas)
    try:
        recorder = start_recorder(url, log_dir, roll_seconds)
    except BaseException:
        await bus.close()
        raise
    landed = Landed()
    try:
        items = bench_events(n, "b")
        cpu_before = cpu_seconds(recorder.pid)
        servers_before = [cpu_seconds(pid) for pid in server_pids]
        own_before = time.process_time()
        t_first = time.time()
        await publish_all(bus, items, chunk)
        t_published = time.time()
        own_cpu = time.process_time() - own_before  # the publisher's (this process only publishes meanwhile)
        await bus.close()
        await landed_rows(log_dir, n, landed)
        cpu_after = cpu_seconds(recorder.pid)
        servers_after = [cpu_seconds(pid) for pid in server_pids]
    finally:  # stopped (and its connection closed) even when the run fails
        recorder.terminate()
        recorder.wait(30)
        await bus.close()
    frame = scan(log_dir, ["msg_id"]).frame
    ids = frame["msg_id"].to_list()
    lost = n - len(set(ids) & {f"b-{i}" for i in range(n)})
    doubled = len(ids) - len(set(ids))
    t_last = max(landed.when.values())
    server_cpu = sum(b - a for a, b in zip(servers_before, servers_after) if a is not None and b is not None)
    recorder_cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else float("nan")
    # latency: when the stream stored each event (its publish) to when its Parquet file landed
    latency = np.concatenate(landed.stored)
    size = landed.size
    return {
        "publish_rate": n / (t_published - t_first),
        "recorded_rate": n / (t_last - t_first),
        "p50_ms": float(np.percentile(latency, 50) * 1000),
        "p99_ms": float(np.percentile(latency, 99) * 1000),
        "bytes_per_event": size / n,
        "wire_bytes": len(items[0][1]),
        "lost": lost,
        "doubled": doubled,
        "files": len(landed.when),
        "cpu_us": cpu_us_per_event(cpu_before, cpu_after, n),
        "publisher_cpu_us": own_cpu / n * 1e6,
        "server_cpu_us": server_cpu / n * 1e6 if server_pids else float("nan"),
        "busy_cores": (own_cpu + server_cpu + recorder_cpu) / (t_last - t_first) if server_pids else float("nan"),
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (None where /proc cannot tell)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def cpu_us_per_event(before: float | None, after: float | None, n: int) -> float:
    return (after - before) / n * 1e6 if before is not None and after is not None and n else float("nan")


def start_recorder(url: str, log_dir: Path, roll_seconds: float) -> subprocess.Popen:
    """`rubick service recorder` as its own process, returned once it says it is ready."""
    recorder = subprocess.Popen(
        [sys.executable, "-m", "controlplane.cli", "service", "recorder", "--nats-url", url, "--log-dir",
         str(log_dir), "--roll-seconds", str(roll_seconds)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=die_with_parent())
    said = []  # warnings may come first (a cluster's elections)
    while not said or "recorder ready" not in said[-1]:
        said.append(recorder.stdout.readline())
        if not said[-1]:
            recorder.wait(30)
            raise RuntimeError(f"the recorder exited before it was ready: {''.join(said[-20:])}")
    return recorder


def bench_events(n: int, prefix: str) -> list[tuple[str, bytes, str]]:
    """(subject, bytes, id) of `n` events, encoded beforehand (producers are many processes in a cluster); each
    carries its id as Nats-Msg-Id, as every publish of the control plane does."""
    events = (make("metrics.iteration", PAYLOAD, time=1.7e9 + i, id=f"{prefix}-{i}", source="bench") for i in range(n))
    return [(e.subject, encode(e), e.id) for e in events]


async def publish_all(bus: JetStreamBus, items: list[tuple[str, bytes, str]], chunk: int) -> None:
    """Publish `items` in chunks, acknowledgements collected per chunk; every one must be stored."""
    for start in range(0, len(items), chunk):
        acks = await bus.publish_many(items[start:start + chunk])
        assert all(a.seq > 0 for a in acks)


@dataclass
class Landed:
    """What each Parquet file of the log held when it landed, read then: the recorder's background compaction
    may merge landed files into a larger one and remove them (the merged file is not counted again)."""

    when: dict[Path, float] = field(default_factory=dict)
    """file -> when it landed (its mtime)"""
    stored: list[np.ndarray] = field(default_factory=list)
    """per file, when the stream stored each of its events (seconds)"""
    size: int = 0
    rows: int = 0
    high: int = 0
    """the highest sequence of a counted file"""


async def landed_rows(log_dir: Path, n: int, seen: Landed, timeout: float = 120.0) -> int:
    """Wait until `n` rows are in the log's Parquet files (or `timeout` s). Files land in sequence order; one whose
    sequences were all counted already is a merge of earlier files and is skipped, and one merged away before it
    was read comes back inside the merge."""
    deadline = time.time() + timeout
    while seen.rows < n and time.time() < deadline:
        for path in sorted(log_dir.glob("events-*.parquet")):
            m = FILE_RE.match(path.name)
            if path in seen.when or m is None or int(m["last"]) <= seen.high:
                continue
            try:
                mtime, size = path.stat().st_mtime, path.stat().st_size
                every = pl.read_parquet(path, columns=["seq", "stored"])
            except (FileNotFoundError, pl.exceptions.ComputeError):  # merged away meanwhile
                continue
            rows = every.filter(pl.col("seq") > seen.high)  # a merge holds counted rows too: not counted again
            stored = rows["stored"].dt.epoch("us").to_numpy() / 1e6
            seen.when[path], seen.high = mtime, int(m["last"])
            seen.size += size * len(rows) // max(1, every.height)
            seen.rows += len(rows)
            seen.stored.append(mtime - stored)
        await asyncio.sleep(0.02)
    return seen.rows


async def drain(url: str, log_dir: Path, n: int, roll_seconds: float, chunk: int = 5000) -> dict:
    """N events stored with no recorder running, then a recorder started on them: its events/s from ready to
    the last of them in Parquet, and lost/doubled rows."""
    bus = await JetStreamBus.connect(url)
    await ensure_lease_bucket(bus.js)
    items = bench_events(n, "d")
    try:
        await publish_all(bus, items, chunk)
    finally:
        await bus.close()
    recorder = start_recorder(url, log_dir, roll_seconds)
    cpu_before = cpu_seconds(recorder.pid)
    t_ready = time.time()
    try:
        count = await landed_rows(log_dir, n, Landed())
        t_done = time.time()
        cpu_after = cpu_seconds(recorder.pid)
    finally:
        recorder.terminate()
        recorder.wait(30)
    ids = scan(log_dir, ["msg_id"]).frame["msg_id"].to_list()
    return {"drain_rate": count / (t_done - t_ready), "drain_lost": n - len(set(ids)),
            "drain_doubled": len(ids) - len(set(ids)), "drain_cpu_us": cpu_us_per_event(cpu_before, cpu_after, count)}


async def one_run(n: int, roll_seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="rubick-bench-") as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            raw_pub, raw_pub_id, raw_con = await raw_limits(server.url, n)
            result = await end_to_end(server.url, Path(tmp) / "events", n, roll_seconds,
                                      server_pids=(server.proc.pid,) if server.proc is not None else ())
        finally:
            server.stop()
        server = NatsServer(Path(tmp) / "nats-drain").start()  # a fresh server and stream
        try:
            result.update(await drain(server.url, Path(tmp) / "drained", n, roll_seconds))
        finally:
            server.stop()
    result["drain_ratio"] = result["drain_rate"] / raw_pub
    result["raw_publish_rate"] = raw_pub
    result["raw_publish_id_rate"] = raw_pub_id
    result["raw_consume_rate"] = raw_con
    result["ratio"] = result["recorded_rate"] / raw_pub
    result["ratio_id"] = result["recorded_rate"] / raw_pub_id
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--roll-seconds", type=float, default=0.5)
    args = parser.parse_args()
    tune()  # the collector's thresholds of a `rubick` process (see above)
    keys = ["raw_publish_rate", "raw_publish_id_rate", "raw_consume_rate", "publish_rate", "recorded_rate", "ratio",
            "ratio_id", "p50_ms", "p99_ms",
            "bytes_per_event", "lost", "doubled", "files", "cpu_us", "publisher_cpu_us", "server_cpu_us",
            "busy_cores", "drain_rate", "drain_ratio", "drain_cpu_us"]
    runs = []
    print(f"{args.n:,} metrics.iteration events per run, {args.runs} runs, recorder roll {args.roll_seconds} s")
    print(" ".join(f"{k[:19]:>19}" for k in keys))
    for _ in range(args.runs):
        r = asyncio.run(one_run(args.n, args.roll_seconds))
        runs.append(r)
        print(" ".join(f"{r[k]:>19,.2f}" if isinstance(r[k], float) else f"{r[k]:>19,}" for k in keys), flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    print(f"median: raw publish {med['raw_publish_rate']:,.0f} msg/s ({med['raw_publish_id_rate']:,.0f} with "
          f"Nats-Msg-Id), raw pull+ack {med['raw_consume_rate']:,.0f} "
          f"msg/s; end-to-end publish {med['publish_rate']:,.0f} msg/s, recorded {med['recorded_rate']:,.0f} msg/s "
          f"= {med['ratio']:.2f} x raw publish (target >= 0.9), {med['ratio_id']:.2f} x raw publish with "
          f"Nats-Msg-Id; latency p50 {med['p50_ms']:.0f} ms, "
          f"p99 {med['p99_ms']:.0f} ms; {med['bytes_per_event']:.1f} bytes/event on disk "
          f"({runs[0]['wire_bytes']} on the wire); lost {sum(r['lost'] for r in runs)}, "
          f"doubled {sum(r['doubled'] for r in runs)}; the recorder alone drained a stored backlog at "
          f"{med['drain_rate']:,.0f} msg/s = {med['drain_ratio']:.2f} x raw publish (lost "
          f"{sum(r['drain_lost'] for r in runs)}, doubled {sum(r['drain_doubled'] for r in runs)}); the recorder's "
          f"CPU per event {med['cpu_us']:.1f} us end to end, {med['drain_cpu_us']:.1f} us draining")
    print(f"end to end, CPU per event: publisher {med['publisher_cpu_us']:.1f} us, nats-server "
          f"{med['server_cpu_us']:.1f} us, recorder {med['cpu_us']:.1f} us; together they kept "
          f"{med['busy_cores']:.2f} cores busy of the {len(os.sched_getaffinity(0))} this process may use (from the "
          f"first publish to the last event in Parquet)")


if __name__ == "__main__":
    main()
