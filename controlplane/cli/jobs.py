"""`rubick cancel|suspend|resume JOB` and `rubick priority JOB N`: an owner's requests about a job, over the
bus (docs/events.md).

Admission refuses what cannot apply (an unknown job, one already over, another tenant's, suspending a
suspended job, resuming one that is not suspended) with `job.rejected`; the command prints it and exits 1.
Otherwise the policy takes the job's resources at once (cancel, suspend) or schedules it again (resume),
and its agents checkpoint and stop its processes.
"""

from __future__ import annotations

import argparse

from ..auth import Identity
from ..client import Client
from .common import add_nats_args, credentials_for, run_request
from .submit import _which
from ..events.payloads import MAX_PRIORITY, MIN_PRIORITY

VERBS = {"cancel": "cancelled: its resources are freed and its processes stop",
         "suspend": "suspended: it checkpoints, stops and waits for `rubick resume`",
         "resume": "resumed: it is scheduled again from its checkpoint"}


def register(sub) -> None:
    for verb, said in VERBS.items():
        p = sub.add_parser(verb, help=f"{verb} a job (it is {said.split(':')[0]})")
        p.add_argument("job", help="job id")
        p.add_argument("--tenant", help="your tenant: the job must be its (admission checks it)")
        p.add_argument("--reason", default="", help="why, recorded with the request")
        p.add_argument("--wait", type=float, default=2.0, help="at most this many seconds to wait for the verdict")
        add_nats_args(p)
        p.set_defaults(func=run, verb=verb)
    p = sub.add_parser("priority", help=f"change a job's priority ({MIN_PRIORITY}..{MAX_PRIORITY}, default 0; higher "
                                        "runs first and may shrink lower ones)")
    p.add_argument("job", help="job id")
    p.add_argument("priority", type=int, help="the new priority")
    p.add_argument("--tenant", help="your tenant: the job must be its (admission checks it)")
    p.add_argument("--reason", default="", help="why, recorded with the request")
    p.add_argument("--wait", type=float, default=2.0, help="at most this many seconds to wait for the verdict")
    add_nats_args(p)
    p.set_defaults(func=run, verb="priority")


def run(args: argparse.Namespace) -> int:
    return run_request(args, _request, f"{args.verb} {args.job}")


async def _request(args: argparse.Namespace, url: str) -> int:
    async with await Client.connect(url, credentials=credentials_for(args, Identity("submitter"))) as client:
        if args.verb == "priority":
            result = await client.set_priority(args.job, args.priority, tenant=args.tenant, reason=args.reason,
                                               wait_s=args.wait, source="rubick-cli")
        else:
            ask = getattr(client, args.verb)
            result = await ask(args.job, tenant=args.tenant, reason=args.reason, wait_s=args.wait,
                               source="rubick-cli")
    if result.rejected is not None:
        print(f"job {args.job}: {args.verb} REJECTED: {result.rejected.reason}{_which(result.rejected)}")
        return 1
    said = f"priority set to {args.priority}" if args.verb == "priority" else VERBS[args.verb]
    print(f"job {args.job} {said} (event {result.event.id}, stream seq {result.seq})")
    return 0
