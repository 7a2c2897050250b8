"""A live run (`rubick up`, with real node agents or simulated ones): its cores and its run.json.

The live control plane builds its modeler and policy cores here, with `replay.config.control_cores`:
the very function `rubick replay` rebuilds them with. What replay needs is written to `run.json` in
the event-log folder (the same file a simulated run has; see docs/simulate.md):

- at start-up, before any core consumes an event: the configuration (`config`: policy, cluster,
  restart cost, sampling period, quotas, ..., plus `sim_speed` and the clock's origin; with real
  agents the clock is the wall clock, `clock: "wall"`, speed 1, origin the first start-up), the
  performance-model parameters the cores start from (`params`), which event sources are the
  cores' answers (`sources`), `kind: "live"`, and the stream token of the log files;
- when the control plane stops: the manifest of the log files (`files`: rows, sequence range,
  sha256) and, per core, the stream sequence of the last event it handled (`consumed`). An event
  after that position never reached that core in the run, so replay does not hand it to the
  rebuilt core either. A run that never stopped cleanly has neither; replay then checks what the
  log holds and says that answers to its last events may be missing.

A deployment with real agents may be stopped and started again on the same stream (its cores rebuild
their state from it): the record then keeps the clock origin of the first start-up, counts the
start-ups, and keeps every earlier configuration that differs from the current one (replay rebuilds
the cores of the last one, and says so).

A deployment of separate `rubick service ...` processes writes no run.json: there the admission,
modeler and policy services publish their part of the description on the bus (`run.described`, see
`description_event`) each time one of their replicas becomes active, and the recorder keeps it in the
log. Without run.json, `run_from_log` rebuilds the record from those events (each core from its own
service's last description), so such a deployment replays from its log alone. The policy service may run
the network scheduler beside the policy (`rubick service policy --network MODE`): its description then
names the network (`network`, `network_classes`, `rack_size`, `oversubscription`), and the network core
is rebuilt and checked with the policy's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from controlplane.events import Event, Invalid, NodeRegistered, decode, make, to_plain
from controlplane.events.payloads import ModelDescription, RunDescribed

from .config import NETWORK_KEYS, RUN_FILE, Parts, PolicyFactory, RunConfig, control_cores, load_parts, node_events

KIND = "live"
FORMAT = 1


@dataclass
class LiveParts:
    config: RunConfig
    parts: Parts
    cores: list[Any]
    """Admission, modeler and policy, as `control_cores` builds them (and replay rebuilds them)."""
    agents: Any
    """The `SimulatedAgents` core."""
    nodes: list[NodeRegistered]

    def core(self, name: str) -> Any:
        return next(c for c in self.cores if c.name == name)


def build(cfg: RunConfig, cache_dir: Path | None = None) -> LiveParts:
    """Everything a live simulated cluster runs: the cores, the simulated agents, the nodes."""
    from agents.simulated import SimulatedAgents

    from .run import ground_truth

    from .config import fabric

    parts = load_parts(cache_dir=cache_dir)
    nodes = [e.payload for e in node_events(cfg.cluster)]
    agents = SimulatedAgents(ground_truth(parts), restart_cost_s=cfg.restart_cost_s, start_cost_s=cfg.start_cost_s,
                             sample_every_s=cfg.sample_every_s, noise=cfg.noise, seed=cfg.seed,
                             fabric=fabric(cfg, parts, [n.node for n in nodes]))
    return LiveParts(cfg, parts, control_cores(cfg, parts), agents, nodes)


def deployment(cfg: RunConfig, cache_dir: Path | None = None) -> tuple[Parts, list[Any]]:
    """The starting parts and the control cores of a deployment whose nodes register themselves."""
    parts = load_parts(cache_dir=cache_dir)
    return parts, control_cores(cfg, parts)


def run_description(config: RunConfig, parts: Parts, cores: list[Any], *, stream: str,
                    extra_config: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": FORMAT, "kind": KIND, "config": {**config.to_json(), **extra_config},
            "params": parts.params, "sources": {c.name: [c.name] for c in cores}, "stream": stream,
            "files": []}


CLOCK_KEYS = ("sim_clock_origin", "sim_speed", "clock")


def _without_clock(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in CLOCK_KEYS}


def continued(log_dir: Path, run: dict[str, Any]) -> dict[str, Any]:
    """`run` as recorded at a start-up that goes on with the stream of an earlier one (same stream
    token in the folder's run.json): the first start-up's clock origin, the number of start-ups, and
    the earlier configurations that differ from this one. Otherwise `run` itself."""
    try:
        earlier = json.loads((Path(log_dir) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return run
    if not isinstance(earlier, dict) or earlier.get("stream") != run["stream"] or earlier.get("kind") != KIND:
        return run
    old = earlier.get("config") or {}
    out = {**run, "config": dict(run["config"]), "starts": int(earlier.get("starts", 1)) + 1}
    if "sim_clock_origin" in old:
        out["config"]["sim_clock_origin"] = old["sim_clock_origin"]
    history = list(earlier.get("earlier_configs", []))
    if _without_clock(old) != _without_clock(out["config"]) or earlier.get("params") != run["params"]:
        history.append({"config": old, "params": earlier.get("params")})
    if history:
        out["earlier_configs"] = history
    return out


def write_run(log_dir: Path, run: Mapping[str, Any]) -> Path:
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / RUN_FILE
    tmp = log_dir / f"{RUN_FILE}.tmp"
    tmp.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def manifest(log_dir: Path, stream: str) -> list[dict[str, Any]]:
    """Every log file of `stream`: name, rows, sequence range, size, sha256. The recorder's manifest
    (`manifest-<stream>.jsonl`, written as the files were) where there is one, so the two agree; else
    computed from the files."""
    from controlplane.recorder import manifest as written
    from controlplane.recorder.writer import FILE_RE

    found = written.read(Path(log_dir), stream)
    if found is not None and found.entries:
        return found.entries
    out = []
    for path in sorted(Path(log_dir).iterdir()):
        m = FILE_RE.match(path.name)
        if m is None or m["stream"] != stream:
            continue
        first, last = int(m["first"]), int(m["last"])
        out.append({"name": path.name, "rows": last - first + 1, "first_seq": first, "last_seq": last,
                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    return out


def finish_run(log_dir: Path, consumed: Mapping[str, int]) -> dict[str, Any]:
    """Complete run.json once the run has stopped and the recorder has written everything."""
    path = Path(log_dir) / RUN_FILE
    run = json.loads(path.read_text())
    run["files"] = manifest(log_dir, run["stream"])
    run["consumed"] = dict(sorted(consumed.items()))
    write_run(log_dir, run)
    return run


# --- the run description on the bus -------------------------------------------------------------------

DESCRIBED = "run.described"
DESCRIBED_SERVICES = ("admission", "modeler", "policy")
"""The services whose cores replay rebuilds, in the order `control_cores` builds them."""
DESCRIBED_SETTINGS = ("policy", "cluster", "oracle", "restart_cost_s", "quotas", "batch_s", "hold_s",
                      "refit_min_gain", "refit_folds", "anchors", "hold_backoff_s", "refit_backoff")
"""The `RunConfig` fields a description carries (the rest only matter to simulated runs)."""
NETWORK_SERVICE = "policy"
"""The service whose active replica runs the network scheduler beside its core (`--network`); its description
carries the `RunConfig`'s `NETWORK_KEYS`."""
NETWORK_CORE = "network"


def describe(service: str, cfg: RunConfig, parts: Parts) -> RunDescribed:
    """The description of `service`'s core as built from `cfg` and `parts` (`deployment`)."""
    models = tuple(ModelDescription(spec=m.spec, vocab_size=m.vocab_size, allow_tp_across_nodes=m.allow_tp_across_nodes,
                                    b_pcie_gbps=m.b_pcie_gbps, tensor_pipeline=m.tensor_pipeline)
                   for _, m in sorted(parts.models.items()))
    params = {k: {n: float(x) for n, x in sorted(v.items())} for k, v in sorted(parts.params.items())}
    settings = {k: getattr(cfg, k) for k in DESCRIBED_SETTINGS}
    if service == NETWORK_SERVICE and cfg.network != "none":
        settings.update({k: getattr(cfg, k) for k in NETWORK_KEYS})
    if settings["quotas"] is not None:
        settings["quotas"] = dict(sorted(settings["quotas"].items()))
    return RunDescribed(service=service, models=models, params=params, **settings)


def description_event(description: RunDescribed, t: float) -> Event:
    """`run.described` at wall time `t`. Its id is a digest of the description, so replicas that
    describe the same core store it once (within the stream's de-duplication window; a service process publishes
    it once, not again in a later term of its lease, `controlplane.cli.service._Term`); its source is
    the service's shell (`service-<name>`), never the core's name, as it is no answer of the core."""
    plain = to_plain(description)
    if description.network == "none":  # the same id as before descriptions could name a network
        plain = {k: v for k, v in plain.items() if k not in NETWORK_KEYS}
    digest = hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]
    return make(DESCRIBED, description, time=t, id=f"run-{description.service}-{digest}",
                source=f"service-{description.service}")


