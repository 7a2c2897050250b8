"""The whole loop on Kubernetes: `rubick up` (real nats-server with nkey authentication, recorder, admission,
modeler, policy), `rubick agent --launcher kubernetes` as its own process with its node's credentials, and
jobs with a workload image. No Kubernetes API server can run on these machines: the agent talks to kmock's
emulator over HTTP with the official client (tests/agents/kube/emulator.py), and this test plays the
kubelet, driving the pods' phases (Running and Ready, Succeeded with the trainer's termination message,
Failed with an exit code). The lifecycle lands in the Parquet log, and `rubick replay` reproduces every
decision from it."""

from __future__ import annotations

import json
import socket

import polars as pl
import pytest
import yaml

from controlplane.cli import main as rubick
from controlplane.client import Client
from controlplane.eventlog import scan
from controlplane.runtime import read_endpoints
from controlplane.events import ModelRef, Plan, Resources
from controlplane.events.payloads import JobSubmitted
from controlplane.events.workload import CheckpointVolume, Workload
from tests.faults.harness import Proc

from .kube.emulator import ApiServer, node_object
from .kube.helpers import Kubelet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NS = "jobs"  # the namespace the kubelet helper of tests/agents/kube drives
IMAGE = "registry.example:5000/team-a/gpt2-train:1.4"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kubeconfig(path, url: str) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "agent", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "agent", "namespace": NS}}]}))
    return str(path)


def workload_job(job_id: str, gpus: int, guaranteed: bool = False) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, tenant="team-a", guaranteed=guaranteed, model=ModelRef(type="gpt2"),
                        global_batch_size=32, plan=Plan(dp=gpus, zero_stage=2), resources=Resources(gpus=gpus),
                        target_iterations=1000,
                        workload=Workload(image=IMAGE, command=("python", "train.py"), args=("--lr", "3e-4"),
                                          checkpoint=CheckpointVolume(pvc=f"{job_id}-ckpt")))


def pods_of(kubelet: Kubelet, job_id: str) -> dict[str, dict]:
    return {n: p for n, p in kubelet.pods(NS).items()
            if p["metadata"].get("annotations", {}).get("rubick.io/job-id") == job_id}


async def until(what, proc: Proc, timeout: float = 60.0, message: str = ""):
    import asyncio
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        if proc.proc.poll() is not None:
            raise AssertionError(f"{proc.name} exited: {proc.lines[-20:]}")
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out: {message}; agent said {proc.lines[-15:]}")


def lifecycle(log_dir) -> list[tuple[str, str]]:
    frame = scan(log_dir, ["subject", "job_id"]).frame
    rows = frame.filter(pl.col("subject").str.starts_with("job.") & (pl.col("subject") != "job.submitted"))
    return [(s.rsplit(".", 1)[0] if s.count(".") > 1 else s, j) for s, j in rows.select("subject", "job_id").iter_rows()]


