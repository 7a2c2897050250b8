"""`rubick demo`: a cluster day on this machine in about 15 seconds.

Starts the embedded control plane in a new folder it keeps (`runs/demo-<date>-<time>`), with a
simulated cluster of 2 x 8 GPUs whose node agents run over the real bus on a clock 150 times faster
than the wall's; submits the example jobs (and refused ones), cancels one once it runs, waits until
every job has ended, stops cleanly, shows the recorded event log, the policy's decisions (a job shrunk
for a guaranteed one, a cancelled one's GPUs given out), the cluster state folded from the log and a
short report (JCT, reconfigurations, GPU utilisation), and replays the log to check that every
decision is reproduced byte for byte.
"""

from __future__ import annotations


import argparse
import asyncio
import sys
import time
from pathlib import Path

from ..auth import Identity
from ..client import Client, load_job
from ..eventlog import events as log_events
from ..eventlog import scan
from ..client import submission
from ..events import Invalid, make
from ..events.payloads import JobControl
from ..models import builtin_model_types
from ..runtime import ControlPlane, UpConfig
from ..state import fold
from .status import live_state, render

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the control plane end to end on this machine and show the result")
    p.add_argument("--data-dir", type=Path,
                   help="keep the run here (default: a new folder runs/demo-<date>-<time> under the current one)")
    p.add_argument("--jobs", type=Path, default=EXAMPLES, help="folder of job files to submit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    if Path(data_dir, "events").exists() and any(Path(data_dir, "events").iterdir()):
        print(f"rubick demo: {data_dir} already holds a run; give another --data-dir", file=sys.stderr)
        return 2
    code = asyncio.run(_demo(Path(data_dir), args.jobs))
    print(f"\nthe run is kept in {data_dir}: `rubick log show {data_dir}`, `rubick status --log {data_dir}/events`, "
          f"`rubick replay {data_dir}/events`")
    return code


SPEED = 150.0
"""The simulated cluster's clock runs this many times faster than the wall: a cluster day's jobs in seconds."""
WALL_BUDGET_S = 90.0
"""The demo stops after this long even if some job has not ended (it says which)."""
CANCELLED = "llama7-demo-1"
"""The job the demo cancels once it runs, to show `rubick cancel`."""


async def _demo(data_dir: Path, jobs_dir: Path) -> int:
    cfg = UpConfig(data_dir=data_dir, nats_port=0, metrics_port=0, tick_period_s=60.0, roll_seconds=0.5,
                   sim_cluster="2x8", sim_speed=SPEED, sim_sample_every_s=300.0)
    plane = await ControlPlane(cfg).start()
    print(plane.summary())
    t0 = time.monotonic()
    try:
        try:
            await asyncio.wait_for(plane.models_ready.wait(), 60)
        except asyncio.TimeoutError:
            print("modeler and policy not ready after 60 s; going on without them")
        print(f"a simulated cluster of 2 nodes x 8 GPUs runs the jobs, its clock {SPEED:g}x the wall's")
        async with await Client.connect(plane.nats_url, credentials=plane.credentials_for(Identity("admin"))) as client:
            files = sorted(jobs_dir.glob("*.yaml")) + sorted((jobs_dir / "bad").glob("*.yaml"))
            accepted = []
            for path in files + files[:1]:  # the first file twice: its job id is then reused
                try:
                    job = load_job(path)
                except Invalid as exc:
                    print(f"  {path.name}: refused before sending: {exc}")
                    continue
                event = submission(job, source="demo", time=plane.sim_clock.now())
                result = await client.publish_judged(event, wait_s=1.0)
                verdict = f"REJECTED ({result.rejected.reason})" if result.rejected else "accepted"
                if not result.rejected:
                    accepted.append(job.job_id)
                print(f"  {path.name}: job {job.job_id} -> seq {result.seq}, {verdict}")
            await client.bus.nc.publish("job.submitted", b"\x93not an envelope")
            print("  published malformed bytes on job.submitted (answered with job.rejected)")
            await _cancel_when_running(client, plane, CANCELLED if CANCELLED in accepted else None)
            ended = await _until_ended(plane, accepted, t0 + WALL_BUDGET_S)
            left = sorted(set(accepted) - ended)
            print(f"all jobs ended after {time.monotonic() - t0:.1f} s" if not left else
                  f"stopping after {WALL_BUDGET_S:g} s with {', '.join(left)} still to end")
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
    state = fold(decoded, known_models=builtin_model_types())
    print("\n" + render(state))
    print("\n" + report(state, decoded))
    if not plane.run_recorded:
        return 0
    from replay.verify import format_result, verify

    checked = verify(cfg.event_log)
    print("\n" + format_result(checked, cfg.event_log))
    return 0 if checked.ok else 1


async def _cancel_when_running(client: Client, plane: ControlPlane, job_id: str | None, timeout: float = 15.0) -> None:
    """Cancel `job_id` once it runs (as its owner would with `rubick cancel`)."""
    if job_id is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = (await live_state(plane.nats_url, plane.credentials_for(Identity("admin")))).jobs.get(job_id)
        if job is not None and job.status == "running":
            break
        await asyncio.sleep(0.5)
    event = make("job.cancel", JobControl(job_id=job_id, tenant=None, reason="demo: its owner changed their mind"),
                 time=plane.sim_clock.now(), id=f"demo-cancel-{job_id}", source="demo")
    result = await client.publish_judged(event, wait_s=1.0)
    print(f"  cancelled {job_id}" + (f": REJECTED ({result.rejected.reason})" if result.rejected else
                                     " (its GPUs are given out in the same round; its processes stop)"))


async def _until_ended(plane: ControlPlane, jobs: list[str], deadline: float) -> set[str]:
    """The jobs of `jobs` that ended (completed, failed, cancelled), once all have or at the deadline."""
    ended: set[str] = set()
    while time.monotonic() < deadline:
        state = await live_state(plane.nats_url, plane.credentials_for(Identity("admin")))
        ended = {j for j in jobs if j in state.jobs and state.jobs[j].status in ("completed", "failed", "cancelled")}
        if ended >= set(jobs):
            break
        await asyncio.sleep(1.0)
    return ended


def report(state, events) -> str:
    """Job completion times, reconfigurations and GPU utilisation of the run (simulated time)."""
    lines = ["run report (simulated time):"]
    done = [j for j in state.jobs.values() if j.finished_at is not None]
    for j in sorted(done, key=lambda j: j.job_id):
        lines.append(f"  {j.job_id:<20} {j.status:<10} JCT {_h(j.finished_at - j.submitted_at)}  "
                     f"reconfigured {j.reconfigurations}x (restart cost {j.restart_cost_s:.0f} s)")
    completed = [j for j in done if j.status == "completed"]
    if completed:
        mean = sum(j.finished_at - j.submitted_at for j in completed) / len(completed)
        lines.append(f"  average JCT of the {len(completed)} completed jobs: {_h(mean)}")
    times = [e.time for e in events]
    gpus = sum(n.gpus for n in state.nodes.values())
    if times and gpus:
        busy = _gpu_seconds(events)
        lines.append(f"  GPU utilisation: {100 * busy / (gpus * max(1e-9, max(times) - min(times))):.0f}% of "
                     f"{gpus} GPUs over {_h(max(times) - min(times))}")
    return "\n".join(lines)


def _gpu_seconds(events) -> float:
    """GPU-seconds held by running jobs, from their lifecycle events."""
    held: dict[str, tuple[int, float]] = {}
    total = 0.0
    for e in events:
        x = e.payload
        if e.base in ("job.started", "job.reconfigured"):
            if x.job_id in held:
                g, t = held[x.job_id]
                total += g * (e.time - t)
            held[x.job_id] = (sum(s.gpus for s in x.allocation), e.time)
        elif e.base in ("job.completed", "job.failed", "job.preempted") and x.job_id in held:
            g, t = held.pop(x.job_id)
            total += g * (e.time - t)
    return total


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
