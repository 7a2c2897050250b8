"""Time of a Prometheus scrape of a service's /metrics, with the scheduler's metrics of a busy cluster.

A policy core is built as `bench/policy_round.py` builds it (N nodes x 8 GPUs, J jobs drawn from the
Base trace, one in three guaranteed), its jobs spread over T tenants with quotas; its first round
runs under the scheduler metrics (`controlplane.scheduler_metrics`, as the service shell runs it),
the agents' answers follow, then one measured iteration per running job, a reconfiguration of one
job in ten and a refit of every model type. The other services' metrics are filled too (messages
in/out per service and subject, handler times), so the exposition holds what a deployment's would.
Then `/metrics` is served (`controlplane.metrics.serve`, 127.0.0.1) and fetched over HTTP, R times:
the median and p90 of a whole GET are printed (and of rendering the exposition alone), with the
exposition's size and series, and the
median time of one recomputation of the scheduler's gauges (`SchedulerMetrics.refresh`, what the
shell does after an event).

    .venv/bin/python bench/metrics_scrape.py                      # 128 nodes, 1000 jobs, 32 tenants
    .venv/bin/python bench/metrics_scrape.py --nodes 16 --jobs 100 --tenants 4 --runs 50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane import metrics  # noqa: E402
from controlplane.events import ClockTick, JobReconfigured, MetricsIteration, ModelUpdated, make  # noqa: E402
from controlplane.events.catalog import SUBJECTS  # noqa: E402
from controlplane.scheduler_metrics import SchedulerMetrics  # noqa: E402
from modeler.service import make_core  # noqa: E402
from policy_round import agents, build  # noqa: E402  (bench/, the script's folder, is on the path)

SERVICES = ("recorder", "admission", "clock", "modeler", "policy")


def cluster(nodes: int, jobs: int, tenants: int, seed: int):
    modeler = make_core()
    core, _, _ = build("rubick", nodes, jobs, seed, modeler)
    core.engine.quotas = {f"tenant-{i:02d}": max(1, nodes * 8 // (2 * tenants)) for i in range(tenants)}
    for i, job in enumerate(core.state.jobs.values()):
        job.tenant = f"tenant-{i % tenants:02d}"
    observer = SchedulerMetrics(core)
    tick = make("clock.tick", ClockTick(seq=0, period_s=60.0), time=1.0, id="b-tick-0", source="bench")
    t0 = time.perf_counter()
    observer.before(tick)
    decided = core.run_round(tick)
    observer.after(tick, decided)
    first = time.perf_counter() - t0
    agents(core, decided, 1.0)
    n = 0
    for job in core.state.jobs_in("running"):
        if not job.decided_allocation or job.decided_plan is None or job.predicted_throughput <= 0:
            continue
        n += 1
        it = MetricsIteration(job_id=job.job_id, model_type=job.model_type, iteration=0,
                              iter_time_s=job.global_batch_size / job.predicted_throughput * (1.0 + (n % 7) / 20),
                              plan=job.decided_plan, gpus_per_node=tuple(s.gpus for s in job.decided_allocation),
                              node=job.decided_allocation[0].node, cpus_per_gpu=4)
        ev = make(f"metrics.iteration.{it.node}", it, time=2.0, id=f"b-it-{job.job_id}", source="bench")
        observer.before(ev)
        observer.after(ev, core.handle(ev))
        if n % 10 == 0:
            rc = JobReconfigured(job_id=job.job_id, allocation=job.decided_allocation, plan=job.decided_plan,
                                 restart_cost_s=60.0 + n % 40)
            ev = make(f"job.reconfigured.{it.node}", rc, time=3.0, id=f"b-rc-{job.job_id}", source="bench")
            observer.before(ev)
            observer.after(ev, core.handle(ev))
    for kind, st in sorted(modeler.types.items()):
        if st.params is None:
            continue
        upd = ModelUpdated(model_type=kind, version=2, params=st.params.as_dict(), n_points=12, rmsle=0.03)
        ev = make("model.updated", upd, time=4.0, id=f"b-upd-{kind}", source="bench")
        observer.before(ev)
        observer.after(ev, core.handle(ev))
    for service in SERVICES:
        metrics.HANDLER_SECONDS.labels(service).observe(1e-4)
        metrics.CONSUMER_LAG.labels(service).set(0)
        for subject in sorted(SUBJECTS):
            metrics.MESSAGES_IN.labels(service, subject).inc()
            metrics.MESSAGES_OUT.labels(service, subject).inc()
            metrics.MESSAGES_REJECTED.labels(service, subject).inc(0)
    return core, observer, first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--tenants", type=int, default=32)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    core, observer, first = cluster(args.nodes, args.jobs, args.tenants, args.seed)
    refresh = []
    for _ in range(max(5, args.runs // 5)):
        t0 = time.perf_counter()
        observer.refresh()
        refresh.append(time.perf_counter() - t0)
    port = metrics.serve(0)
    url = f"http://127.0.0.1:{port}/metrics"
    body = urllib.request.urlopen(url, timeout=10).read()  # warm-up
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read()
        times.append(time.perf_counter() - t0)
    times.sort()
    render = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        generate_latest(metrics.REGISTRY)
        render.append(time.perf_counter() - t0)
    text = body.decode()
    series = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    scheduler = [ln for ln in series
                 if not ln.startswith(("rubick_messages", "rubick_handler", "rubick_consumer", "rubick_recorder"))]
    open_jobs = core.state.jobs_in("queued", "running", "preempted")
    running = sum(j.status == "running" for j in open_jobs)
    print(f"cluster: {args.nodes * 8} GPUs, {len(open_jobs)} open jobs ({running} running), {args.tenants} tenants; "
          f"first round {first:.2f} s")
    print(f"exposition: {len(body) / 1024:.1f} KiB, {len(series)} series ({len(scheduler)} of the scheduler)")
    print(f"GET /metrics over {args.runs} runs: median {statistics.median(times) * 1e3:.2f} ms, "
          f"p90 {times[int(0.9 * (len(times) - 1))] * 1e3:.2f} ms; of which rendering the exposition "
          f"(generate_latest) median {statistics.median(render) * 1e3:.2f} ms")
    print(f"scheduler gauges recomputed (SchedulerMetrics.refresh): median {statistics.median(refresh) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
