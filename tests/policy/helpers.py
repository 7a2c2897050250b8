"""Building blocks for policy tests: nodes, jobs and cores over the measured table."""

from __future__ import annotations

from pathlib import Path

from controlplane.events import (JobCompleted, JobSubmitted, ModelRef, NodeLost, NodeRegistered, Plan, Resources,
                                 make)
from modeler.env import DEFAULT_ENV_FILE, load_env
from modeler.spec import MODELS_DIR, load_model
from modeler.table import MeasuredTable
from policy.oracle import TableOracle
from policy.registry import make_policy

HERE = Path(__file__).resolve().parent
ENV = load_env(DEFAULT_ENV_FILE)
TABLE = MeasuredTable.from_csv()


def models(*names: str):
    out = {}
    for name in names:
        path = HERE / "models" / f"{name}.yaml"
        out[name] = load_model(path if path.is_file() else MODELS_DIR / f"{name}.yaml")
    return out


ALGORITHM_ONLY = {"hold_s": 0.0, "batch_s": 0.0}
"""Tests of Algorithm 1's choices run a round on every event and hold no job (test_hold.py tests those)."""


def table_core(policy: str, names, **kw):
    return make_policy(policy, oracle=TableOracle(env=ENV, table=TABLE), models=models(*names),
                       **{**ALGORITHM_ONLY, **kw})


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.n = 0

    def ev(self, subject, payload, dt: float = 1.0):
        self.t += dt
        self.n += 1
        return make(subject, payload, time=self.t, id=f"t-{self.n}", source="test")


def node(name: str, gpus: int = 8, cpus: int = 96, mem_gb: float = 1600.0) -> NodeRegistered:
    return NodeRegistered(node=name, gpus=gpus, gpu_mem_gb=80.0, cpus=cpus, mem_gb=mem_gb)


def job(job_id: str, model: str, gbs: int, plan: Plan, gpus: int, cpus: int = 0, *, guaranteed: bool = False,
        tenant: str = "team-a", iters: int = 1000) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, tenant=tenant, guaranteed=guaranteed, model=ModelRef(type=model),
                        global_batch_size=gbs, plan=plan, resources=Resources(gpus=gpus, cpus=cpus),
                        target_iterations=iters)


def decisions(events) -> dict:
    """job id -> last decision, over the plan.decided events given."""
    out = {}
    for e in events:
        if e.base == "plan.decided":
            for d in e.payload.decisions:
                out[d.job_id] = d
    return out


def completed(job_id: str, iters: int = 1000) -> JobCompleted:
    return JobCompleted(job_id=job_id, iterations=iters)


def lost(name: str) -> NodeLost:
    return NodeLost(node=name, reason="test")


async def decided(plane, count: int, timeout: float = 30.0) -> list:
    """The stored `plan.decided` deliveries of a running control plane, once there are `count` (or
    when `timeout` seconds have passed)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = [d async for d in plane.bus.read(("plan.decided",))]
        if len(got) >= count or loop.time() > deadline:
            return got
        await asyncio.sleep(0.1)
