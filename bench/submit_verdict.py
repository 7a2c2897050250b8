"""Sequential submissions to a running control plane: how long `Client.submit` takes to return a verdict.

Starts the control plane of `rubick up` (embedded nats-server, admission, modeler, policy, recorder) on a
temporary data folder and submits jobs one after the other, half of them refused by admission:

  after   `Client.submit` as it is: it returns once admission and the policy have answered
  before  what it did before: publish, then listen for a refusal for the whole window (`--wait`)

Prints, per way and run, the total for `--jobs` submissions and the median time of an accepted and of
a refused submission, then the medians over runs.

    python bench/submit_verdict.py [--jobs 50] [--runs 3] [--before-runs 1] [--wait 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.client import Client, submission  # noqa: E402
from controlplane.events import Invalid, JobSubmitted, ModelRef, Plan, Resources, decode, encode  # noqa: E402
from controlplane.runtime import ControlPlane, UpConfig  # noqa: E402


def job(i: int, run: str) -> JobSubmitted:
    return JobSubmitted(job_id=f"{run}-{i}", tenant="bench", guaranteed=False,
                        model=ModelRef(type="gpt2" if i % 2 else "no-such-model"), global_batch_size=16,
                        plan=Plan(dp=2), resources=Resources(gpus=2, cpus=8, mem_gb=32.0), target_iterations=100)


async def submit_whole_window(client: Client, j: JobSubmitted, wait_s: float):
    """The previous `Client.submit`: publish, then listen for a refusal until the window closes."""
    event = submission(j, source="bench")
    answer: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_rejected(msg) -> None:
        try:
            rej = decode(msg.data, msg.subject).payload
        except Invalid:
            return
        if rej.event_id == event.id and not answer.done():
            answer.set_result(rej)

    sub = await client.bus.nc.subscribe("job.rejected", cb=on_rejected)
    try:
        await client.bus.publish(event.subject, encode(event), event.id)
        try:
            return await asyncio.wait_for(answer, wait_s)
        except asyncio.TimeoutError:
            return None
    finally:
        await sub.unsubscribe()


async def one_run(client: Client, way: str, run: str, jobs: int, wait_s: float) -> tuple[float, float, float]:
    """(total seconds, median seconds of an accepted submission, of a refused one)."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(jobs):
        t0 = time.perf_counter()
        if way == "after":
            rejected = (await client.submit(job(i, run), wait_s=wait_s, source="bench")).rejected
        else:
            rejected = await submit_whole_window(client, job(i, run), wait_s)
        times[rejected is not None].append(time.perf_counter() - t0)
    med = [statistics.median(times[k]) if times[k] else float("nan") for k in (False, True)]
    return sum(times[False]) + sum(times[True]), med[0], med[1]


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="rubick-submit-") as tmp:
        plane = ControlPlane(UpConfig(data_dir=Path(tmp), nats_port=0, metrics_port=-1, tick_period_s=0))
        await plane.start()
        try:
            await asyncio.wait_for(plane.models_ready.wait(), 120)
            client = await Client.connect(plane.nats_url, data_dir=tmp)
            try:
                print(f"{args.jobs} sequential submissions (half refused by admission), window {args.wait:g} s")
                print(f"{'way':8s} {'run':>4s} {'total s':>9s} {'accepted ms':>12s} {'refused ms':>11s}  (medians)")
                for way, runs in (("after", args.runs), ("before", args.before_runs)):
                    rows = []
                    for r in range(runs):
                        rows.append(await one_run(client, way, f"{way}{r}", args.jobs, args.wait))
                        total, acc, ref = rows[-1]
                        print(f"{way:8s} {r + 1:>4d} {total:9.2f} {acc * 1000:12.1f} {ref * 1000:11.1f}", flush=True)
                    if runs:
                        total, acc, ref = (statistics.median(row[k] for row in rows) for k in range(3))
                        print(f"{way:8s} {'med':>4s} {total:9.2f} {acc * 1000:12.1f} {ref * 1000:11.1f}", flush=True)
            finally:
                await client.close()
        finally:
            await plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before-runs", type=int, default=1, help="runs of the previous behaviour (each takes "
                                                                    "about jobs x wait seconds)")
    parser.add_argument("--wait", type=float, default=2.0, help="the window, seconds (`rubick submit --wait`)")
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
