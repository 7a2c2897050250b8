"""The node agent's shell: the bus, the clock and the processes around `AgentCore`.

Start-up: register the node, replay the stream through the core (facts only), find the jobs
left on disk by an earlier agent (`reconcile`: take over the live ones, report the ended ones,
carry out accepted decisions never acted on), then go live: consume `job.*` and
`plan.decided[.<node>]`, poll the processes, heartbeat. Undecodable messages are skipped
(admission answers them); bad decisions get `plan.rejected` from the core. Nothing a message makes the
core or a launcher raise stops the agent (and with it the node's jobs): it is logged, the message is
acknowledged and the agent goes on. NATS away does not stop it either: it goes on looking after the
node's processes (and renewing their training leases), keeps what it has to say in an outbox, in
order, and sends it when NATS is back (each event under its own id, so a resend is stored once).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.bus.base import Bus
from controlplane.bus.inorder import in_order
from controlplane.events import Event, Invalid, NodeHeartbeat, decode, encode, make, new_id

from .core import AgentCore, Exited, Kill, Launch, LaunchFailed, Started, Stop
from .launcher import LaunchError, Launcher
from .node import NodeCapacity

log = logging.getLogger(__name__)


@dataclass
class AgentShell:
    bus: Bus
    capacity: NodeCapacity
    launcher: Launcher
    """`LocalLauncher` (processes) or `agents.kube.launcher.KubernetesLauncher` (pods)."""
    heartbeat_s: float = 5.0
    poll_s: float = 0.2
    core: AgentCore = field(init=False)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    restored: int = 0
    publish_wait_s: float = 3.0
    """How long one publish may take before the agent counts NATS as away and goes on looking after its
    processes; what it had to say waits in `outbox`."""
    outbox: collections.deque = field(default_factory=collections.deque)
    """(subject, wire bytes, id) of the events not yet stored, oldest first."""
    away: bool = False

    def __post_init__(self) -> None:
        self.core = AgentCore(self.capacity)

    @property
    def node(self) -> str:
        return self.capacity.node

    async def publish(self, events: list[Event]) -> None:
        await self._publish_encoded([(e, encode(e)) for e in events])

    async def flush(self) -> bool:
        """Send what waits in the outbox, in order; False (the rest kept) when NATS does not answer."""
        while self.outbox:
            subject, data, msg_id = self.outbox[0]
            try:
                async with asyncio.timeout(self.publish_wait_s):
                    await self.bus.publish(subject, data, msg_id)
            except PermissionError:
                raise
            except Exception as exc:  # noqa: BLE001 - unreachable, timed out, reconnecting: all the same here
                if not self.away:
                    log.warning("agent %s: NATS not answering (%s): looking after the jobs, keeping what to say",
                                self.node, type(exc).__name__)
                self.away = True
                return False
            self.outbox.popleft()
        if self.away:
            log.warning("agent %s: NATS answers again; everything kept was sent", self.node)
            self.away = False
        return True

    def _event(self, subject: str, payload) -> Event:
        return make(subject, payload, time=time.time(), id=new_id(f"{self.node}-"), source=f"agent-{self.node}")

    async def start(self) -> int:
        """Register, restore, reconcile. Returns the last stream sequence restored."""
        await self.publish([self._event(f"node.registered.{self.node}", self.capacity.registered())])
        upto = await self.bus.last_seq()
        self.core.restoring = True
        async for d in self.bus.read(tuple(self.core.subjects), 1, upto):
            try:
                self.core.handle(decode(d.data, d.subject))
                self.restored += 1
            except Invalid:
                continue
            except Exception:  # one bad event must not keep the agent from starting
                log.exception("agent %s: handler failed on seq %d while restoring", self.node, d.seq)
        found = self.launcher.find()
        out = self.core.reconcile(found, time.time())
        await self.publish(out)
        await self._act()
        adopted = [f.job_id for f in found if f.alive]
        log.info("agent %s: %d events restored, jobs found alive: %s", self.node, self.restored, adopted or "none")
        return upto

    async def run(self, stop: asyncio.Event) -> None:
        upto = await self.start()
        consumer = await in_order(self.bus, f"agent-{self.node}", self.core.subjects)
        consumer.last_seq = max(consumer.last_seq, upto)  # restored already: acknowledged, not handled again
        self.ready.set()
        beat_at = 0.0
        try:
            while not stop.is_set():
                if not await self.flush():  # NATS away: the processes are looked after all the same
                    await self._watch()
                    await asyncio.sleep(self.poll_s)
                    continue
                try:
                    batch = await consumer.fetch(64, timeout=self.poll_s)
                except Exception as exc:  # noqa: BLE001 - the connection went away under the fetch
                    log.info("agent %s: fetch failed (%s)", self.node, type(exc).__name__)
                    batch = []
                    await asyncio.sleep(self.poll_s)
                for d in batch:
                    await self._deliver(d)
                    try:
                        await d.ack()
                    except Exception as exc:  # noqa: BLE001 - handed out already: dropped if it comes again
                        log.info("agent %s: ack of seq %d failed (%s)", self.node, d.seq, type(exc).__name__)
                await self._watch()
                if time.monotonic() - beat_at >= self.heartbeat_s and not self.outbox:
                    beat_at = time.monotonic()
                    await self.publish([self._event(f"node.heartbeat.{self.node}",
                                                    NodeHeartbeat(node=self.node, jobs=self.core.running_jobs()))])
        finally:
            await consumer.close()

    async def _deliver(self, d) -> None:
        try:
            event = decode(d.data, d.subject)
        except Invalid as exc:
            log.info("agent %s: skipped undecodable seq %d on %s: %s", self.node, d.seq, d.subject, exc)
            return
        try:
            out = [(e, encode(e)) for e in self.core.handle(event)]
        except Exception:  # a core bug must not take the node's jobs down with the agent
            log.exception("agent %s: handler failed on seq %d", self.node, d.seq)
            return
        await self._publish_encoded(out)
        await self._act()

    async def _publish_encoded(self, out: list[tuple[Event, bytes]]) -> None:
        self.outbox.extend((e.subject, data, e.id) for e, data in out)
        await self.flush()

    async def _observe(self, fact) -> None:
        """Hand the core a fact about a process and publish its answers (a core failure is logged)."""
        try:
            out = [(e, encode(e)) for e in self.core.observe(fact)]
        except Exception:
            log.exception("agent %s: handler failed on %s", self.node, type(fact).__name__)
            return
        await self._publish_encoded(out)

    async def _watch(self) -> None:
        try:
            facts = self.launcher.poll()
        except Exception:  # next poll tries again
            log.exception("agent %s: polling the processes failed", self.node)
            return
        for fact in facts:
            await self._observe(fact)
            if isinstance(fact, Exited) and fact.job_id not in self.core.local:
                self.launcher.forget(fact.job_id)
            await self._act()

    async def _act(self) -> None:
        """Carry out the core's actions; launching may lead to more (a failed launch frees devices)."""
        while actions := self.core.take_actions():
            for a in actions:
                fact = carry_out(self.launcher, a, self.node)
                if fact is not None:
                    await self._observe(fact)


def carry_out(launcher: Launcher, a, node: str = "") -> Started | LaunchFailed | None:  # noqa: ANN001
    """One action of the core on the launcher. A launch answers with its fact (started, or failed with the
    reason); a stop or kill that fails is logged (the job is watched on: its exit is reported when it comes)."""
    if isinstance(a, Launch):
        try:
            launcher.launch(a)
            return Started(a.job.job_id, a.attempt, time.time())
        except LaunchError as exc:
            return LaunchFailed(a.job.job_id, a.attempt, time.time(), str(exc))
        except Exception as exc:  # an unforeseen failure is a failed launch too
            log.exception("agent %s: launching %s failed", node, a.job.job_id)
            return LaunchFailed(a.job.job_id, a.attempt, time.time(), f"{type(exc).__name__}: {exc}")
    try:
        if isinstance(a, Stop):
            launcher.request_stop(a.job_id, a.attempt)
        elif isinstance(a, Kill):
            launcher.kill(a.job_id)
            launcher.forget(a.job_id)
    except Exception:
        log.exception("agent %s: %s of %s failed", node, type(a).__name__, a.job_id)
    return None


def state_dir_for(base: Path, node: str) -> Path:
    return Path(base) / f"agent-{node}"
