"""`rubick quota set TENANT GPUS|SHARE%` and `rubick quota show`: tenants' quotas, live (docs/policy.md).

A quota is the GPUs a tenant's guaranteed jobs may hold (each is charged its minimum demand), as a number
of GPUs or as a share of the live nodes' GPUs (`25%`, which follows the cluster's size). `set`
publishes `quota.set` with the bootstrap identity (an operator's right): admission refuses an unknown
tenant (a likely typo; `--new` for a tenant with no job yet) or more GPUs than the cluster has, with
`quota.rejected`; the policy applies the rest at once, and the change is in the event log, so replay
reproduces it. `show` folds the running deployment's stream: each tenant's quota and the GPUs its
guaranteed jobs hold now.
"""

from __future__ import annotations

import argparse
import asyncio

from ..auth import Identity
from ..client import Client
from .common import add_nats_args, credentials_for, fail, nats_url_for_client, run_request
from .status import live_state
from .submit import _which


def register(sub) -> None:
    p = sub.add_parser("quota", help="tenants' quotas of guaranteed GPUs: set one, or show them with their use")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    s = verbs.add_parser("set", help="set a tenant's quota (applied at once, recorded)")
    s.add_argument("tenant")
    s.add_argument("gpus", metavar="GPUS|SHARE%", help="GPUs the tenant's guaranteed jobs may hold (0: none), or "
                   "their share of the cluster's GPUs, as a percentage: 25%%")
    s.add_argument("--new", action="store_true", help="the tenant has no job and no quota yet")
    s.add_argument("--reason", default="", help="why, recorded with the change")
    s.add_argument("--wait", type=float, default=2.0, help="at most this many seconds to wait for the verdict")
    add_nats_args(s)
    s.set_defaults(func=run_set)
    w = verbs.add_parser("show", help="every tenant's quota and the GPUs its guaranteed jobs hold")
    add_nats_args(w)
    w.set_defaults(func=run_show)


def parse_quota(text: str) -> tuple[int | None, float | None]:
    """(GPUs, share) from `32` or `25%`; ValueError naming what is wrong."""
    text = text.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise ValueError(f"a share is a percentage such as 25%, not {text!r}") from None
        if not 0 <= pct <= 100:
            raise ValueError(f"a share is between 0% and 100%, not {text}")
        return None, pct / 100.0
    try:
        gpus = int(text)
    except ValueError:
        raise ValueError(f"a quota is a number of GPUs or a percentage (25%), not {text!r}") from None
    if gpus < 0:
        raise ValueError(f"a quota is a number of GPUs >= 0, not {gpus}")
    return gpus, None


def run_set(args: argparse.Namespace) -> int:
    try:
        args.quota_gpus, args.quota_share = parse_quota(args.gpus)
    except ValueError as exc:
        return fail(str(exc))
    return run_request(args, _set, f"quota {args.tenant}")


async def _set(args: argparse.Namespace, url: str) -> int:
    async with await Client.connect(url, credentials=credentials_for(args, Identity("admin"))) as client:
        result = await client.set_quota(args.tenant, args.quota_gpus, share=args.quota_share, new_tenant=args.new,
                                        reason=args.reason, wait_s=args.wait, source="rubick-cli")
    if result.rejected is not None:
        print(f"quota of {args.tenant}: REJECTED: {result.rejected.reason}{_which(result.rejected)}")
        return 1
    said = f"{args.quota_gpus} GPUs" if args.quota_share is None else f"{args.quota_share:.4g} of the cluster's GPUs"
    print(f"quota of {args.tenant}: {said} (event {result.event.id}, stream seq {result.seq}); "
          "the policy applies it at its next round, which this change starts")
    return 0


def run_show(args: argparse.Namespace) -> int:
    url = nats_url_for_client(args)
    if url is None:
        return 2
    try:
        state = asyncio.run(asyncio.wait_for(live_state(url, credentials_for(args, Identity("submitter"))), 60))
    except Exception as exc:  # noqa: BLE001
        return fail(f"cannot read the live stream: {exc}", 1)
    print(render(state))
    return 0


def render(state) -> str:
    quotas = state.quotas()
    held: dict[str, int] = {}
    for job in state.jobs.values():
        if job.guaranteed and job.status not in ("completed", "failed", "cancelled"):
            held[job.tenant] = held.get(job.tenant, 0) + sum(s.gpus for s in job.decided_allocation)
    if quotas is None:
        lines = ["no quotas: every tenant's guaranteed jobs may use the whole cluster"]
        tenants = sorted(held)
    else:
        lines = [f"{'tenant':<20} {'quota':>6} {'held':>6}"]
        tenants = sorted(set(quotas) | set(held))
    for t in tenants:
        q = "-" if quotas is None else ("none" if t not in quotas else str(quotas[t]))
        share = state.quota_shares.get(t)
        lines.append(f"{t:<20} {q:>6} {held.get(t, 0):>6}" + (f"  ({share:.4g} of the cluster)" if share is not None else ""))
    if quotas is not None:
        lines.append("held: GPUs decided for the tenant's guaranteed jobs now; a tenant with no quota runs its "
                     "guaranteed jobs as best-effort")
    return "\n".join(lines)
