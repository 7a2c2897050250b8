"""The fault matrix's harness: a deployment of separate `rubick service` processes (and, where the fault is
the agent, a real `rubick agent`) on real nats-server processes on 127.0.0.1 (open servers: authorisation is
tested in tests/security), a bounded stream of acknowledged submissions and measured iterations, kill -9 of
one target in the middle of it, its restart (or a standby's take-over), and the checks:

- every acknowledged event id is in the Parquet log exactly once, and the log holds stream sequences
  1..last with no gap or duplicate;
- the cluster state folded from the log equals the state folded from the live stream;
- `rubick replay <log>` verifies (exit 0).

Used by tests/faults/ and bench/faults.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from controlplane.bus.nats import JetStreamBus
from controlplane.cli.status import live_state
from controlplane.eventlog import scan
from controlplane.events import (Event, Invalid, JobSubmitted, MetricsIteration, ModelRef, NodeRegistered, Plan,
                                 Resources, decode, encode, make)
from controlplane.lease import Lease, bucket_terms, ensure_lease_bucket
from controlplane.lifetime import die_with_parent
from controlplane.models import builtin_model_types
from controlplane.natsserver import NatsServer, free_port
from controlplane.state import fold

REPO = Path(__file__).resolve().parents[2]
LEASE_TTL = 2.0
"""The lease bucket's TTL: a restarted or standby service takes over this long after kill -9 of the active one."""
SERVICES = ("admission", "modeler", "policy")
FAULTS = ("policy", "modeler", "admission", "recorder", "agent", "active replica", "nats server")
"""The matrix: kill -9 of each service, of the node agent, of every service's active replica (a standby of each
takes over), and of one server of a three-server NATS cluster."""
DURABLES = ("svc-admission", "svc-modeler", "svc-policy", "recorder")
MODELS = (("vit", 64, 2), ("bert", 32, 2), ("gpt2", 16, 4), ("vit", 64, 1))


