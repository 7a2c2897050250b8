"""`rubick models`: the model types a submission may name (docs/events.md, `job.submitted` `model.type`).

The types the cluster knows are the built-in specs (examples/models) and every new type a submission
brought with its full spec. With a running `rubick up` (or --nats-url) they are read from its stream;
with --log from a recorded log; otherwise the built-in ones are listed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from ..auth import Identity
from ..eventlog import events as log_events
from ..models import builtin_model_types
from ..endpoints import read_endpoints, resolve_nats_url
from ..state import fold
from .common import add_nats_args, credentials_for, fail


def register(sub) -> None:
    p = sub.add_parser("models", help="the model types a job may name (built-in, and new ones submitted with a spec)")
    p.add_argument("--log", type=Path, help="read a recorded event log instead of the running deployment")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    add_nats_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    builtin = set(builtin_model_types())
    source = "built-in specs (examples/models)"
    known = set(builtin)
    try:
        if args.log:
            known = fold(log_events(args.log).events, known_models=builtin).known_models
            source = f"the event log {args.log}"
        elif args.nats_url or os.environ.get("RUBICK_NATS_URL") or read_endpoints(args.data_dir):
            from .status import live_state
            url = resolve_nats_url(args.nats_url, args.data_dir)
            state = asyncio.run(asyncio.wait_for(live_state(url, credentials_for(args, Identity("submitter"))), 60))
            known = state.known_models | builtin
            source = "the running deployment"
    except Exception as exc:  # noqa: BLE001
        return fail(f"cannot read the model types: {exc}", 1)
    names = sorted(known)
    if args.json:
        print(json.dumps([{"type": n, "builtin": n in builtin} for n in names]))
        return 0
    print(f"{len(names)} model types, from {source}:")
    for n in names:
        print(f"  {n}{'' if n in builtin else '  (added by a submission with its spec)'}")
    print("a job naming another type must carry its full spec (model.spec; see examples/jobs/new-model-with-spec.yaml)")
    return 0
