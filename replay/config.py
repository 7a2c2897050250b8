"""A run's configuration, and building the cores it names (the same way for simulate and replay).

The configuration is recorded with the event log (`run.json` beside the Parquet files) together
with the performance-model parameters the cores started from, so `rubick replay` rebuilds exactly
the cores that made the run, without fitting again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from controlplane.admission import AdmissionCore
from controlplane.events import Event, NodeRegistered, make
from controlplane.events.payloads import DEFAULT_REFIT_BACKOFF, NETWORK_SETTINGS
from modeler.env import DEFAULT_ENV_FILE, Environment, load_env
from modeler.perf_model import PerfParams
from modeler.predictor import ModelPredictor
from modeler.service import ModelerCore
from modeler.spec import MODELS_DIR, ModelType, load_model
from modeler.table import DEFAULT_TABLE, MeasuredTable

ROOT = Path(__file__).resolve().parent.parent
FIT_POINTS = ROOT / "data" / "rubick-artifact" / "fit_points.csv"
RUN_FILE = "run.json"
CLUSTER_RE = re.compile(r"^(\d+)x(\d+)$")
NODE_CPUS, NODE_MEM_GB, GPU_MEM_GB = 96, 1600.0, 80.0
"""The testbed's nodes (8 x A800 80 GB, 96 vCPUs, 1,600 GB)."""
DEFAULT_NODE_GPUS = 8
"""GPUs per node the policy's plan book assumes where the configuration names no cluster."""


@dataclass(frozen=True)
class RunConfig:
    policy: str
    cluster: str = "8x8"
    """"NxG"; "" for a deployment whose nodes register themselves (`rubick up` without
    `--sim-cluster`): its plan book assumes nodes of `DEFAULT_NODE_GPUS`."""
    restart_cost_s: float = 78.0
    start_cost_s: float = 0.0
    seed: int = 0
    oracle: str = "model"
    tick_period_s: float = 60.0
    sample_every_s: float = 600.0
    noise: float = 0.0
    max_time_s: float = 30 * 86400.0
    trace: str = ""
    trace_sha256: str = ""
    trace_layout: str = "artifact"
    scale: int = 1
    on_bad: str = "refuse"
    quotas: dict[str, int] | None = None
    batch_s: float = 60.0
    """see `policy.service.PolicyCore`: a best-effort submission on a full cluster waits up to this
    long for the next round"""
    hold_s: float | None = None
    """see `policy.engine.RubickEngine.hold_s`; None = twice the restart cost"""
    hold_backoff_s: float = 3600.0
    """see `policy.engine.RubickEngine.hold_backoff_s`: a job changed n times within this window is held
    2^(n-1) times as long; 0 = the same hold for every job"""
    refit_min_gain: float = 0.10
    """see `modeler.service.ModelerCore`: a refit is published only when it lowers the error on the
    kept points by this fraction"""
    network: str = "none"
    """how the network between nodes is simulated and scheduled (docs/network.md): `none` (jobs never slow
    each other down: the measured times hold), `fair`, `coflow` or `echelonflow`"""
    network_classes: int = 4
    """traffic classes the fabric offers (`network.decided`)"""
    rack_size: int = 0
    """nodes per rack behind the core (0: one non-blocking tier)"""
    oversubscription: float = 1.0
    """rack uplink capacity = the rack's NIC capacity / this"""
    refit_folds: int = 5
    """see `modeler.service.ModelerCore`: folds of the out-of-fold error a refit publishes as its bound"""
    refit_backoff: int = DEFAULT_REFIT_BACKOFF
    """see `modeler.service.ModelerCore.refit_backoff`: a model type whose last k refits in a row published
    nothing waits for 5 * 2^min(k, this) measurements before its next refit; 0 = 5 every time"""
    anchors: str = field(default_factory=lambda: fit_points_digest())
    """digest of the agreed fitting points (`FIT_POINTS`) every online refit keeps beside the measured
    points; "" = refits on the measured points only"""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.network == "none":  # runs without a network are described exactly as before it existed
            for k in NETWORK_KEYS:
                out.pop(k)
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "RunConfig":
        known = RunConfig.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in known}
        values.setdefault("batch_s", 0.0)  # runs recorded before batching existed ran a round on every event
        values.setdefault("hold_s", 0.0)  # ... and held no job
        values.setdefault("hold_backoff_s", 0.0)  # ... and held every job alike
        values.setdefault("refit_min_gain", 0.0)  # ... and published every refit
        values.setdefault("refit_folds", 0)  # ... without an error bound
        values.setdefault("refit_backoff", 0)  # ... and refitted as often after an unpaid refit as after any
        values.setdefault("anchors", "")  # ... on the measured points alone
        return RunConfig(**values)


def parse_cluster(text: str) -> tuple[int, int]:
    m = CLUSTER_RE.match(text.strip())
    if not m or int(m[1]) < 1 or not 1 <= int(m[2]) <= 1024:
        raise ValueError(f"cluster {text!r}: expected NODESxGPUS, e.g. 8x8")
    return int(m[1]), int(m[2])


