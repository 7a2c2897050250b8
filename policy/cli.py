"""`rubick explain JOB`: why the policy gave a job its allocation and plan.

The policy core is rebuilt from the cluster's events (the running `rubick up`'s stream, found as `rubick
status` finds it, or a recorded event log with --log): every input is fed to a fresh core, which
reproduces the live decisions, then the core is asked about the job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from controlplane.bus.nats import redact_url
from controlplane.cli.common import add_nats_args, credentials_for, fail
from controlplane.endpoints import read_endpoints, resolve_nats_url

from .registry import POLICIES


def register(sub) -> None:
    p = sub.add_parser("explain", help="why a job got its allocation and plan (curves, min_res, plans considered)")
    p.add_argument("job", help="job id")
    p.add_argument("--log", type=Path, help="event-log folder (default: the running `rubick up`'s stream, as "
                                            "`rubick status` reads it, else <data-dir>/events)")
    add_nats_args(p)
    p.add_argument("--policy", choices=POLICIES, help="policy to explain with (default: the one that decided)")
    p.add_argument("--restart-cost", type=float, default=78.0, help="seconds per reconfiguration (default 78)")
    p.add_argument("--json", action="store_true", help="print plain data instead of text")
    p.set_defaults(func=run)


def core_from_log(events, policy: str | None, restart_cost_s: float):
    from modeler.service import make_core

    from .oracle import from_modeler
    from .registry import make_policy

    if policy is None:
        decided = [e for e in events if e.base == "plan.decided"]
        policy = decided[-1].payload.policy if decided else "rubick"
        if policy not in POLICIES:
            policy = "rubick"
    oracle, models = from_modeler(make_core())
    core = make_policy(policy, oracle=oracle, models=models, restart_cost_s=restart_cost_s)
    for e in events:
        core.handle(e)
    return core


def run(args: argparse.Namespace) -> int:
    from controlplane.eventlog import events as read_events

    from .explain import explain_job, render

    events = None
    if args.log is None and (args.nats_url or os.environ.get("RUBICK_NATS_URL") or read_endpoints(args.data_dir)):
        # the running deployment, as `rubick status` finds it: its stream holds everything, even what the
        # recorder has not written yet
        from controlplane.auth import Identity
        from controlplane.cli.status import live_events
        url = resolve_nats_url(args.nats_url, args.data_dir)
        try:
            events = asyncio.run(asyncio.wait_for(live_events(url, credentials_for(args, Identity("submitter"))), 60))
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the recorded log, said
            print(f"rubick: cannot read the live stream at {redact_url(url)} ({exc}); reading the event log",
                  file=sys.stderr)
    if events is None:
        log_dir = args.log or Path(args.data_dir) / "events"
        if not Path(log_dir).is_dir():
            return fail(f"no running `rubick up` found and no event log at {log_dir} (give --log DIR or --nats-url)")
        log = read_events(log_dir)
        for path, why in log.problems:
            print(f"warning: skipped {path}: {why}", file=sys.stderr)
        events = log.events
    core = core_from_log(events, args.policy, args.restart_cost)
    try:
        info = explain_job(core, args.job, core.state.time)
    except KeyError as exc:
        return fail(str(exc.args[0]), 1)
    print(json.dumps(info, indent=2, sort_keys=True) if args.json else render(info))
    return 0
