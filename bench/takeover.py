"""Take-over time of a replicated service after kill -9 of its active replica, median of runs.

Two `rubick service policy` replicas run against a nats-server; a cluster of two nodes with a few jobs
is in the stream. Each run kills the active replica with SIGKILL, publishes a new submission at once,
and measures (1) the time until the standby says it is active and ready (lease expiry + state rebuild)
and (2) the time until the new active replica has handled (and answered) the new submission: the gap
the cluster sees. A new
standby is started before the next run.

    python bench/takeover.py [--runs 5] [--ttl 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nats.js.errors

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.bus.nats import JetStreamBus  # noqa: E402
from controlplane.events import JobSubmitted, ModelRef, NodeRegistered, Plan, Resources, encode, make  # noqa: E402
from controlplane.lease import Lease, bucket_terms, ensure_lease_bucket  # noqa: E402
from controlplane.natsserver import NatsServer  # noqa: E402


class Replica:
    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "service", "policy", "--nats-url", url],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.ready_at: float | None = None
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if "policy ready" in line and self.ready_at is None:
                self.ready_at = time.perf_counter()

    async def says(self, word: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(f"policy {word}" in line for line in self.lines):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"replica did not say {word!r}: {self.lines[-5:]}")
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def submission(i: int):
    sub = JobSubmitted(job_id=f"vit-{i}", tenant="team-a", guaranteed=True, model=ModelRef(type="vit"),
                       global_batch_size=64, plan=Plan(dp=1), resources=Resources(gpus=1), target_iterations=1000)
    return make("job.submitted", sub, time=time.time(), id=f"sub-{i}", source="bench")


async def handled(bus: JetStreamBus, seq: int, timeout: float = 120.0) -> float:
    """When the policy's durable consumer has acknowledged stream message `seq` (handled and answered)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = await bus.js.consumer_info(bus.stream, "svc-policy")
        except nats.js.errors.NotFoundError:  # the new active replica is re-creating it
            await asyncio.sleep(0.01)
            continue
        if info.ack_floor and int(info.ack_floor.stream_seq or 0) >= seq:
            return time.perf_counter()
        await asyncio.sleep(0.01)
    raise RuntimeError(f"message {seq} not handled")


async def bench(runs: int, ttl: float) -> tuple[list[float], list[float]]:
    ready, handled_s = [], []
    with tempfile.TemporaryDirectory(prefix="rubick-takeover-") as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        replicas: list[Replica] = []
        bus = await JetStreamBus.connect(server.url)
        try:
            kv = await ensure_lease_bucket(bus.js, ttl)
            lease = Lease(kv, "policy", "bench", await bucket_terms(kv))
            for i in range(2):
                n = make("node.registered", NodeRegistered(node=f"n{i}", gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0),
                         time=time.time(), id=f"node-{i}", source=f"agent-n{i}")
                await bus.publish(n.subject, encode(n), n.id)
            replicas = [Replica(server.url), Replica(server.url)]
            for r in replicas:
                await _either(r)
            for k in range(3):
                e = submission(k)
                await bus.publish(e.subject, encode(e), e.id)
            for run in range(runs):
                holder = await lease.holder_now() or ""
                active = next(r for r in replicas if f"-{r.proc.pid}-" in holder)
                standby = next(r for r in replicas if r is not active)
                t0 = time.perf_counter()
                os.kill(active.proc.pid, signal.SIGKILL)
                active.proc.wait()
                e = submission(100 + run)
                ack = await bus.publish(e.subject, encode(e), e.id)
                t_handled = await handled(bus, ack.seq)
                await standby.says("ready")
                ready.append(standby.ready_at - t0)
                handled_s.append(t_handled - t0)
                print(f"run {run + 1}: standby ready after {ready[-1]:.2f} s, submission made at the kill handled after "
                      f"{handled_s[-1]:.2f} s", flush=True)
                replicas = [standby, Replica(server.url)]
                await _either(replicas[1])
        finally:
            for r in replicas:
                r.stop()
            await bus.close()
            server.stop()
    return ready, handled_s


async def _either(r: Replica) -> None:
    deadline = time.monotonic() + 120
    while not any("policy ready" in x or "policy standby" in x for x in r.lines):
        if time.monotonic() > deadline or r.proc.poll() is not None:
            raise RuntimeError(f"replica not started: {r.lines[-5:]}")
        await asyncio.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ttl", type=float, default=5.0, help="the lease bucket's TTL (s)")
    args = parser.parse_args()
    ready, handled_s = asyncio.run(bench(args.runs, args.ttl))
    print(f"take-over after kill -9 (lease TTL {args.ttl:g} s, {args.runs} runs): standby active and ready: median "
          f"{statistics.median(ready):.2f} s (min {min(ready):.2f}, max {max(ready):.2f}); a submission made at the "
          f"kill handled and answered: median {statistics.median(handled_s):.2f} s (min {min(handled_s):.2f}, max {max(handled_s):.2f})")


if __name__ == "__main__":
    main()
