"""`rubick submit job.yaml`: validate a job file and publish `job.submitted`."""

from __future__ import annotations

import argparse
import asyncio
import json

from ..client import Client, load_job
from ..events import Invalid
from ..auth import AuthError, Identity
from .common import add_nats_args, credentials_for, fail, nats_url_for_client


def register(sub) -> None:
    p = sub.add_parser("submit", help="validate job files and publish job.submitted")
    p.add_argument("jobs", nargs="+", help="job files (YAML; see examples/jobs)")
    add_nats_args(p)
    p.add_argument("--wait", type=float, default=2.0,
                   help="at most this many seconds to wait for the verdict (a job.rejected answer, or admission "
                        "and the policy having accepted it; 0 = do not wait)")
    p.add_argument("--json", action="store_true", help="print one JSON line per job")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    jobs = []
    for path in args.jobs:
        try:
            jobs.append((path, load_job(path)))
        except Invalid as exc:
            return fail(f"{path}: invalid job: {exc}")
    url = nats_url_for_client(args)
    if url is None:
        return 2
    try:
        return asyncio.run(_submit(url, jobs, args.wait, args.json, credentials_for(args, Identity("submitter"))))
    except (ConnectionError, AuthError) as exc:
        return fail(str(exc), 1)


async def _submit(url: str, jobs, wait: float, as_json: bool, credentials=None) -> int:
    code = 0
    async with await Client.connect(url, credentials=credentials) as client:
        for path, job in jobs:
            result = await client.submit(job, wait_s=wait, source="rubick-submit")
            rej = result.rejected
            if as_json:
                print(json.dumps({"file": str(path), "job_id": job.job_id, "event_id": result.event.id,
                                  "seq": result.seq, "rejected": rej.reason if rej else None,
                                  "field": rej.field if rej else None}))
            elif rej:
                print(f"{path}: job {job.job_id} REJECTED: {rej.reason}{_which(rej)}")
            else:
                note = " (duplicate publish, stored once)" if result.duplicate else ""
                print(f"{path}: job {job.job_id} submitted as event {result.event.id}, stream seq {result.seq}{note}")
            if rej:
                code = 1
    return code


def _which(rej) -> str:
    """The field a rejection names, with what was expected and what came where it says so."""
    if not rej.field:
        return ""
    said = ", ".join(f"{k} {v}" for k, v in (("expected", rej.expected), ("got", rej.got)) if v)
    return f" (field {rej.field}{': ' + said if said else ''})"
