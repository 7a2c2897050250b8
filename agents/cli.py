"""`rubick agent` (the node agent) and `rubick profile` (measure a model type on this machine)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
from pathlib import Path
from typing import Any

from controlplane.cli.common import add_nats_args, fail, run_against_nats
from controlplane.bus.nats import redact_url


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="run the node agent: register, heartbeat, carry out plan.decided")
    add_nats_args(p)
    p.add_argument("--node", default=socket.gethostname().split(".")[0], help="node name (default: host name)")
    p.add_argument("--cpu-devices", type=int, default=0, metavar="N",
                   help="no GPUs: offer N CPU worker slots as the node's devices")
    p.add_argument("--cpus", type=int, default=0, help="CPU cores offered (default: all usable)")
    p.add_argument("--mem-gb", type=float, default=0.0, help="host memory offered, GB (default: all)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="jobs' run files, logs, checkpoints (default: <data-dir>/agent-<node>)")
    p.add_argument("--reporter-creds", type=Path,
                   help="nkey seed file the node's training processes report with (default: reporter-<node>.nk "
                        "beside the agent's own)")
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
    p.add_argument("--stop-timeout", type=float, default=300.0,
                   help="seconds a job gets to checkpoint and exit before it is killed")
    p.add_argument("--size", default="tiny", help="example trainer: model size (tiny, small, medium)")
    p.add_argument("--seed", type=int, default=0, help="example trainer: seed")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="example trainer: also checkpoint every N iterations (0: only when asked)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run_agent)

    from .profile import register_profile
    register_profile(sub)


def run_agent(args: argparse.Namespace) -> int:
    if args.cpu_devices < 0:
        return fail("--cpu-devices must be >= 0")
    return run_against_nats(args, _agent)


async def _agent(args: argparse.Namespace, url: str) -> int:
    from controlplane.bus.nats import JetStreamBus

    from .launcher import LocalLauncher
    from .node import discover
    from .shell import AgentShell, state_dir_for

    capacity = discover(args.node, cpu_devices=args.cpu_devices or None, cpus=args.cpus or None,
                        mem_gb=args.mem_gb or None)
    if capacity.gpus == 0:
        print(f"rubick agent: no GPUs found on {args.node}; use --cpu-devices N to run on the CPU", flush=True)
    state_dir = args.state_dir or state_dir_for(args.data_dir, args.node)
    launcher = LocalLauncher(state_dir, args.node, url, cpu_devices=capacity.cpu_devices,
                             run_extra={"size": args.size, "seed": args.seed,
                                        "checkpoint_every": args.checkpoint_every},
                             stop_timeout_s=args.stop_timeout)
    credentials = agent_credentials(args)
    launcher.env.update(reporter_env(args, credentials))
    bus = await JetStreamBus.connect(url, name=f"rubick-agent-{args.node}", create_stream=False,
                                     credentials=credentials)
    shell = AgentShell(bus, capacity, launcher, heartbeat_s=args.heartbeat)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        task = asyncio.create_task(shell.run(stop))
        ready = asyncio.create_task(shell.ready.wait())
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        print(f"agent {args.node} ready: {capacity.gpus} {'CPU device slots' if capacity.cpu_devices else 'GPUs'}, "
              f"{capacity.cpus} CPUs, {capacity.mem_gb:g} GB | NATS {redact_url(url)} | state {state_dir}", flush=True)
        await task
    finally:
        await bus.close()
    return 0


def agent_credentials(args: argparse.Namespace):
    """The agent's own credentials: --creds, $RUBICK_NATS_CREDS, or DATA_DIR/auth/agent-<node>.nk, created
    there (with its reporter's) when this machine holds the credentials folder of a `rubick up`."""
    from controlplane.auth import AuthStore, Identity
    from controlplane.cli.common import credentials_for
    from controlplane.runtime import read_endpoints

    identity = Identity("agent", args.node)
    found = credentials_for(args, identity)
    endpoints = read_endpoints(args.data_dir) or {}
    if found.seed_file is None and endpoints.get("auth_dir"):
        from controlplane.auth.admin import provision
        provision(AuthStore(endpoints["auth_dir"]), [identity, Identity("reporter", args.node)], endpoints)
        print(f"rubick agent: created credentials for {identity.name} in {endpoints['auth_dir']}", flush=True)
        found = credentials_for(args, identity)
    return found


def reporter_env(args: argparse.Namespace, agent) -> dict[str, str]:
    """What the node's training processes connect with: the node's reporter identity (it may publish only
    this node's `metrics.iteration`), found beside the agent's seed file; TLS as the agent's."""
    from controlplane.auth.credentials import ENV_CREDS, ENV_TLS_CA

    env = {}
    if agent.seed_file is not None:
        reporter = Path(agent.seed_file).with_name(f"reporter-{args.node}.nk")
        if args.reporter_creds:
            reporter = Path(args.reporter_creds)
        if reporter.exists():
            env[ENV_CREDS] = str(reporter.resolve())
        else:
            print(f"rubick agent: no reporter credentials at {reporter}: training processes cannot report "
                  "iterations (give --reporter-creds)", flush=True)
    if agent.tls_ca is not None:
        env[ENV_TLS_CA] = str(Path(agent.tls_ca).resolve())
    return env
