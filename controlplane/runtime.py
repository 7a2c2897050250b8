"""`rubick up`: the control plane on one machine.

Starts (or connects to) NATS with JetStream, creates the stream, runs the
recorder, the admission service, the clock and the modeler, exposes Prometheus metrics, and
writes `endpoints.json` in the data folder so `rubick submit` and friends find
it. Stopping drains the recorder: everything the stream holds is in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import metrics
from .admission import AdmissionCore
from .bus.nats import JetStreamBus
from .models import builtin_model_types
from .natsserver import NatsServer
from .recorder.service import Recorder, RecorderConfig, stream_token
from .service import ServiceShell
from .ticker import run_ticker

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(".rubick")
DEFAULT_NATS_PORT = 4222
ENDPOINTS = "endpoints.json"


@dataclass
class UpConfig:
    data_dir: Path = DEFAULT_DATA_DIR
    nats_url: str | None = None
    """Use this NATS deployment instead of starting the embedded server."""
    nats_port: int = DEFAULT_NATS_PORT
    """Port of the embedded server; a free one is picked when it is taken (0: always pick)."""
    metrics_port: int = 9464
    tick_period_s: float = 60.0
    roll_seconds: float = 2.0
    roll_rows: int = 200_000
    log_dir: Path | None = None
    policy: str = "rubick"
    """The scheduling policy (one of `policy.registry.POLICIES`)."""
    restart_cost_s: float = 78.0
    quotas: dict[str, int] | None = None
    """GPUs per tenant for guaranteed jobs (None: the whole cluster for every tenant)."""

    @property
    def event_log(self) -> Path:
        return Path(self.log_dir) if self.log_dir else Path(self.data_dir) / "events"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


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
    """Set once the modeler and the policy consume events (they start after the rest)."""

    async def start(self) -> "ControlPlane":
        t0 = time.perf_counter()
        cfg = self.config
        Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
        if cfg.nats_url:
            self.nats_url = cfg.nats_url
        else:
            port = cfg.nats_port if cfg.nats_port and _port_free(cfg.nats_port) else 0
            self.server = NatsServer(Path(cfg.data_dir) / "nats", port=port)
            await asyncio.to_thread(self.server.start)
            self.nats_url = self.server.url
        self.bus = await JetStreamBus.connect(self.nats_url, name="rubick-up")
        if cfg.metrics_port is not None and cfg.metrics_port >= 0:
            try:
                port = metrics.serve(cfg.metrics_port)
            except OSError:
                port = metrics.serve(0)
            self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        stream = stream_token(await self.bus.stream_created())
        self.recorder = Recorder(self.bus, RecorderConfig(cfg.event_log, roll_seconds=cfg.roll_seconds,
                                                          roll_rows=cfg.roll_rows), stream)
        self.shells = [ServiceShell(AdmissionCore(builtin_model_types()), self.bus, rejects=True)]
        self.tasks = [asyncio.create_task(self.recorder.run(self.stop_event), name="recorder")]
        self.tasks += [asyncio.create_task(s.run(self.stop_event), name=s.name) for s in self.shells]
        if cfg.tick_period_s > 0:
            self.tasks.append(asyncio.create_task(run_ticker(self.bus, cfg.tick_period_s, self.stop_event),
                                                  name="clock"))
        await self._until_ready(timeout=30.0)
        self.ready_s = time.perf_counter() - t0
        self._write_endpoints()
        # services whose cores take a while to build start after the control plane is ready
        self.tasks.append(asyncio.create_task(self._run_model_services(), name="modeler+policy"))
        return self

    async def _run_model_services(self) -> None:
        """The modeler and the policy, seeded with the same fitted parameters."""
        try:
            cores = await asyncio.to_thread(model_cores, self.config)
        except ImportError as exc:  # a deployment without the modeler or policy package
            log.warning("modeler and policy not started: %s", exc)
            return
        if self.stop_event.is_set():
            return
        shells = [ServiceShell(core, self.bus) for core in cores]
        self.shells.extend(shells)
        runs = [asyncio.create_task(s.run(self.stop_event), name=s.name) for s in shells]
        waits = [asyncio.create_task(s.ready.wait()) for s in shells]
        await asyncio.wait([*runs, asyncio.gather(*waits)], return_when=asyncio.FIRST_COMPLETED)
        if all(s.ready.is_set() for s in shells):
            self.models_ready.set()
        for w in waits:
            w.cancel()
        await asyncio.gather(*runs)

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

    def _write_endpoints(self) -> None:
        doc = {"nats_url": self.nats_url, "metrics_url": self.metrics_url, "event_log": str(self.config.event_log),
               "embedded_server": self.server is not None, "pid": os.getpid()}
        (Path(self.config.data_dir) / ENDPOINTS).write_text(json.dumps(doc, indent=2) + "\n")

    def summary(self) -> str:
        where = "embedded nats-server" if self.server else "external NATS"
        return (f"rubick control plane ready in {self.ready_s * 1000:.0f} ms | NATS {self.nats_url} ({where}, "
                f"JetStream stream RUBICK) | event log {self.config.event_log} | metrics {self.metrics_url or 'off'}")

    async def wait(self) -> None:
        """Until stopped, or until a service dies (its error is raised)."""
        stopper = asyncio.create_task(self.stop_event.wait())
        done, _ = await asyncio.wait([stopper, *self.tasks], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise task.exception()

    async def stop(self) -> None:
        self.stop_event.set()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        for task, result in zip(self.tasks, results):
            if isinstance(result, Exception):
                log.error("%s stopped with %r", task.get_name(), result)
        if self.bus is not None:
            await self.bus.close()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
        endpoints = Path(self.config.data_dir) / ENDPOINTS
        endpoints.unlink(missing_ok=True)


def model_cores(cfg: UpConfig) -> list:
    """The modeler core (fitted on the built-in measurements) and the policy core seeded from it."""
    from modeler.service import make_core
    from policy.oracle import from_modeler
    from policy.registry import make_policy

    modeler = make_core()
    oracle, models = from_modeler(modeler)
    policy = make_policy(cfg.policy, oracle=oracle, models=models, restart_cost_s=cfg.restart_cost_s,
                         quotas=cfg.quotas)
    return [modeler, policy]


def read_endpoints(data_dir: Path = DEFAULT_DATA_DIR) -> dict | None:
    try:
        return json.loads((Path(data_dir) / ENDPOINTS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def resolve_nats_url(explicit: str | None, data_dir: Path = DEFAULT_DATA_DIR) -> str:
    """--nats-url, else $RUBICK_NATS_URL, else the running `rubick up` of data_dir, else the default port."""
    if explicit:
        return explicit
    if os.environ.get("RUBICK_NATS_URL"):
        return os.environ["RUBICK_NATS_URL"]
    endpoints = read_endpoints(data_dir)
    if endpoints and endpoints.get("nats_url"):
        return endpoints["nats_url"]
    return f"nats://127.0.0.1:{DEFAULT_NATS_PORT}"
