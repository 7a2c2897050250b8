"""Helpers for the Kubernetes launcher tests: a kubelet's hand on pod status, events, and a small driver that
carries out the agent core's actions with the launcher the way `agents.shell.AgentShell` does (no bus)."""

from __future__ import annotations

import time
from typing import Any, Callable

import kubernetes

from agents.core import AgentCore, Exited, LaunchFailed
from agents.kube.launcher import KubernetesLauncher
from agents.kube.manifests import PodSettings
from agents.shell import carry_out
from agents.node import NodeCapacity
from controlplane.events import (Decision, JobSubmitted, ModelRef, NodeRegistered, NodeShare, Plan, PlanDecided,
                                 Resources, make)
from controlplane.events.workload import CheckpointVolume, Workload

from .emulator import ApiServer, now_iso

NS = "jobs"
IMAGE = "registry.example/rubick:1.0"
WORKLOAD = Workload(image="ghcr.io/team-a/gpt2-train:1.4", command=("python", "train.py"), args=("--lr", "3e-4"),
                    working_dir="/workspace", env={"HF_HOME": "/cache"}, checkpoint=CheckpointVolume(pvc="gpt2-ckpt"))
CAPACITY = NodeCapacity(node="n0", gpus=8, cpus=96, mem_gb=1000.0)


def settings(**kw: Any) -> PodSettings:
    return PodSettings(**{"namespace": NS, "contract_image": IMAGE, "nats_url": "nats://nats.rubick:4222", **kw})


def launcher(server: ApiServer, node: str = "n0", **kw: Any) -> KubernetesLauncher:
    s = kw.pop("settings", None) or settings()
    return KubernetesLauncher(server.api(), node, s, **kw)


def ev(subject: str, payload: Any, t: float, id: str | None = None):
    return make(subject, payload, time=t, id=id or f"{subject}-{t}", source="test")


def submitted(job_id: str = "j1", workload: Workload | None = WORKLOAD, gpus: int = 2, gbs: int = 16):
    return ev("job.submitted", JobSubmitted(job_id=job_id, tenant="t", guaranteed=True, model=ModelRef(type="gpt2"),
                                            global_batch_size=gbs, plan=Plan(dp=gpus, zero_stage=2),
                                            resources=Resources(gpus=gpus), target_iterations=100,
                                            workload=workload), 0.5, id=f"sub-{job_id}")


def registered(node: str = "n0"):
    return ev("node.registered", NodeRegistered(node=node, gpus=8, gpu_mem_gb=80, cpus=96, mem_gb=1000.0), 0.1,
              id=f"reg-{node}")


def decision(job_id: str = "j1", shares: tuple[tuple[str, int], ...] = (("n0", 2),), cpus: int = 8,
             mem: float = 64.0) -> Decision:
    gpus = sum(g for _, g in shares)
    allocation = tuple(NodeShare(node=n, gpus=g, cpus=cpus, mem_gb=mem) for n, g in shares)
    return Decision(job_id=job_id, allocation=allocation, plan=Plan(dp=max(1, gpus), zero_stage=2))


def decided(*decisions: Decision, t: float = 2.0):
    return ev("plan.decided", PlanDecided(round=int(t), policy="test", decisions=tuple(decisions)), t, id=f"plan-{t}")


class Kubelet:
    """What the node's kubelet would write in pod status, written through the API."""

    def __init__(self, server: ApiServer) -> None:
        self.v1 = kubernetes.client.CoreV1Api(server.api())

    def pods(self, ns: str = NS) -> dict[str, dict[str, Any]]:
        import json
        doc = json.loads(self.v1.list_namespaced_pod(ns, _preload_content=False).data)
        return {p["metadata"]["name"]: p for p in doc["items"]}

    def status(self, name: str, status: dict[str, Any], ns: str = NS) -> None:
        self.v1.patch_namespaced_pod_status(name, ns, {"status": status}, _preload_content=False)

    def running(self, name: str) -> None:
        self.status(name, {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                           "containerStatuses": [{"name": "train", "ready": False,
                                                  "state": {"running": {"startedAt": now_iso()}}}]})

    def ready(self, name: str, at: str | None = None) -> None:
        self.status(name, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True",
                                                               "lastTransitionTime": at or now_iso()}],
                           "containerStatuses": [{"name": "train", "ready": True,
                                                  "state": {"running": {"startedAt": now_iso()}}}]})

    def exit(self, name: str, code: int, message: str = "") -> None:
        self.status(name, {"phase": "Succeeded" if code == 0 else "Failed",
                           "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now_iso()}],
                           "containerStatuses": [{"name": "train", "ready": False, "state": {"terminated": {
                               "exitCode": code, "message": message, "finishedAt": now_iso(),
                               "reason": "Completed" if code == 0 else "Error"}}}]})

    def waiting(self, name: str, reason: str, message: str = "") -> None:
        self.status(name, {"phase": "Pending", "containerStatuses": [
            {"name": "train", "ready": False, "state": {"waiting": {"reason": reason, "message": message}}}]})


class Driver:
    """The agent core with the launcher, as the shell wires them (`_act`, `_watch`), without a bus."""

    def __init__(self, launcher: KubernetesLauncher, capacity: NodeCapacity = CAPACITY) -> None:
        self.launcher = launcher
        self.core = AgentCore(capacity)
        self.events: list = []
        self.failed_launches: list[str] = []

    def handle(self, *events) -> None:  # noqa: ANN002
        for e in events:
            self.events += self.core.handle(e)
        self.act()

    def act(self) -> None:
        """The core's actions on the launcher, as the agent shell carries them out."""
        while actions := self.core.take_actions():
            for a in actions:
                fact = carry_out(self.launcher, a, self.core.node)
                if isinstance(fact, LaunchFailed):
                    self.failed_launches.append(fact.reason)
                if fact is not None:
                    self.events += self.core.observe(fact)

    def watch(self) -> list:
        facts = self.launcher.poll()
        for fact in facts:
            self.events += self.core.observe(fact)
            if isinstance(fact, Exited) and fact.job_id not in self.core.local:
                self.launcher.forget(fact.job_id)
            self.act()
        return facts

    def subjects(self) -> list[str]:
        return [e.subject for e in self.events]

    def until(self, what: Callable[[], object], timeout: float = 5.0, message: str = "") -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            got = what()
            if got:
                return got
            time.sleep(0.02)
        raise AssertionError(f"timed out: {message or what}; events {self.subjects()}")


def wait(what: Callable[[], object], timeout: float = 5.0, message: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out: {message or what}")
