"""`rubick demo`: the whole event backbone on this machine in a few seconds.

Starts the embedded control plane in a fresh folder, registers a simulated
2-node cluster, submits the example jobs (and refused ones), stops cleanly,
shows the recorded event log and the cluster state folded from it, and replays
the log to check that every decision is reproduced byte for byte.
"""

from __future__ import annotations


import argparse
import asyncio
import shutil
import tempfile
from pathlib import Path

from ..auth import Identity
from ..client import Client, load_job
from ..eventlog import events as log_events
from ..eventlog import scan
from ..events import Invalid, NodeRegistered, make
from ..models import builtin_model_types
from ..runtime import ControlPlane, UpConfig
from ..state import fold
from .status import render

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the control plane end to end on this machine and show the result")
    p.add_argument("--data-dir", type=Path, help="keep the run here (default: a temporary folder)")
    p.add_argument("--jobs", type=Path, default=EXAMPLES, help="folder of job files to submit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="rubick-demo-")
        data_dir = Path(tmp)
    try:
        return asyncio.run(_demo(Path(data_dir), args.jobs))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


async def _demo(data_dir: Path, jobs_dir: Path) -> int:
    cfg = UpConfig(data_dir=data_dir, nats_port=0, metrics_port=0, tick_period_s=1.0, roll_seconds=0.5)
    plane = await ControlPlane(cfg).start()
    print(plane.summary())
    try:
        try:
            await asyncio.wait_for(plane.models_ready.wait(), 60)
        except asyncio.TimeoutError:
            print("modeler and policy not ready after 60 s; going on without them")
        # the demo's simulated nodes register with the bootstrap identity (real agents have their own)
        async with await Client.connect(plane.nats_url, credentials=plane.credentials_for(Identity("admin"))) as client:
            for i in range(2):
                node = NodeRegistered(node=f"node-{i}", gpus=8, gpu_mem_gb=80.0, cpus=96, mem_gb=1600.0,
                                      gpu_type="A800-80GB", nvlink_gbps=400.0, pcie_gbps=32.0, network_gbps=100.0)
                await client.publish(make("node.registered", node, time=0.0 + i, id=f"demo-node-{i}",
                                          source="demo-agent"))
            print("registered 2 simulated nodes (8 x A800-80GB each)")
            files = sorted(jobs_dir.glob("*.yaml")) + sorted((jobs_dir / "bad").glob("*.yaml"))
            for path in files + files[:1]:  # the first file twice: its job id is then reused
                try:
                    job = load_job(path)
                except Invalid as exc:
                    print(f"  {path.name}: refused before sending: {exc}")
                    continue
                result = await client.submit(job, wait_s=1.0, source="demo")
                verdict = f"REJECTED ({result.rejected.reason})" if result.rejected else "accepted"
                print(f"  {path.name}: job {job.job_id} -> seq {result.seq}, {verdict}")
            await client.bus.nc.publish("job.submitted", b"\x93not an envelope")
            print("  published malformed bytes on job.submitted (answered with job.rejected)")
            await asyncio.sleep(1.0)
    finally:
        await plane.stop()
    print(f"\nstopped cleanly: {plane.recorder.rows_written} events in {plane.recorder.files_written} "
          f"Parquet files under {cfg.event_log}")
    result = scan(cfg.event_log)
    counts = result.frame.group_by("subject").len().sort("subject")
    print("event log: " + ", ".join(f"{s} {n}" for s, n in counts.iter_rows()))
    decoded = log_events(cfg.event_log).events
    print("\nplan.decided by the policy:")
    for e in decoded:
        if e.base == "plan.decided":
            for d in e.payload.decisions:
                where = ", ".join(f"{s.node} {s.gpus} GPUs {s.cpus} CPUs" for s in d.allocation) or "nothing"
                plan = d.plan.code() if d.plan else "-"
                print(f"  round {e.payload.round}: {d.job_id}: {plan} on {where} "
                      f"({d.predicted_throughput:g} samples/s; {d.reason})")
    print("\n" + render(fold(decoded, known_models=builtin_model_types())))
    if not plane.run_recorded:
        return 0
    from replay.verify import format_result, verify

    checked = verify(cfg.event_log)
    print("\n" + format_result(checked, cfg.event_log))
    return 0 if checked.ok else 1