async def test_jobs_with_images_run_as_pods_reconfigure_complete_and_replay(tmp_path):
    server = ApiServer()
    data = tmp_path / "rubick"
    up = agent = None
    try:
        server.api().call_api  # the emulator answers before anything connects
        import kubernetes
        kubernetes.client.CoreV1Api(server.api()).create_node(node_object("n0", gpus=8), _preload_content=False)
        kubelet = Kubelet(server)
        up = Proc("up", ["up", "--data-dir", str(data), "--port", str(free_port()), "--metrics-port", "-1",
                         "--tick-period", "0.5", "--roll-seconds", "0.3", "--log-level", "warning"])
        await up.said("ready in")
        agent = Proc("agent", ["agent", "--launcher", "kubernetes", "--kubeconfig", kubeconfig(tmp_path / "kc", server.url),
                               "--node", "n0", "--k8s-namespace", NS, "--contract-image", "rubick:test",
                               "--data-dir", str(data), "--state-dir", str(tmp_path / "agent"), "--heartbeat", "0.5",
                               "--log-level", "info"])
        await agent.said("agent n0 ready")

        url = read_endpoints(data)["nats_url"]
        async with await Client.connect(url, data_dir=data) as client:
            first = await client.submit(workload_job("wa", 2))
            assert not first.rejected, first
            # the policy places it; the agent makes its pod, pinned to n0, running the job's own image
            (name_a1,) = await until(lambda: list(pods_of(kubelet, "wa")), agent, message="wa's pod")
            pod = kubelet.pods(NS)[name_a1]
            main = next(c for c in pod["spec"]["containers"])
            assert main["image"] == IMAGE and main["command"][0] == "torchrun" and main["args"] == ["--lr", "3e-4"]
            terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n0"]
            assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "wa-ckpt" for v in pod["spec"]["volumes"])
            kubelet.running(name_a1)
            kubelet.ready(name_a1)

            # a guaranteed job: the policy takes GPUs from the first (best-effort), which checkpoints and comes
            # back under its new plan
            second = await client.submit(workload_job("wb", 4, guaranteed=True))
            assert not second.rejected, second
            await until(lambda: pods_of(kubelet, "wa").get(name_a1, {}).get("metadata", {}).get("annotations", {})
                        .get("rubick.io/stop"), agent, message="the stop annotation on wa's pod")
            kubelet.exit(name_a1, 0, json.dumps({"state": "checkpointed", "iteration": 40}))
            (name_a2,) = await until(lambda: [n for n in pods_of(kubelet, "wa") if n != name_a1], agent,
                                     message="wa's second attempt")
            assert name_a1 not in kubelet.pods(NS), "the checkpointed pod is gone before its successor runs"
            plan_a2 = json.loads(kubelet.pods(NS)[name_a2]["metadata"]["annotations"]["rubick.io/plan"])
            kubelet.running(name_a2)
            kubelet.ready(name_a2)  # its first iteration: the reconfiguration is done
            await until(lambda: ("job.reconfigured", "wa") in lifecycle(data / "events"), agent, 30,
                        "job.reconfigured recorded")
            (name_b,) = await until(lambda: list(pods_of(kubelet, "wb")), agent, message="wb's pod")
            kubelet.running(name_b)
            kubelet.ready(name_b)

            # wa completes; wb's code crashes: its exit code and log tail become job.failed
            server.set_log(name_b, "step 3\nRuntimeError: CUDA error: an illegal memory access\n")
            kubelet.exit(name_a2, 0, json.dumps({"state": "completed", "iteration": 1000}))
            kubelet.exit(name_b, 1, "")
            await until(lambda: not kubelet.pods(NS), agent, message="ended pods deleted")
        await until(lambda: ("job.failed", "wb") in lifecycle(data / "events")
                    and ("job.completed", "wa") in lifecycle(data / "events"), agent, 30, "the ends recorded")
    finally:
        for p in (agent, up):
            if p is not None:
                p.stop()
        server.close()

    events = lifecycle(data / "events")
    wa = [s for s, j in events if j == "wa"]
    assert wa == ["job.started", "job.reconfigured", "job.completed"], events
    assert [s for s, j in events if j == "wb"] == ["job.started", "job.failed"]
    frame = scan(data / "events", ["subject", "data"]).frame
    failed = [r for r in frame.iter_rows(named=True) if r["subject"].startswith("job.failed")]
    from controlplane.events import decode, to_plain
    (f,) = [decode(r["data"], r["subject"]).payload for r in failed]
    assert f.exit_code == 1 and f.log_tail.endswith("an illegal memory access")
    (r,) = [decode(r["data"], r["subject"]).payload for r in frame.iter_rows(named=True)
            if r["subject"].startswith("job.reconfigured")]
    assert to_plain(r.plan) == plan_a2 and r.plan.gpus == 4 and r.restart_cost_s > 0, r
    assert rubick(["replay", str(data / "events")]) == 0
