"""`rubick service NAME`: run one control-plane service on its own (as the Helm chart does).

Any number of replicas of a service may run: one is active (it holds the service's lease,
`controlplane.lease`), the others stand by and one of them takes over within the lease's TTL when the
active one dies (at once when it stops cleanly). The active replica of the admission, modeler and policy
services first publishes the description of its core (`run.described`, `replay.live`), so the
deployment replays from its log alone.

`rubick service policy --network MODE` also runs the network scheduler (`policy.network`, docs/network.md)
in the policy's active replica: a second shell beside the policy's, under the same lease (a take-over
moves both), with its own durable consumer (`svc-network`); the policy's description names the network,
so replay rebuilds and checks the network core too. The two shells start and stop together.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from ..bus.nats import JetStreamBus
from ..events import encode
from ..events.payloads import NETWORK_SETTINGS
from ..lease import (DEFAULT_TTL_S, Lease, LeaseBucketMissing, bucket_terms, ensure_lease_bucket, lease_bucket,
                     replica_id, run_replicated)
from ..recorder.service import RecorderConfig, stream_token
from ..replicas import LeasedBus, LeasedRecorder, LeasedShell
from ..ticker import run_ticker
from .. import metrics
from ..auth import Identity
from .common import add_nats_args, credentials_for, run_against_nats
from ..bus.nats import redact_url, until_made

SERVICES = ("recorder", "admission", "clock", "modeler", "policy")


def register(sub) -> None:
    p = sub.add_parser("service", help="run one service against a NATS deployment")
    p.add_argument("name", choices=SERVICES)
    add_nats_args(p)
    p.add_argument("--log-dir", type=Path, default=Path(".rubick/events"), help="recorder: event-log folder")
    p.add_argument("--roll-seconds", type=float, default=2.0, help="recorder: file roll interval")
    p.add_argument("--roll-rows", type=int, default=200_000, help="recorder: rows per file at most")
    p.add_argument("--compact", action=argparse.BooleanOptionalAction, default=True,
                   help="recorder: merge small files in the background (default on; docs/eventlog.md)")
    p.add_argument("--tick-period", type=float, default=60.0, help="clock: seconds between ticks")
    p.add_argument("--policy", default="rubick", help="policy: the scheduling policy (rubick, sia, ...)")
    p.add_argument("--restart-cost", type=float, default=78.0, help="policy: seconds per reconfiguration")
    p.add_argument("--quotas", type=Path, help="policy: YAML or JSON mapping tenant -> guaranteed GPUs")
    p.add_argument("--network", choices=NETWORK_SETTINGS, default="none",
                   help="policy: also run the network scheduler, which publishes network.decided (traffic classes "
                        "the agents pass to NCCL; docs/network.md); none (default) runs none")
    p.add_argument("--network-classes", type=int, default=4, choices=range(1, 9), metavar="1-8",
                   help="policy: traffic classes the fabric offers the network scheduler (default 4)")
    p.add_argument("--metrics-port", type=int, default=-1, help="Prometheus port (-1 = off)")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="address /metrics listens on (0.0.0.0 in a pod, for Prometheus to reach it)")
    p.add_argument("--lease-ttl", type=float, default=DEFAULT_TTL_S,
                   help="seconds after which a standby replica takes over from a dead active one; used when this "
                        "service creates the lease bucket (an existing bucket keeps its own)")
    p.add_argument("--bootstrap", action="store_true",
                   help="create the stream and the lease bucket if missing (needs the bootstrap identity; the "
                        "default without credentials)")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=run)


def read_quotas(path: Path | None) -> dict[str, int] | None:
    """Tenant quotas (GPUs for guaranteed jobs) from a YAML/JSON mapping; None without a file."""
    if path is None:
        return None
    import yaml
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                             and v >= 0 for k, v in data.items()):
        raise ValueError(f"{path}: quotas must map tenant names to whole numbers of GPUs >= 0")
    return data


def run(args: argparse.Namespace) -> int:
    if args.name != "policy" and (args.network != "none" or args.network_classes != 4):
        print(f"rubick service {args.name}: --network and --network-classes are the policy service's "
              "(the network scheduler runs beside the policy)", file=sys.stderr)
        return 2
    return run_against_nats(args, _run)


async def _run(args: argparse.Namespace, url: str) -> int:
    credentials = credentials_for(args, Identity(args.name))
    # without credentials (an open NATS) a service makes sure the stream and the lease bucket exist; with its
    # role's credentials it may only use them: the bootstrap identity creates them (`rubick auth bootstrap`)
    bootstrap = args.bootstrap or credentials.seed_file is None
    bus = await JetStreamBus.connect(url, name=f"rubick-{args.name}", credentials=credentials,
                                     create_stream=bootstrap)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.metrics_port >= 0:
        metrics.serve(args.metrics_port, args.metrics_host)
    try:
        kv = await (ensure_lease_bucket(bus.js, args.lease_ttl) if bootstrap else _bootstrapped(bus, args.name, stop))
        if kv is None:  # stopped while waiting
            return 0
        lease = Lease(kv, args.name, replica_id(), await bucket_terms(kv))
        term = _Term(args, url, bus)
        await term.prepare()

        def standby() -> None:
            print(f"{args.name} standby: {redact_url(url)}, another replica is active (lease TTL {lease.terms.ttl_s:g} s)",
                  flush=True)

        await run_replicated(lease, term, stop, on_standby=standby)
    finally:
        await bus.close()
    return 0


async def _bootstrapped(bus: JetStreamBus, name: str, stop: asyncio.Event):
    """The lease bucket, once the deployment's bootstrap has made it (after the stream). A service with its
    role's credentials may not make either, and may start first: on Kubernetes the chart's bootstrap Job
    runs after the Deployments are up. It waits, saying so once, rather than exit and restart; None when
    stopped meanwhile."""
    return await until_made(lambda: lease_bucket(bus.js), stop, lambda why: print(
        f"{name} waiting for the deployment's bootstrap (`rubick auth bootstrap`): {why}", flush=True),
        missing=(LeaseBucketMissing,))


class _Term:
    """What the active replica of a service runs. A core is built before the replica becomes active
    (a take-over does not wait for it) and used for one term only: its state is rebuilt from the
    stream at the start of each term. The policy's term may run the network core beside it (`--network`):
    both are built together, run side by side under the same lease, and stop together."""

    def __init__(self, args: argparse.Namespace, url: str, bus: JetStreamBus) -> None:
        self.args, self.url, self.bus = args, url, bus
        self.name: str = args.name
        self.next: tuple[list[Any], Any] | None = None
        self.described: str | None = None
        """the id of the `run.described` this process stored last: a later term of the same process (its lease lost
        and taken again, as when NATS was away) describes the same core and publishes nothing. Publishing it again
        would store it twice once the stream's de-duplication window has passed."""

    def _build(self) -> tuple[list[Any], Any]:
        """([core, ...], description) of the admission, modeler or policy service, as `rubick up` builds
        them: the service's core, and for the policy with `--network` the network core after it."""
        from replay.config import default_cache_dir
        from replay.live import NETWORK_CORE, deployment, describe

        from ..runtime import UpConfig, deployment_config

        network = self.args.network if self.name == "policy" else "none"
        cfg = deployment_config(UpConfig(policy=self.args.policy, restart_cost_s=self.args.restart_cost,
                                         quotas=read_quotas(self.args.quotas), network=network,
                                         network_classes=self.args.network_classes))
        parts, cores = deployment(cfg, cache_dir=default_cache_dir())
        names = (self.name, NETWORK_CORE) if network != "none" else (self.name,)
        return [next(c for c in cores if c.name == n) for n in names], describe(self.name, cfg, parts)

    async def prepare(self) -> None:
        if self.name in ("admission", "modeler", "policy") and self.next is None:
            self.next = await asyncio.to_thread(self._build)

    async def __call__(self, stop: asyncio.Event, lease: Lease) -> None:
        args, url = self.args, self.url
        bus = LeasedBus(self.bus, lease)
        if args.name == "recorder":
            cfg = RecorderConfig(args.log_dir, roll_seconds=args.roll_seconds, roll_rows=args.roll_rows,
                                 compact=args.compact)
            recorder = LeasedRecorder(bus, cfg, stream_token(await self.bus.stream_created()), lease)
            await self._until_ready(recorder.run(stop), [recorder.ready], f"recorder ready: {redact_url(url)} -> {args.log_dir}")
        elif args.name == "clock":
            print(f"clock ready: {redact_url(url)}, a tick every {args.tick_period:g} s", flush=True)
            await run_ticker(bus, args.tick_period, stop)
        else:
            await self.prepare()
            (cores, description), self.next = self.next, None
            from replay.live import description_event

            event = description_event(description, time.time())
            if event.id != self.described:
                await bus.publish(event.subject, encode(event), event.id)
                self.described = event.id
            shells = [LeasedShell(core, bus, rejects=args.name == "admission", lease=lease) for core in cores]
            line = f"{args.name} ready: {redact_url(url)}"
            if len(shells) > 1:
                line += f", with the network scheduler ({args.network}, {args.network_classes} traffic classes)"
            work = shells[0].run(stop) if len(shells) == 1 else together([s.run for s in shells], stop)
            await self._until_ready(work, [s.ready for s in shells], line)

    @staticmethod
    async def _until_ready(work, ready: list[asyncio.Event], line: str) -> None:
        """Run `work`, saying `line` once every one of `ready` is set (not at all if it ends first)."""
        task = asyncio.create_task(work)
        waiter = asyncio.create_task(all_set(ready))
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if all(r.is_set() for r in ready):
            print(line, flush=True)
        await task


async def all_set(events: list[asyncio.Event]) -> None:
    """Until every one of `events` is set."""
    for e in events:
        await e.wait()


async def together(runs: list[Callable[[asyncio.Event], Awaitable[None]]], stop: asyncio.Event) -> None:
    """Run `run(inner_stop)` for each of `runs` side by side, and stop them together: when `stop` is set, or
    as soon as one of them ends (returns or raises), the others are told to stop and awaited. The first
    failure (in the order they ended) is raised once all have ended, so a lease lost in one ends the term of
    all."""
    inner = asyncio.Event()
    ended: list[asyncio.Task] = []
    tasks = [asyncio.create_task(run(inner)) for run in runs]
    for t in tasks:
        t.add_done_callback(ended.append)
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        inner.set()
        await asyncio.wait(tasks)
    finally:
        inner.set()
        stopper.cancel()
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)
    for t in ended:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()