def node_gpus(cfg: RunConfig) -> int:
    """GPUs per node of the configuration's cluster (`DEFAULT_NODE_GPUS` where it names none)."""
    return parse_cluster(cfg.cluster)[1] if cfg.cluster else DEFAULT_NODE_GPUS


def node_events(cluster: str) -> list[Event]:
    """`node.registered` for every node of an `NxG` cluster at time 0, named n000, n001, ..."""
    nodes, gpus = parse_cluster(cluster)
    width = max(3, len(str(nodes - 1)))
    return [make("node.registered", NodeRegistered(node=f"n{i:0{width}d}", gpus=gpus, gpu_mem_gb=GPU_MEM_GB,
                                                   cpus=NODE_CPUS, mem_gb=NODE_MEM_GB, gpu_type="A800-80GB",
                                                   nvlink_gbps=400.0, network_gbps=100.0),
                 time=0.0, id=f"node-{i:0{width}d}", source="simulator") for i in range(nodes)]


def load_models(models_dir: Path = MODELS_DIR) -> dict[str, ModelType]:
    models = [load_model(p) for p in sorted(Path(models_dir).glob("*.yaml"))]
    return {m.name: m for m in models}


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


_FITTED: dict[str, dict[str, dict[str, float]]] = {}
BOUND_KEY = "error_bound"
"""Where a type's starting parameters carry their error bounds (`modeler.uncertainty.Uncertainty.margins`):
`error_bound` the type's, `error_bound.<plan family>` each family's."""


def bound_key(family: str) -> str:
    from modeler.uncertainty import ALL

    return BOUND_KEY if family == ALL else f"{BOUND_KEY}.{family}"


def _is_bound(name: str) -> bool:
    return name == BOUND_KEY or name.startswith(BOUND_KEY + ".")
_ANCHORS: dict[tuple, dict] = {}