def _service_record(d: RunDescribed) -> dict[str, Any]:
    plain = to_plain(d)
    config = {k: plain[k] for k in DESCRIBED_SETTINGS}
    if d.network != "none":  # a description without a network is recorded as before the network existed
        config.update({k: plain[k] for k in NETWORK_KEYS})
    return {"config": config, "params": plain["params"], "models": plain["models"]}


def _network_runs(record: Mapping[str, Any] | None) -> bool:
    return record is not None and record["config"].get("network", "none") != "none"


def run_from_log(log_dir: Path) -> dict[str, Any] | None:
    """The run record of a log without run.json, from its `run.described` events (None: there are
    none). Each described core is rebuilt from its service's last description; earlier descriptions
    that differ are kept under `earlier_configs`, as run.json keeps them across restarts."""
    import polars as pl

    from controlplane.eventlog import scan
    from controlplane.recorder.writer import FILE_RE

    log_dir = Path(log_dir)
    frame = scan(log_dir, ["subject", "data"]).frame
    rows = frame.filter(pl.col("subject") == DESCRIBED).sort("seq")
    found: list[Event] = []
    for data in rows["data"].to_list():
        try:
            event = decode(data, DESCRIBED)
        except Invalid:
            continue  # refused on the bus (run.rejected) and by replay alike
        found.append(event)
    if not found:
        return None
    last: dict[str, dict[str, Any]] = {}
    history: list[dict[str, Any]] = []
    for event in found:
        name, record = event.payload.service, _service_record(event.payload)
        if name in last and last[name] != record:
            history.append({"service": name, **last[name]})
        last[name] = record
    main = next(last[n] for n in ("policy", "modeler", "admission") if n in last)
    tokens = sorted({m["stream"] for p in log_dir.iterdir() if (m := FILE_RE.match(p.name)) is not None})
    run: dict[str, Any] = {
        "format": FORMAT, "kind": KIND, "from_log": True,
        "config": {**main["config"], "clock": "wall", "sim_speed": 1.0, "sim_clock_origin": found[0].time},
        "params": main["params"], "services": {n: last[n] for n in DESCRIBED_SERVICES if n in last},
        "sources": {n: [n] for n in DESCRIBED_SERVICES if n in last},
        "stream": tokens[0] if len(tokens) == 1 else "", "files": []}
    if _network_runs(last.get(NETWORK_SERVICE)):
        run["sources"][NETWORK_CORE] = [NETWORK_CORE]
    if history:
        run["earlier_configs"] = history
        run["starts"] = sum(1 for e in found if e.payload.service == next(iter(run["services"])))
    return run


