"""`rubick service NAME`: run one control-plane service on its own (as the Helm chart does)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from ..admission import AdmissionCore
from ..bus.nats import JetStreamBus
from ..models import builtin_model_types
from ..recorder.service import Recorder, RecorderConfig, stream_token
from ..service import ServiceShell
from ..ticker import run_ticker
from .. import metrics
from .common import add_nats_args, run_against_nats

SERVICES = ("recorder", "admission", "clock", "modeler", "policy")


def register(sub) -> None:
    p = sub.add_parser("service", help="run one service against a NATS deployment")
    p.add_argument("name", choices=SERVICES)
    add_nats_args(p)
    p.add_argument("--log-dir", type=Path, default=Path(".rubick/events"), help="recorder: event-log folder")
    p.add_argument("--roll-seconds", type=float, default=2.0, help="recorder: file roll interval")
    p.add_argument("--roll-rows", type=int, default=200_000, help="recorder: rows per file at most")
    p.add_argument("--tick-period", type=float, default=60.0, help="clock: seconds between ticks")
    p.add_argument("--policy", default="rubick", help="policy: the scheduling policy (rubick, sia, ...)")
    p.add_argument("--restart-cost", type=float, default=78.0, help="policy: seconds per reconfiguration")
    p.add_argument("--quotas", type=Path, help="policy: YAML or JSON mapping tenant -> guaranteed GPUs")
    p.add_argument("--metrics-port", type=int, default=-1, help="Prometheus port (-1 = off)")
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
    return run_against_nats(args, _run)


async def _run(args: argparse.Namespace, url: str) -> int:
    bus = await JetStreamBus.connect(url, name=f"rubick-{args.name}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.metrics_port >= 0:
        metrics.serve(args.metrics_port)
    try:
        if args.name == "recorder":
            cfg = RecorderConfig(args.log_dir, roll_seconds=args.roll_seconds, roll_rows=args.roll_rows)
            recorder = Recorder(bus, cfg, stream_token(await bus.stream_created()))
            task = asyncio.create_task(recorder.run(stop))
            await recorder.ready.wait()
            print(f"recorder ready: {url} -> {args.log_dir}", flush=True)
            await task
        elif args.name == "admission":
            shell = ServiceShell(AdmissionCore(builtin_model_types()), bus, rejects=True)
            task = asyncio.create_task(shell.run(stop))
            await shell.ready.wait()
            print(f"admission ready: {url}", flush=True)
            await task
        elif args.name in ("modeler", "policy"):
            from ..runtime import UpConfig, model_cores
            cfg = UpConfig(policy=args.policy, restart_cost_s=args.restart_cost, quotas=read_quotas(args.quotas))
            core = (await asyncio.to_thread(model_cores, cfg))[0 if args.name == "modeler" else 1]
            shell = ServiceShell(core, bus)
            task = asyncio.create_task(shell.run(stop))
            await shell.ready.wait()
            print(f"{args.name} ready: {url}", flush=True)
            await task
        else:
            print(f"clock ready: {url}, a tick every {args.tick_period:g} s", flush=True)
            await run_ticker(bus, args.tick_period, stop)
    finally:
        await bus.close()
    return 0