def fit_points_digest(path: Path | None = None) -> str:
    """The first 16 hex digits of the fitting points' sha256 (`FIT_POINTS` by default; "" where the file
    is missing)."""
    try:
        return hashlib.sha256(Path(path or FIT_POINTS).read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def fit_anchors(digest: str, models: Mapping[str, ModelType]) -> dict:
    """The agreed fitting points per model type, as `modeler.fit.Measurements`, that a run's refits keep
    (none for ""). ValueError when this checkout's `FIT_POINTS` is not the file the run recorded."""
    if not digest:
        return {}
    if fit_points_digest() != digest:
        raise ValueError(f"the run's refits kept the fitting points {digest}, but {FIT_POINTS} is "
                         f"{fit_points_digest() or 'missing'}: replay it with the checkout that recorded it")
    key = (digest, tuple(sorted((k, m.allow_tp_across_nodes) for k, m in models.items())))
    if key not in _ANCHORS:
        from modeler.validate import points_by_model

        _ANCHORS[key] = points_by_model(models, FIT_POINTS)
    return _ANCHORS[key]


def fitted_params(models: Mapping[str, ModelType], env: Environment, *, cache_dir: Path | None = None,
                  env_file: Path = DEFAULT_ENV_FILE) -> dict[str, dict[str, float]]:
    """Parameters fitted on the artifact's fit_points for every model (what `modeler.service.make_core`
    seeds its core with), each with its error bound under `BOUND_KEY`. Fitting takes seconds, so the result is cached in this process and, where
    `cache_dir` is given, on disk under a key of every input file and the modeler's source."""
    inputs = [FIT_POINTS, env_file, *sorted(MODELS_DIR.glob("*.yaml")), *sorted((ROOT / "modeler").glob("*.py"))]
    key = _digest(inputs)
    if key in _FITTED:
        return _FITTED[key]
    path = None if cache_dir is None else Path(cache_dir) / f"fit-{key}.json"
    if path is not None and path.is_file():
        try:
            _FITTED[key] = json.loads(path.read_text())
            return _FITTED[key]
        except (OSError, ValueError):
            pass
    from modeler.service import seed_fits

    out: dict[str, dict[str, float]] = {}
    for name, (params, bounds, _) in seed_fits(models, env, FIT_POINTS).items():
        out[name] = {**params.as_dict(), **{bound_key(k): v for k, v in sorted(bounds.items())}}
    _FITTED[key] = out
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes filling the cache at once
            tmp.write_text(json.dumps(out, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass
    return out


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rubick"


@dataclass
class Parts:
    """Everything a run needs besides the cores: specs, environment, table, starting parameters."""

    models: dict[str, ModelType]
    env: Environment
    table: MeasuredTable
    params: dict[str, dict[str, float]]
    batches: dict[str, int] = field(default_factory=dict)

    def predictor(self) -> ModelPredictor:
        """A fresh predictor on the starting parameters (each user gets its own: cores mutate theirs)."""
        return ModelPredictor(self.env, dict(self.models), self.perf_params())

    def perf_params(self) -> dict[str, PerfParams]:
        """The starting parameters per model type (without their error bounds)."""
        return {k: PerfParams.from_dict({n: x for n, x in v.items() if not _is_bound(n)})
                for k, v in sorted(self.params.items())}

    @property
    def bounds(self) -> dict[str, dict[str, float]]:
        """The starting parameters' error bounds per model type (`modeler.uncertainty.Uncertainty.margins`),
        where the fit gave them (runs recorded before bounds existed have none: the policy's fixed margin
        applies)."""
        from modeler.uncertainty import clean_bounds
        from modeler.uncertainty import ALL

        out = {}
        for k, v in sorted(self.params.items()):
            found = {(ALL if n == BOUND_KEY else n[len(BOUND_KEY) + 1:]): x for n, x in v.items() if _is_bound(n)}
            bounds = clean_bounds(found)
            if bounds:
                out[k] = bounds
        return out


def load_parts(params: Mapping[str, Mapping[str, float]] | None = None, cache_dir: Path | None = None,
               models: Mapping[str, ModelType] | None = None) -> Parts:
    """The starting parts: the model specs (of `examples/models` unless given, as a run's description
    gives them), the environment, the measured table, and the parameters (fitted unless given)."""
    models = dict(sorted(models.items())) if models is not None else load_models()
    env = load_env(DEFAULT_ENV_FILE)
    table = MeasuredTable.from_csv(DEFAULT_TABLE)
    p = {k: dict(v) for k, v in params.items()} if params is not None else fitted_params(models, env,
                                                                                         cache_dir=cache_dir)
    return Parts(models, env, table, p, {k: m.spec.global_batch_size for k, m in models.items()})


PolicyFactory = Callable[[RunConfig, Parts], Any]
NETWORK_KEYS = ("network", "network_classes", "rack_size", "oversubscription")


def network_core(cfg: RunConfig, parts: Parts) -> Any:
    """The network scheduler's core for a run with a network (None for `none`)."""
    if cfg.network == "none":
        return None
    if cfg.network not in NETWORK_SETTINGS:
        raise ValueError(f"unknown network mode {cfg.network!r}; expected one of {', '.join(NETWORK_SETTINGS)}")
    from policy.network.core import NetworkCore

    return NetworkCore(cfg.network, dict(parts.models), parts.env,
                       parts.perf_params(),
                       classes=cfg.network_classes, rack_size=cfg.rack_size, oversubscription=cfg.oversubscription)


def fabric(cfg: RunConfig, parts: Parts, nodes: list[str]) -> Any:
    """The simulated network the agents' jobs contend on (None for `none`)."""
    if cfg.network == "none":
        return None
    from agents.fabric import Fabric

    return Fabric(dict(parts.models), parts.env, parts.perf_params(),
                  tuple(nodes), rack_size=cfg.rack_size, oversubscription=cfg.oversubscription)


def registry_policy(cfg: RunConfig, parts: Parts) -> Any:
    """The policy core named by the configuration, from `policy.registry`."""
    from policy.oracle import ModelOracle, TableOracle
    from policy.registry import make_policy

    if cfg.oracle == "model":
        oracle = ModelOracle(env=parts.env, params=parts.perf_params(), bounds=parts.bounds)
    elif cfg.oracle == "table":
        oracle = TableOracle(env=parts.env, table=parts.table)
    else:
        raise ValueError(f"unknown oracle {cfg.oracle!r} (model or table)")
    from controlplane.events.workload import EXAMPLE_TRAINER
    # nodes that register themselves are real agents: a job without a workload runs their example trainer;
    # on a simulated cluster (`cluster` set) it runs whatever plan is decided
    return make_policy(cfg.policy, oracle=oracle, models=dict(parts.models), restart_cost_s=cfg.restart_cost_s,
                       quotas=cfg.quotas, node_gpus=node_gpus(cfg), batch_s=cfg.batch_s,
                       hold_s=cfg.hold_s, hold_backoff_s=cfg.hold_backoff_s,
                       default_support=None if cfg.cluster else EXAMPLE_TRAINER)


def policy_names() -> tuple[str, ...]:
    try:
        from policy.registry import POLICIES
    except ImportError:
        return ()
    return tuple(POLICIES)


def control_cores(cfg: RunConfig, parts: Parts, policy_factory: PolicyFactory | None = None) -> list[Any]:
    """Admission, modeler and policy: the control plane's cores, in delivery order."""
    factory = policy_factory or registry_policy
    modeler = ModelerCore(parts.models, parts.env, parts.perf_params(), min_gain=cfg.refit_min_gain,
                          anchors=fit_anchors(cfg.anchors, parts.models), bounds=parts.bounds,
                          refit_folds=cfg.refit_folds, refit_backoff=cfg.refit_backoff)
    cores = [AdmissionCore(known_models=sorted(parts.models)), modeler, factory(cfg, parts)]
    net = network_core(cfg, parts)
    return cores if net is None else [*cores, net]
