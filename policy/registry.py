"""Every policy, built the same way, running in the same core.

    core = make_policy("rubick", oracle=ModelOracle(env=env, params=...), models={...})
    core.handle(event) -> [plan.decided ...]

| name | resources | plans |
| --- | --- | --- |
| `rubick` | re-decided (Algorithm 1) | re-decided among all families |
| `rubick-e` | fixed to the request | re-decided for the placement |
| `rubick-r` | re-decided (Algorithm 1) | the requested plan's kind, DP scaled (3D keeps TP and PP) |
| `rubick-n` | fixed to the request | the requested plan |
| `sia`, `synergy`, `antman`, `equal` | see `policy.baselines` | |
"""

from __future__ import annotations

import math

from typing import Mapping

from controlplane.events import Plan
from modeler.spec import ModelType

from .baselines import AntManEngine, EqualEngine, SiaEngine, SynergyEngine
from .curves import JobKind, PlanBook
from .engine import RubickEngine
from .oracle import Oracle
from .plans import ALL_FAMILIES
from .service import PolicyCore

POLICIES = ("rubick", "rubick-e", "rubick-r", "rubick-n", "sia", "synergy", "antman", "equal")


def _all(model: ModelType, gbs: int, plan: Plan) -> JobKind:
    return JobKind(model, gbs, ALL_FAMILIES)


def _keep_kind(model: ModelType, gbs: int, plan: Plan) -> JobKind:
    return JobKind(model, gbs, ALL_FAMILIES, template=plan, scale_dp=True)


def _exact(model: ModelType, gbs: int, plan: Plan) -> JobKind:
    return JobKind(model, gbs, ALL_FAMILIES, template=plan, scale_dp=False)


def make_policy(name: str, *, oracle: Oracle, models: Mapping[str, ModelType], restart_cost_s: float = 78.0,
                quotas: Mapping[str, int] | None = None, node_gpus: int = 8, max_job_gpus: int = 64,
                max_cpus_per_gpu: int = 12, batch_s: float = 60.0, hold_s: float | None = None,
                hold_backoff_s: float = 0.0, default_support=None) -> PolicyCore:
    """The core of policy `name` (one of `POLICIES`); unknown names raise ValueError. `batch_s`: how
    long a best-effort submission may wait for the next round on a full cluster (`PolicyCore`);
    `hold_s`: how long a job just changed keeps its allocation against best-effort reasons
    (`RubickEngine.hold_s`; None = twice the restart cost), `hold_backoff_s` the window in which a job's
    changes lengthen its hold (`RubickEngine.hold_backoff_s`; 0 = none); `default_support`: the plan features of jobs
    without a workload (`PolicyCore.default_support`; None: any plan)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: choose one of {', '.join(POLICIES)}")
    if restart_cost_s < 0 or restart_cost_s != restart_cost_s:
        raise ValueError(f"restart cost must be a number of seconds >= 0, got {restart_cost_s!r}")
    if not batch_s >= 0:
        raise ValueError(f"batch window must be a number of seconds >= 0, got {batch_s!r}")
    if hold_s is not None and not hold_s >= 0:
        raise ValueError(f"hold must be a number of seconds >= 0, got {hold_s!r}")
    if not 0 <= hold_backoff_s < math.inf:
        raise ValueError(f"hold backoff window must be a number of seconds >= 0, got {hold_backoff_s!r}")
    book = PlanBook(oracle, node_gpus=node_gpus, max_gpus=max_job_gpus, max_cpus_per_gpu=max_cpus_per_gpu)
    q = None if quotas is None else {str(k): int(v) for k, v in quotas.items()}
    common = dict(book=book, restart_cost_s=restart_cost_s, quotas=q)
    if name.startswith("rubick"):
        common["hold_s"] = hold_s
        common["hold_backoff_s"] = hold_backoff_s
    if name == "rubick":
        engine, kind = RubickEngine(**common), _all
    elif name == "rubick-e":
        engine, kind = RubickEngine(**common, fixed_resources=True), _all
    elif name == "rubick-r":
        engine, kind = RubickEngine(**common), _keep_kind
    elif name == "rubick-n":
        engine, kind = RubickEngine(**common, fixed_resources=True), _exact
    elif name == "sia":
        engine, kind = SiaEngine(**common), SiaEngine.kind
    elif name == "synergy":
        engine, kind = SynergyEngine(**common), _exact
    elif name == "antman":
        engine, kind = AntManEngine(**common), _exact
    else:
        engine, kind = EqualEngine(**common), _all
    return PolicyCore(policy=name, engine=engine, kind_of=kind, models=dict(sorted(models.items())), oracle=oracle,
                      batch_s=float(batch_s), default_support=default_support)
