"""`rubick up`: the control plane on one machine.

Starts (or connects to) NATS with JetStream, creates the stream, runs the
recorder, the admission service, the clock and the modeler, exposes Prometheus metrics, and
writes `endpoints.json` in the data folder so `rubick submit` and friends find
it. Stopping stops the services first and then drains the recorder: everything the
stream holds, the services' last answers included, is in the log.

With `sim_cluster` ("NxG") it also runs simulated node agents (`agents.sim_shell`) over
the same bus, on a simulated clock running `sim_speed` times faster than the wall
clock (the clock ticks follow it too), and records in the event-log folder what
`rubick replay` needs to rebuild the cores (`replay.live`). Such a run needs a fresh
stream and event log. On stop, the inputs (agents, clock) stop first and the cores
are given time to answer everything stored, so the log ends with their last answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import metrics
from .admission import AdmissionCore
from .auth import AuthStore, Credentials, Identity, ServerTls, find_credentials
from .bus.nats import JetStreamBus, redact_url
from .models import builtin_model_types
from .natsserver import NatsServer, last_port
from .recorder.service import Recorder, RecorderConfig, stream_token
from .service import ServiceShell
from .ticker import run_ticker

log = logging.getLogger(__name__)

from .endpoints import DEFAULT_DATA_DIR, DEFAULT_NATS_PORT, ENDPOINTS, read_endpoints, resolve_nats_url  # noqa: F401


@dataclass
class UpConfig:
    data_dir: Path = DEFAULT_DATA_DIR
    nats_url: str | None = None
    """Use this NATS deployment instead of starting the embedded server."""
    nats_port: int | None = None
    """Port of the embedded server. None: the one this data folder's server used last, else 4222, else a
    free one; 0: a free one; any other: that one (an error if another program listens on it)."""
    metrics_port: int = 9464
    tick_period_s: float = 60.0
    roll_seconds: float = 2.0
    roll_rows: int = 200_000
    compact: bool = True
    """Merge the event log's small files in the background (`controlplane.recorder.compact`)."""
    log_dir: Path | None = None
    policy: str = "rubick"
    """The scheduling policy (one of `policy.registry.POLICIES`)."""
    restart_cost_s: float = 78.0
    quotas: dict[str, int] | None = None
    """GPUs per tenant for guaranteed jobs (None: the whole cluster for every tenant)."""
    network: str = "none"
    """Network scheduling (docs/network.md): none, fair, coflow or echelonflow; with one of the last three
    the network core publishes `network.decided` (and a simulated cluster's jobs contend on a network)."""
    network_classes: int = 4
    sim_cluster: str | None = None
    """"NxG": run N simulated nodes of G GPUs (the testbed's CPUs and memory) beside the control plane."""
    sim_speed: float = 1.0
    """Simulated seconds per wall second of the simulated cluster (its clock ticks follow it)."""
    sim_sample_every_s: float = 600.0
    """Simulated seconds between a running simulated job's `metrics.iteration` samples."""
    settle_timeout_s: float = 30.0
    """On stop of a simulated cluster: how long the cores may take to answer what is stored."""
    insecure: bool = False
    """Embedded server without authentication (secure by default: nkeys per component, docs/security.md)."""
    creds: Path | None = None
    """Against an external NATS (`nats_url`): the bootstrap identity's nkey seed file."""
    tls_cert: Path | None = None
    """Embedded server: its TLS certificate (with `tls_key`); every connection then uses TLS."""
    tls_key: Path | None = None
    tls_ca: Path | None = None
    """CA that signed the server's certificate (what clients verify it with)."""
    tls_verify_clients: bool = False
    """Embedded server with TLS: clients must present a certificate signed by `tls_ca` (mutual TLS)."""

    @property
    def event_log(self) -> Path:
        return Path(self.log_dir) if self.log_dir else Path(self.data_dir) / "events"