class Proc:
    """A `rubick ...` process whose output lines are collected as they come."""

    def __init__(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})},
                                     preexec_fn=die_with_parent())  # a killed test or bench leaves none behind
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    async def said(self, *words: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if any(w in line for w in words):
                    return line
            if self.proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        raise AssertionError(f"{self.name} did not say {words}: {self.lines[-20:]}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Nats:
    """One nats-server, or three clustered with JetStream (routes on loopback, distinct names, each its own
    store); `url` lists them all."""

    def __init__(self, base: Path, size: int = 1) -> None:
        self.base, self.size = base, size
        cluster_ports = [free_port() for _ in range(size)] if size > 1 else [0]
        routes = tuple(f"nats://127.0.0.1:{p}" for p in cluster_ports) if size > 1 else ()
        self.servers = [NatsServer(base / f"nats-{i}", server_name=f"rubick-{i}", cluster_port=cluster_ports[i],
                                   routes=routes) for i in range(size)]
        for s in self.servers:
            s.spawn()
        for s in self.servers:
            s.wait_ready(30)

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    async def meta_leader(self, timeout: float = 60.0) -> float:
        """Until the cluster has elected its JetStream meta leader (the JetStream API answers: a server without
        one refuses or stays silent); seconds waited."""
        import nats
        import nats.errors
        import nats.js.errors

        t0 = time.monotonic()
        nc = await nats.connect([s.url for s in self.servers], connect_timeout=5.0)
        try:
            js = nc.jetstream(timeout=1.0)
            while True:
                try:
                    await js.account_info()
                    return time.monotonic() - t0
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.APIError):
                    if time.monotonic() - t0 > timeout:
                        raise AssertionError(f"no JetStream meta leader in the cluster after {timeout} s") from None
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    def named(self, name: str) -> int:
        """The index of the server called `name`."""
        return next(i for i, s in enumerate(self.servers) if s.server_name == name)

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def restart(self, i: int) -> None:
        """The same store, client port and cluster port."""
        old = self.servers[i]
        self.servers[i] = NatsServer(old.data_dir, port=old.port, server_name=old.server_name,
                                     cluster_port=old.cluster_port, routes=old.routes).start(30)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def submission(i: int, t0: float) -> Event:
    model, gbs, gpus = MODELS[i % len(MODELS)]
    job = JobSubmitted(job_id=f"{model}-{i}", tenant="team-a" if i % 2 else "team-b", guaranteed=i % 3 == 0,
                       model=ModelRef(type=model), global_batch_size=gbs, plan=Plan(dp=gpus),
                       resources=Resources(gpus=gpus), target_iterations=1000)
    return make("job.submitted", job, time=t0 + i, id=f"sub-{i}", source="test")


def measured(i: int, t0: float, node: str = "n1") -> Event:
    """A measured iteration of the job submitted before the i-th, as node `node`'s agent would send it."""
    model, _, gpus = MODELS[(i - 1) % len(MODELS)]
    it = MetricsIteration(job_id=f"{model}-{i - 1}", model_type=model, iteration=i, iter_time_s=0.5 + 0.01 * i,
                          plan=Plan(dp=gpus), gpus_per_node=(gpus,), node=node)
    return make(f"metrics.iteration.{node}", it, time=t0 + 0.5 + i, id=f"it-{i}", source=f"agent-{node}")


def registered(node: str, t0: float) -> Event:
    n = NodeRegistered(node=node, gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0)
    return make(f"node.registered.{node}", n, time=t0, id=f"node-{node}", source=f"agent-{node}")


@dataclass
class Outcome:
    fault: str
    acked: int = 0
    lost: int = 0
    duplicates: int = 0
    gaps: int = 0
    state_equal: bool = False
    replay_rc: int = -1
    recover_s: float = 0.0
    """From the kill until the target is back: restarted and ready, a standby active and ready, or the
    server back in the cluster with a current copy of the stream."""
    notes: list[str] = field(default_factory=list)
    settled: bool = True
    """Whether every service caught up with the stream afterwards."""

    @property
    def survived(self) -> bool:
        return (not (self.lost or self.duplicates or self.gaps) and self.state_equal and self.replay_rc == 0
                and self.settled)


@dataclass
class Deployment:
    tmp: Path
    nats_size: int = 1
    replicas: int = 1
    agent: bool = False
    lease_ttl: float = LEASE_TTL
    services: tuple[str, ...] = ("recorder", *SERVICES)
    """The `rubick service` processes started (each `replicas` times)."""
    agent_args: tuple[str, ...] = ()
    """Added to the agent's command line."""
    nats: Nats | None = None
    bus: JetStreamBus | None = None
    procs: dict[str, list[Proc]] = field(default_factory=dict)
    acked: list[str] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.tmp / "events"

    @property
    def durables(self) -> list[str]:
        """The durable consumers of the services started."""
        return [d for d in DURABLES if d.removeprefix("svc-") in self.services]

    @property
    def agent_state(self) -> Path:
        return self.tmp / "agent"

    async def start(self) -> "Deployment":
        self.nats = Nats(self.tmp, self.nats_size)  # on the main thread: the servers stop with this process
        replicas = 3 if self.nats_size > 1 else 1
        if self.nats_size > 1:
            await self.nats.meta_leader()
        self.bus = await connect(self.nats.url, replicas=replicas)  # the deployment's bootstrap: stream, leases
        await ensure_lease_bucket(self.bus.js, self.lease_ttl, replicas=replicas)
        for name in self.services:
            self.procs[name] = [self.service(name) for _ in range(self.replicas)]
        if self.agent:
            self.procs["agent"] = [self.start_agent()]
        for ps in self.procs.values():
            for p in ps:
                await p.said("ready", "standby")
        return self

    def service(self, name: str) -> Proc:
        extra = ["--log-dir", str(self.log), "--roll-seconds", "0.2"] if name == "recorder" else []
        return Proc(name, ["service", name, "--nats-url", self.nats.url, "--log-level", "warning", *extra])

    def start_agent(self) -> Proc:
        return Proc("agent", ["agent", "--nats-url", self.nats.url, "--node", "n0", "--cpu-devices", "2",
                              "--state-dir", str(self.agent_state), "--heartbeat", "0.5", "--log-level", "warning",
                              *self.agent_args],
                    env={"RUBICK_AGENT_LEASE_S": "60"})

    async def active(self, name: str, timeout: float = 30.0) -> Proc:
        """The replica of `name` holding its lease now."""
        kv = await ensure_lease_bucket(self.bus.js, self.lease_ttl)
        lease = Lease(kv, name, "test", await bucket_terms(kv))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            holder = await lease.holder_now()
            for p in self.procs[name]:
                if holder and f"-{p.proc.pid}-" in holder and p.proc.poll() is None:
                    return p
            await asyncio.sleep(0.05)
        raise AssertionError(f"no live replica of {name} holds its lease")

    async def publish(self, e: Event, timeout: float = 120.0) -> None:
        """Until the stream acknowledges it (a server may be down: the same id is stored once)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ack = await self.bus.publish(e.subject, encode(e), e.id, timeout=1.0, retries=0)
                if ack.seq > 0:
                    self.acked.append(e.id)
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)

    async def settled(self, timeout: float = 120.0) -> int:
        """Until every service's durable has handled the whole stream and the stream stopped growing; the
        stream's last sequence."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                last = await self.bus.last_seq()
                infos = [await self.bus.js.consumer_info(self.bus.stream, d) for d in self.durables]
                if all(not (i.num_pending or i.num_ack_pending) for i in infos):
                    await asyncio.sleep(1.0)
                    if await self.bus.last_seq() == last:
                        return last
                    continue
            except Exception:  # a consumer being re-created, a server coming back
                pass
            await asyncio.sleep(0.1)
        try:
            got = {d: ((i := await self.bus.js.consumer_info(self.bus.stream, d)).ack_floor.stream_seq, i.num_pending)
                   for d in self.durables}
        except Exception as exc:
            got = repr(exc)
        said = {n: [(p.proc.poll(), p.lines[-8:]) for p in ps] for n, ps in self.procs.items()}
        raise AssertionError(f"the deployment did not catch up with the stream (last {await self.bus.last_seq()}; "
                             f"durable: (acknowledged, pending): {got}; exit codes and last lines: {said})")

    async def current(self, server: str, timeout: float = 60.0) -> None:
        """Until `server` holds a current copy of the stream."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = await self.bus.js.stream_info(self.bus.stream)
                peers = {p.name: p.current for p in (info.cluster.replicas or [])} if info.cluster else {}
                if info.cluster and (info.cluster.leader == server or peers.get(server)):
                    return
            except Exception:
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"{server} did not catch up with the stream")

    async def stop_agent(self) -> None:
        from tests.agents.helpers import kill_jobs
        for p in self.procs.pop("agent", []):
            p.stop()
        kill_jobs(self.agent_state)

    async def stop(self) -> None:
        for ps in self.procs.values():
            for p in ps:
                p.stop()
        if self.agent:
            await self.stop_agent()
        if self.bus is not None:
            await self.bus.close()
        if self.nats is not None:
            self.nats.stop()

    async def _live_state(self, last: int, attempts: int = 5):
        """The fold of the live stream up to sequence `last`. After a server was killed the JetStream cluster may still be moving a consumer leader when the check starts: a
        consumer create that times out is tried again (the check reads; it does not judge how fast the cluster
        recovers)."""
        import nats.errors
        for attempt in range(attempts):
            try:
                return await live_state(self.nats.url, end_seq=last)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(1.0)

    async def check(self, outcome: Outcome, last: int) -> Outcome:
        from controlplane.cli import main

        frame = scan(self.log, ["msg_id"]).frame.sort("seq")
        ids, seqs = frame["msg_id"].to_list(), frame["seq"].to_list()
        outcome.acked = len(self.acked)
        outcome.lost = len(set(self.acked) - set(ids))
        outcome.duplicates = len(seqs) - len(set(seqs)) + len(ids) - len(set(ids))
        outcome.gaps = len(set(range(1, last + 1)) - set(seqs))
        # both folds end at `last`, where the deployment was seen settled: an event stored after it (a service's late
        # answer) may be in the stream and not yet in a file of the log, and is not a difference
        upto, problems = _log_upto(self.log, last)
        outcome.notes += [f"{p}: {r}" for p, r in problems]
        from_log = fold(upto, known_models=builtin_model_types())
        live = await self._live_state(last)
        later = await self.bus.last_seq() - last
        if later > 0:
            outcome.notes.append(f"{later} event(s) stored after the deployment settled at {last} (not compared)")
        outcome.state_equal = from_log == live
        if not outcome.state_equal:
            outcome.notes.append(f"state differs: log folded {from_log.events} events, live {live.events}")
        outcome.replay_rc = await asyncio.to_thread(main, ["replay", str(self.log)])
        return outcome


def _log_upto(log: Path, last: int) -> tuple[list[Event], list]:
    """The log's decodable events up to sequence `last`, in stream order, and what reading its files found wrong."""
    found = scan(log, ["subject", "data"])
    out = []
    for subject, data in found.frame.filter(pl.col("seq") <= last).sort("seq").select("subject", "data").iter_rows():
        try:
            out.append(decode(data, subject))
        except Invalid:
            continue
    return out, found.problems


async def connect(url: str, replicas: int = 1, timeout: float = 60.0) -> JetStreamBus:
    """A connection making sure the stream exists (a cluster takes a few seconds to elect a leader)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await JetStreamBus.connect(url, replicas=replicas)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def run_fault(fault: str, tmp: Path, submissions: int = 40) -> Outcome:
    """One row of the matrix: deploy, stream, kill -9 `fault` in the middle, restart or take over, check."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: one of {FAULTS}")
    d = Deployment(tmp, nats_size=3 if fault == "nats server" else 1, replicas=2 if fault == "active replica" else 1,
                   agent=fault == "agent")
    outcome = Outcome(fault)
    t0 = time.time()
    await d.start()
    try:
        for node in ("n1", "n2"):
            await d.publish(registered(node, t0))
        recovered = None
        for i in range(submissions):
            if i == submissions // 2:
                recovered = asyncio.create_task(timed(kill(d, fault, outcome)))
                await asyncio.sleep(0)
            await d.publish(submission(i, t0))
            if i:
                await d.publish(measured(i, t0))
            await asyncio.sleep(0.1)
        outcome.recover_s = await recovered
        if fault == "agent":  # its heartbeats would keep the stream growing: stop it and its trainers
            await d.stop_agent()
        try:
            last = await d.settled()
        except AssertionError as exc:  # checked all the same: what the log lacks is counted lost
            outcome.notes.append(str(exc))
            last = await d.bus.last_seq()
        await d.check(outcome, last)
        outcome.settled = not outcome.notes or not outcome.notes[-1].startswith("the deployment did not")
    finally:
        await d.stop()
    return outcome


