"""`rubick up`: run the control plane until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from pathlib import Path

from ..events.payloads import NETWORK_SETTINGS
from ..runtime import DEFAULT_DATA_DIR, DEFAULT_NATS_PORT, ControlPlane, UpConfig
from .common import fail


def register(sub) -> None:
    p = sub.add_parser("up", help="run the control plane (embedded NATS + JetStream, recorder, admission, clock)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="local data folder (default .rubick)")
    p.add_argument("--nats-url", help="use this NATS deployment instead of starting the embedded server")
    p.add_argument("--port", type=int, default=None,
                   help=f"port of the embedded NATS server (an error if taken; default: the one this data folder "
                        f"used last, else {DEFAULT_NATS_PORT}, else a free one)")
    p.add_argument("--metrics-port", type=int, default=9464, help="Prometheus port (default 9464; -1 = off)")
    p.add_argument("--tick-period", type=float, default=60.0, help="seconds between clock.tick (0 = none)")
    p.add_argument("--policy", default="rubick",
                   help="scheduling policy: rubick, rubick-e, rubick-r, rubick-n, sia, synergy, antman, equal")
    p.add_argument("--restart-cost", type=float, default=78.0,
                   help="seconds one reconfiguration costs (default 78; with --sim-cluster also what the simulated "
                        "agents charge)")
    p.add_argument("--quotas", type=Path, help="YAML/JSON mapping tenant -> GPUs for guaranteed jobs")
    p.add_argument("--network", choices=NETWORK_SETTINGS, default="none",
                   help="schedule the jobs' flows between nodes and publish network.decided (traffic classes the "
                        "agents pass to NCCL; docs/network.md); none (default) publishes nothing")
    p.add_argument("--network-classes", type=int, default=4, choices=range(1, 9), metavar="1-8",
                   help="traffic classes the fabric offers (default 4)")
    p.add_argument("--roll-seconds", type=float, default=2.0, help="event-log file roll interval")
    p.add_argument("--compact", action=argparse.BooleanOptionalAction, default=True,
                   help="merge the event log's small files in the background (default on; docs/eventlog.md)")
    p.add_argument("--sim-cluster", metavar="NxG",
                   help="also run simulated node agents: N nodes of G GPUs (e.g. 2x4); needs a fresh --data-dir. "
                        "With or without it, the run can be checked with `rubick replay DATA_DIR/events`")
    p.add_argument("--sim-speed", type=float, default=1.0,
                   help="simulated seconds per wall second of the simulated cluster (default 1)")
    p.add_argument("--sim-sample-every", type=float, default=600.0,
                   help="simulated seconds between a simulated job's metrics.iteration samples (default 600)")
    p.add_argument("--insecure", action="store_true",
                   help="embedded server without authentication (default: nkey credentials per component, "
                        "created in DATA_DIR/auth; docs/security.md)")
    p.add_argument("--creds", type=Path, help="with --nats-url: the bootstrap identity's nkey seed file "
                                              "(default $RUBICK_NATS_CREDS)")
    p.add_argument("--tls-cert", type=Path, help="embedded server: TLS certificate (with --tls-key)")
    p.add_argument("--tls-key", type=Path, help="embedded server: TLS private key")
    p.add_argument("--tls-ca", type=Path, help="CA that signed the server certificate (clients verify with it)")
    p.add_argument("--tls-verify-clients", action="store_true",
                   help="embedded server with TLS: clients must present a certificate signed by --tls-ca")
    p.add_argument("--log-level", default="warning", help="python logging level")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from .service import read_quotas
    try:
        quotas = read_quotas(args.quotas)
    except (OSError, ValueError) as exc:
        return fail(str(exc))
    if args.port is not None and not 0 <= args.port < 65536:
        return fail(f"--port must be between 0 and 65535, got {args.port}")
    from policy.registry import POLICIES
    if args.policy not in POLICIES:
        return fail(f"unknown policy {args.policy!r}: choose one of {', '.join(POLICIES)}")
    if args.sim_cluster:
        from replay.config import parse_cluster
        try:
            parse_cluster(args.sim_cluster)
        except ValueError as exc:
            return fail(f"--sim-cluster {exc}")
        if not 0 < args.sim_speed < float("inf") or not 0 < args.sim_sample_every < float("inf"):
            return fail("--sim-speed and --sim-sample-every must be positive")
        if args.restart_cost < 0:
            return fail("--restart-cost must be >= 0")
    elif args.sim_speed != 1.0 or args.sim_sample_every != 600.0:
        return fail("--sim-speed and --sim-sample-every need --sim-cluster")
    cfg = UpConfig(data_dir=args.data_dir, nats_url=args.nats_url, nats_port=args.port, policy=args.policy,
                   restart_cost_s=args.restart_cost, quotas=quotas, network=args.network,
                   network_classes=args.network_classes,
                   metrics_port=args.metrics_port, tick_period_s=args.tick_period, roll_seconds=args.roll_seconds,
                   compact=args.compact, sim_cluster=args.sim_cluster, sim_speed=args.sim_speed, sim_sample_every_s=args.sim_sample_every,
                   insecure=args.insecure, creds=args.creds, tls_cert=args.tls_cert, tls_key=args.tls_key,
                   tls_ca=args.tls_ca, tls_verify_clients=args.tls_verify_clients)
    if args.nats_url and (args.insecure or args.tls_cert or args.tls_key):
        return fail("--insecure, --tls-cert and --tls-key configure the embedded server: not with --nats-url")
    if args.tls_verify_clients and not (args.tls_cert and args.tls_ca):
        return fail("--tls-verify-clients needs --tls-cert, --tls-key and --tls-ca")
    try:
        return asyncio.run(_serve(cfg))
    except KeyboardInterrupt:
        return 0


async def _serve(cfg: UpConfig) -> int:
    plane = ControlPlane(cfg)
    try:
        await plane.start()
    except Exception as exc:
        await plane.stop()
        return fail(f"could not start: {exc}", 1)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, plane.stop_event.set)
    print(plane.summary(), flush=True)
    print("Ctrl-C stops it; everything stored is written to the event log first.", flush=True)
    code = 0
    try:
        await plane.wait()
    except Exception as exc:
        print(f"rubick: a service stopped: {exc!r}", flush=True)
        code = 1
    await plane.stop()
    rec = plane.recorder
    print(f"stopped: {rec.rows_written} events recorded in {rec.files_written} files under {cfg.event_log}",
          flush=True)
    if plane.run_recorded:
        note = "" if plane.settled else " (stopped before every core answered what was stored)"
        print(f"check it: rubick replay {cfg.event_log}{note}", flush=True)
    return code