def embedded_server(cfg: UpConfig) -> NatsServer:
    """The embedded server of `cfg`: with no port given, the one its data folder used last, else the
    default, else a free one; a port given is used or is an error."""
    data = Path(cfg.data_dir) / "nats"
    if cfg.nats_port is None:
        last = last_port(data)
        return NatsServer(data, preferred_ports=tuple(p for p in (last, DEFAULT_NATS_PORT) if p))
    return NatsServer(data, port=cfg.nats_port)


class _Shell(ServiceShell):
    """A service shell that remembers the stream sequence of the last event it handled."""

    last_seq: int = 0

    async def process(self, d) -> None:
        await super().process(d)
        self.last_seq = d.seq


@dataclass
class ControlPlane:
    config: UpConfig
    server: NatsServer | None = None
    bus: JetStreamBus | None = None
    recorder: Recorder | None = None
    shells: list[ServiceShell] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    nats_url: str = ""
    metrics_url: str = ""
    ready_s: float = 0.0
    models_ready: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the modeler and the policy consume events (they start after the rest); with a
    simulated cluster, once its agents run and its nodes are registered too."""
    stream: str = ""
    sim_clock: object | None = None
    """`agents.sim_shell.SimClock` of a simulated cluster."""
    sim_agents: object | None = None
    """`agents.sim_shell.SimAgentsShell` of a simulated cluster, once it runs."""
    settled: bool | None = None
    """Simulated cluster, after stop: whether every core had answered everything stored."""
    _services_stop: asyncio.Event = field(default_factory=asyncio.Event)
    _recorder_stop: asyncio.Event = field(default_factory=asyncio.Event)
    _input_tasks: list[asyncio.Task] = field(default_factory=list)
    started_at: float = 0.0
    """Wall-clock time of start-up (the origin of a replay's what-if of a run with real agents)."""
    _run_file: bool = False
    auth: AuthStore | None = None
    """The credentials folder of the embedded server (None: insecure, or an external NATS)."""
    credentials: Credentials | None = None
    """What the control plane itself connects with (the bootstrap identity)."""

    async def start(self) -> "ControlPlane":
        t0 = time.perf_counter()
        self.started_at = time.time()
        cfg = self.config
        Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
        credentials = Credentials(cfg.creds, cfg.tls_ca)
        if cfg.nats_url:
            self.nats_url = cfg.nats_url
            credentials = find_credentials(Identity("admin"), creds=cfg.creds, tls_ca=cfg.tls_ca)
        else:
            self.server = embedded_server(cfg)
            self.server.config_file = self._server_config()
            if self.auth is not None:
                credentials = Credentials(self.auth.seed_file(Identity("admin")), cfg.tls_ca)
            self.server.spawn()  # on this thread, which lives as long as the process: the server dies with it
            await asyncio.to_thread(self.server.wait_ready)
            for pid in self.server.stopped_orphans:
                log.warning("stopped nats-server pid %d left running on %s by a control plane that died",
                            pid, self.server.store)
            self.nats_url = self.server.url
        self.credentials = credentials
        self.bus = await JetStreamBus.connect(self.nats_url, name="rubick-up", credentials=credentials)
        if cfg.metrics_port is not None and cfg.metrics_port >= 0:
            try:
                port = metrics.serve(cfg.metrics_port)
            except OSError:
                port = metrics.serve(0)
            self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        self.stream = stream = stream_token(await self.bus.stream_created())
        from .lease import ensure_lease_bucket

        await ensure_lease_bucket(self.bus.js)  # the bootstrap's part: replicas of `rubick service` use it
        if cfg.sim_cluster:
            await self._check_fresh()
            from agents.sim_shell import SimClock

            self.sim_clock = SimClock(cfg.sim_speed)
        self.recorder = Recorder(self.bus, RecorderConfig(cfg.event_log, roll_seconds=cfg.roll_seconds,
                                                          roll_rows=cfg.roll_rows, compact=cfg.compact),
                                 stream)
        self.shells = [_Shell(AdmissionCore(builtin_model_types()), self.bus, rejects=True)]
        self.tasks = [asyncio.create_task(self.recorder.run(self._recorder_stop), name="recorder")]
        self.tasks += [asyncio.create_task(s.run(self._services_stop), name=s.name) for s in self.shells]
        if cfg.tick_period_s > 0:
            if self.sim_clock is not None:
                from agents.sim_shell import run_sim_ticker

                ticker = run_sim_ticker(self.bus, self.sim_clock, cfg.tick_period_s, self.stop_event)
            else:
                ticker = run_ticker(self.bus, cfg.tick_period_s, self.stop_event)
            task = asyncio.create_task(ticker, name="clock")
            self.tasks.append(task)
            self._input_tasks.append(task)
        await self._until_ready(timeout=30.0)
        self.ready_s = time.perf_counter() - t0
        self._write_endpoints()
        # services whose cores take a while to build start after the control plane is ready
        self.tasks.append(asyncio.create_task(self._run_model_services(), name="modeler+policy"))
        return self

    async def _check_fresh(self) -> None:
        """A simulated cluster's run is recorded from its first event on: refuse a used stream or log."""
        log_dir = Path(self.config.event_log)
        used = sorted(p.name for p in log_dir.iterdir() if p.suffix == ".parquet") if log_dir.is_dir() else []
        if await self.bus.last_seq() > 0 or used:
            where = "the stream already holds events" if not used else f"{log_dir} already holds an event log"
            raise RuntimeError(f"a simulated cluster needs a fresh stream and event log, but {where}: "
                               "use a new --data-dir")

    async def _run_model_services(self) -> None:
        """The modeler and the policy, seeded with the same fitted parameters (and the simulated agents)."""
        agents = None
        try:
            if self.config.sim_cluster:
                cores, agents = await asyncio.to_thread(self._sim_parts)
            else:
                cores = await asyncio.to_thread(self._deployment_cores)
            from modeler.fit import load_solver
            await asyncio.to_thread(load_solver)  # not in the middle of the run, at the first refit
        except ImportError as exc:  # a deployment without the modeler or policy package
            log.warning("modeler and policy not started: %s", exc)
            return
        if self.stop_event.is_set():
            return
        shells = [_Shell(core, self.bus) for core in cores]
        self.shells.extend(shells)
        runs = [asyncio.create_task(s.run(self._services_stop), name=s.name) for s in shells]
        waits = [asyncio.create_task(s.ready.wait()) for s in shells]
        if agents is not None:
            self.sim_agents = agents
            task = asyncio.create_task(agents.run(self.stop_event), name="agents")
            self._input_tasks.append(task)
            runs.append(task)
            waits.append(asyncio.create_task(agents.ready.wait()))
        await asyncio.wait([*runs, asyncio.gather(*waits)], return_when=asyncio.FIRST_COMPLETED)
        if all(s.ready.is_set() for s in shells) and (agents is None or agents.ready.is_set()):
            self.models_ready.set()
        for w in waits:
            w.cancel()
        await asyncio.gather(*runs)

    def _sim_parts(self) -> tuple[list, object]:
        """(modeler and policy cores, the simulated agents' shell) of a simulated cluster; writes run.json."""
        from agents.sim_shell import SimAgentsShell
        from replay import live
        from replay.config import default_cache_dir

        cfg = self.config
        run_cfg = replace(deployment_config(cfg), cluster=cfg.sim_cluster, sample_every_s=cfg.sim_sample_every_s)
        parts = live.build(run_cfg, cache_dir=default_cache_dir())
        run = live.run_description(parts.config, parts.parts, parts.cores, stream=self.stream, extra_config={
            "sim_speed": cfg.sim_speed, "sim_clock_origin": self.sim_clock.origin})
        live.write_run(cfg.event_log, run)
        self._run_file = True
        shell = SimAgentsShell(parts.agents, self.bus, self.sim_clock, parts.nodes)
        return _modeler_and_policy(parts.cores), shell

    def _deployment_cores(self) -> list:
        """The modeler and policy cores of a cluster whose agents register themselves; writes run.json
        (the wall clock, counted from the first start-up on this stream) so the run can be replayed."""
        from replay import live
        from replay.config import default_cache_dir

        run_cfg = deployment_config(self.config)
        parts, cores = live.deployment(run_cfg, cache_dir=default_cache_dir())
        run = live.run_description(run_cfg, parts, cores, stream=self.stream, extra_config={
            "clock": "wall", "sim_speed": 1.0, "sim_clock_origin": self.started_at})
        run = live.continued(self.config.event_log, run)
        try:
            live.write_run(self.config.event_log, run)
            self._run_file = True
        except OSError as exc:
            log.error("could not write %s/run.json (the run cannot be replayed): %r", self.config.event_log, exc)
        return _modeler_and_policy(cores)

    async def _until_ready(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (self.recorder.ready.is_set() and all(s.ready.is_set() for s in self.shells)):
            for task in self.tasks:
                if task.done():
                    task.result()  # raises the error that stopped it
                    raise RuntimeError(f"{task.get_name()} stopped during start-up")
            if loop.time() > deadline:
                raise TimeoutError("control plane services not ready in time")
            await asyncio.sleep(0.005)

    def credentials_for(self, identity: Identity) -> Credentials | None:
        """What `identity` connects to this control plane with (None: the server asks for nothing)."""
        if self.auth is None:
            return self.credentials if self.config.nats_url else Credentials(tls_ca=self.config.tls_ca)
        from .auth.admin import provision
        provision(self.auth, [identity], {"server_pid": self.server.proc.pid if self.server and self.server.proc else None})
        return Credentials(self.auth.seed_file(identity), self.config.tls_ca)

    def _server_config(self) -> Path | None:
        """The embedded server's configuration: nkey users of every identity (created at first start, in
        `<data-dir>/auth`) and TLS; None when insecure without TLS."""
        cfg = self.config
        tls = None
        if cfg.tls_cert or cfg.tls_key:
            if not (cfg.tls_cert and cfg.tls_key):
                raise ValueError("TLS needs both a certificate and its key")
            for f in (cfg.tls_cert, cfg.tls_key, cfg.tls_ca):
                if f is not None and not Path(f).is_file():
                    raise FileNotFoundError(f"TLS file {f} does not exist")
            tls = ServerTls(Path(cfg.tls_cert).resolve(), Path(cfg.tls_key).resolve(),
                            Path(cfg.tls_ca).resolve() if cfg.tls_ca and cfg.tls_verify_clients else None)
        store = AuthStore(Path(cfg.data_dir) / "auth")
        if cfg.insecure:
            if tls is None:
                return None
            store = AuthStore(Path(cfg.data_dir) / "auth-insecure")
            store.folder.mkdir(parents=True, exist_ok=True)
            return store.write_server_config(tls, users=False)
        self.auth = store
        created = store.init()
        if created:
            log.info("created credentials in %s for %s", store.folder, ", ".join(i.name for i in created))
        return store.write_server_config(tls)

    def _write_endpoints(self) -> None:
        doc = {"nats_url": self.nats_url, "metrics_url": self.metrics_url, "event_log": str(self.config.event_log),
               "embedded_server": self.server is not None, "pid": os.getpid(),
               "server_pid": self.server.proc.pid if self.server is not None and self.server.proc else None,
               "auth_dir": str(self.auth.folder.resolve()) if self.auth is not None else None,
               "tls_ca": str(Path(self.config.tls_ca).resolve()) if self.config.tls_ca else None}
        if self.sim_clock is not None:  # what an outside publisher stamps its events with (docs/lifecycle.md)
            doc.update(sim_speed=self.sim_clock.speed, sim_clock_origin=self.sim_clock.origin)
        (Path(self.config.data_dir) / ENDPOINTS).write_text(json.dumps(doc, indent=2) + "\n")

    @property
    def run_recorded(self) -> bool:
        """Whether run.json was written, so `rubick replay` can check the run."""
        return self._run_file

    def summary(self) -> str:
        where = "embedded nats-server" if self.server else "external NATS"
        if self.server is not None:
            where += ", nkey auth" if self.auth is not None else ", NO AUTHENTICATION (--insecure)"
            where += ", TLS" if self.config.tls_cert else ""
        text = (f"rubick control plane ready in {self.ready_s * 1000:.0f} ms | NATS {redact_url(self.nats_url)} ({where}, "
                f"JetStream stream RUBICK) | event log {self.config.event_log} | metrics {self.metrics_url or 'off'}")
        if self.config.sim_cluster:
            text += (f" | simulated cluster {self.config.sim_cluster} at {self.config.sim_speed:g}x "
                     "(simulated seconds per wall second)")
        return text

    async def wait(self) -> None:
        """Until stopped, or until a service dies (its error is raised)."""
        stopper = asyncio.create_task(self.stop_event.wait())
        done, _ = await asyncio.wait([stopper, *self.tasks], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()

    async def stop(self) -> None:
        """Inputs first (clock, simulated agents), then the services, then the recorder drains."""
        self.stop_event.set()
        await asyncio.gather(*self._input_tasks, return_exceptions=True)
        if self._run_file and self.models_ready.is_set():
            self.settled = await self._settle(self.config.settle_timeout_s)
        self._services_stop.set()
        services = [t for t in self.tasks if t.get_name() != "recorder"]
        await asyncio.gather(*services, return_exceptions=True)
        self._recorder_stop.set()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        for task, result in zip(self.tasks, results):
            if isinstance(result, Exception):
                log.error("%s stopped with %r", task.get_name(), result)
        if self._run_file:
            from replay.live import finish_run

            try:
                finish_run(self.config.event_log, {s.name: s.last_seq for s in self.shells})
            except (OSError, ValueError) as exc:
                log.error("could not complete %s/run.json: %r", self.config.event_log, exc)
        if self.bus is not None:
            await self.bus.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
        endpoints = Path(self.config.data_dir) / ENDPOINTS
        if (read_endpoints(self.config.data_dir) or {}).get("pid") == os.getpid():  # not another control plane's
            endpoints.unlink(missing_ok=True)

    async def _settle(self, timeout: float) -> bool:
        """Until every core has handled everything stored (and the stream stops growing), or `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            last = await self.bus.last_seq()
            pending = 0
            for s in self.shells:
                info = await self.bus.js.consumer_info(self.bus.stream, f"svc-{s.name}")
                pending += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
            if pending == 0 and await self.bus.last_seq() == last:
                return True
            await asyncio.sleep(0.05)
        log.warning("stopping before every core answered what is stored (%.0f s)", timeout)
        return False


def deployment_config(cfg: UpConfig):
    """The `replay.config.RunConfig` of `rubick up`'s settings, for a deployment whose nodes register
    themselves (no cluster; a simulated cluster sets its own)."""
    from replay.config import RunConfig

    return RunConfig(policy=cfg.policy, cluster="", restart_cost_s=cfg.restart_cost_s,
                     tick_period_s=cfg.tick_period_s,
                     quotas=dict(sorted(cfg.quotas.items())) if cfg.quotas else None,
                     network=cfg.network, network_classes=cfg.network_classes)


def model_cores(cfg: UpConfig) -> list:
    """The modeler core (fitted on the built-in measurements) and the policy core seeded from it, built
    as `rubick up` and `rubick replay` build them."""
    from replay.config import default_cache_dir
    from replay.live import deployment

    _, cores = deployment(deployment_config(cfg), cache_dir=default_cache_dir())
    return _modeler_and_policy(cores)


def _modeler_and_policy(cores: list) -> list:
    """The modeler and the policy (and the network scheduler, where the configuration has one)."""
    return [c for name in ("modeler", "policy", "network") for c in cores if c.name == name]