async def timed(work) -> float:
    t0 = time.monotonic()
    await work
    return time.monotonic() - t0


async def kill(d: Deployment, fault: str, outcome: Outcome) -> None:
    """kill -9 the target now; returns once it is back: restarted and ready, its standby active and ready,
    or the server back in the cluster with the stream current on it."""
    if fault == "active replica":
        standbys = []
        for name in ("recorder", *SERVICES):
            active = await d.active(name)
            active.kill9()
            standbys += [(p, name) for p in d.procs[name] if p is not active]
        for p, name in standbys:
            await p.said(f"{name} ready", timeout=120)
        return
    if fault == "nats server":
        info = await d.bus.js.stream_info(d.bus.stream)
        leader = info.cluster.leader if info.cluster else ""
        i = next(k for k, s in enumerate(d.nats.servers) if s.server_name != leader)
        outcome.notes.append(f"killed {d.nats.servers[i].server_name}, a follower of the stream (leader {leader})")
        d.nats.kill(i)
        await asyncio.sleep(2.0)  # down while the stream goes on
        d.nats.restart(i)  # on the main thread, as at the start
        await d.current(d.nats.servers[i].server_name)
        return
    d.procs[fault][0].kill9()
    d.procs[fault] = [d.start_agent() if fault == "agent" else d.service(fault)]
    await d.procs[fault][0].said(f"{fault} n0 ready" if fault == "agent" else f"{fault} ready", timeout=120)