def _models(records: list[dict[str, Any]]) -> dict[str, Any]:
    from modeler.spec import model_from_mapping

    out = {}
    for m in records:
        extras = {k: v for k, v in m.items() if k != "spec" and v is not None}
        model = model_from_mapping({**{k: v for k, v in m["spec"].items() if v is not None}, **extras})
        out[model.name] = model
    return out


def rebuilt_cores(run: Mapping[str, Any], policy_factory: PolicyFactory | None = None) -> list[Any]:
    """The cores a run record names, rebuilt as they started: from run.json's one configuration, or
    (a record from the log's descriptions) each from its own service's description; the network core
    from the policy's, where the policy service ran one."""
    services = run.get("services")
    if not services:
        return control_cores(RunConfig.from_json(run["config"]), load_parts(params=run["params"]), policy_factory)
    built: dict[str, list[Any]] = {}
    out = []
    for name in DESCRIBED_SERVICES:
        record = services.get(name)
        if record is None:
            continue
        key = json.dumps(record, sort_keys=True)
        if key not in built:
            parts = load_parts(params=record["params"], models=_models(record["models"]))
            built[key] = control_cores(RunConfig.from_json(record["config"]), parts, policy_factory)
        out.append(next(c for c in built[key] if c.name == name))
        if name == NETWORK_SERVICE and _network_runs(record):
            out.append(next(c for c in built[key] if c.name == NETWORK_CORE))
    return out
