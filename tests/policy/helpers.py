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


CLOCK_FIELDS = ("remaining_iters", "elapsed_s", "changed_s", "recent_changes", "ref_iter_s")
"""The fields of `JobIn` that `PolicyCore._forward` brings forward, and that a resting input keeps as they were."""


class Unread:
    """Stands for a field no one may read: any comparison, arithmetic or conversion of it fails the test."""

    __slots__ = ()

    def _read(self, *_):
        raise AssertionError("a resting input's field that follows the clock was read before it was brought forward")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __hash__ = __bool__ = _read
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _read
    __float__ = __int__ = __index__ = __neg__ = __abs__ = __round__ = _read


UNREAD = Unread()


def resting_unread(monkeypatch, seen: dict) -> None:
    """After every round of every `PolicyCore`, the clock fields of the inputs left resting (`_resting`) are set to
    `UNREAD`: an engine that read one before asking for it (`bring_forward`) fails, as does one that left resting a
    record it woke, tried or wrote (it is no longer dormant, or awake), or a core that lets an input rest, or brings
    one forward, that is not the one it handed over, or lets one rest whose record is not dormant. `seen` counts the
    inputs left resting after each round (`rested`) and those the engines asked for (`brought`)."""
    from policy.service import PolicyCore

    real_rest, real_wake = PolicyCore._rest, PolicyCore._wake_resting

    def rest(self, t):
        engine = self.engine
        awake = {j.id for j in engine._awake}
        for job_id in self._resting:  # the round asked for every one it woke, tried, wrote or finished
            assert engine.is_dormant(job_id) and job_id not in awake, job_id
        real_rest(self, t)
        for job_id, (inp, js, _) in self._resting.items():  # what the round was handed, and dormant
            assert engine.is_dormant(job_id) and self._listed[job_id] is inp and self.state.jobs[job_id] is js
        for job_id, (inp, js) in self._moving.items():  # and those brought forward are those handed over
            assert self._listed.get(job_id) is inp and job_id not in self._resting, job_id
        seen["rested"] = seen.get("rested", 0) + len(self._resting)
        for inp, _, _ in self._resting.values():
            for name in CLOCK_FIELDS:
                setattr(inp, name, UNREAD)

    def wake(self, ids):
        seen["brought"] = seen.get("brought", 0) + sum(1 for job_id in ids if job_id in self._resting)
        real_wake(self, ids)

    monkeypatch.setattr(PolicyCore, "_rest", rest)
    monkeypatch.setattr(PolicyCore, "_wake_resting", wake)
