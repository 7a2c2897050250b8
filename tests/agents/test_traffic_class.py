"""Traffic classes from `network.decided` carried out by the node agent: the core keeps each job's latest class
and hands it to every launch; `agents.traffic` turns it into NCCL_IB_SL / NCCL_IB_TC; the local launcher puts
them in real training processes' environment and the Kubernetes launcher in the pod it creates (kmock's
emulated API server, as in tests/agents/kube); a workload's own env wins; a cleared job gets none."""

from __future__ import annotations

import argparse
import json
import sys
import time

import pytest

from agents.cli import register, run_agent, traffic_classes
from agents.core import SUBJECTS, AgentCore, Exited, Launch, Started, Stop
from agents.kube import manifests as m
from agents.launcher import LocalLauncher
from agents.node import NodeCapacity
from agents.plan_check import JobInfo
from agents.traffic import (DEFAULT, SL_ENV, TC_ENV, Marking, TrafficClasses, TrafficClassError, parse,
                            traffic_env)
from controlplane.auth import Identity, may_publish
from controlplane.events import (Decision, JobSubmitted, ModelRef, NodeRegistered, NodeShare, Plan, PlanDecided,
                                 Resources)
from controlplane.events.payloads import JobNetwork, NetworkDecided
from controlplane.events.workload import Workload

from .kube.conftest import server  # noqa: F401  (kmock's emulated API server, nodes n0 and n1)
from .kube.helpers import WORKLOAD, Driver, Kubelet, decision as kube_decision, launcher as kube_launcher, registered
from .kube.helpers import settings as kube_settings
from .kube.helpers import submitted as kube_submitted

from .test_core import DP2, OFF, ev

NODE = NodeCapacity(node="n0", gpus=4, cpus=8, mem_gb=32.0, cpu_devices=True)


def network(*classes: tuple[str, int], cleared: tuple[str, ...] = (), round: int = 1, t: float = 1.5):
    decisions = tuple(JobNetwork(job_id=j, traffic_class=c, rank=i, bytes_per_iteration=1e9, tardiness_s=0.1)
                      for i, (j, c) in enumerate(classes))
    return ev("network.decided", NetworkDecided(mode="echelonflow", round=round, classes=4, decisions=decisions,
                                                cleared=cleared), t, id=f"net-{round}")


def submitted(job_id):
    return ev("job.submitted", JobSubmitted(job_id=job_id, tenant="t", guaranteed=True, model=ModelRef(type="gpt2"),
                                            global_batch_size=8, plan=DP2, resources=Resources(gpus=2),
                                            target_iterations=100), id=f"sub-{job_id}")


def decided(*decisions, t=2.0):
    return ev("plan.decided", PlanDecided(round=int(t), policy="test", decisions=tuple(decisions)), t, id=f"plan-{t}")


def place(job_id, plan=DP2, gpus=2):
    return Decision(job_id=job_id, allocation=(NodeShare(node="n0", gpus=gpus),), plan=plan)


def core_with(*jobs):
    core = AgentCore(NODE)
    core.handle(ev("node.registered", NodeRegistered(node="n0", gpus=4, gpu_mem_gb=0, cpus=8, mem_gb=32.0)))
    for j in jobs:
        core.handle(submitted(j))
    return core


# --- the agent core ------------------------------------------------------------------------------

def test_the_agent_reads_network_decided():
    assert "network.decided" in SUBJECTS and "network.decided.>" in SUBJECTS


def test_network_then_plan_launches_with_the_class_and_a_job_without_one_gets_none():
    core = core_with("j1", "j2")
    assert core.handle(network(("j1", 2))) == [] and core.take_actions() == []  # a class alone launches nothing
    core.handle(decided(place("j1"), place("j2")))
    launches = {a.job.job_id: a for a in core.take_actions()}
    assert launches["j1"].traffic_class == 2 and launches["j2"].traffic_class is None


def test_a_class_that_changes_while_the_job_runs_applies_at_its_next_launch():
    core = core_with("j1")
    core.handle(network(("j1", 1)))
    core.handle(decided(place("j1")))
    (first,) = core.take_actions()
    assert first.traffic_class == 1
    core.observe(Started("j1", 1, 3.0))
    assert core.handle(network(("j1", 3), round=2, t=4.0)) == []
    assert core.take_actions() == [], "a new class alone does not restart the job"
    core.handle(decided(place("j1", OFF, gpus=1), t=5.0))
    (stop,) = core.take_actions()
    assert isinstance(stop, Stop)
    core.observe(Exited("j1", 1, 6.0, 0, "checkpointed", 10))
    (relaunch,) = core.take_actions()
    assert isinstance(relaunch, Launch) and relaunch.attempt == 2 and relaunch.traffic_class == 3


def test_a_cleared_job_launches_without_a_class():
    core = core_with("j1", "j2")
    core.handle(network(("j1", 0), ("j2", 1)))
    core.handle(network(cleared=("j1",), round=2, t=1.8))
    core.handle(decided(place("j1"), place("j2")))
    launches = {a.job.job_id: a.traffic_class for a in core.take_actions()}
    assert launches == {"j1": None, "j2": 1}


def test_classes_are_learnt_while_restoring():
    core = core_with("j1")
    core.restoring = True
    core.handle(network(("j1", 2)))
    core.handle(decided(place("j1")))
    assert core.take_actions() == []
    core.reconcile([], 10.0)
    (launch,) = core.take_actions()
    assert launch.traffic_class == 2


# --- the mapping ---------------------------------------------------------------------------------

def test_default_table_one_priority_per_class_high_to_low():
    assert [(c, DEFAULT.env(c)) for c in range(5)] == [
        (0, {SL_ENV: "5", TC_ENV: "184"}), (1, {SL_ENV: "4", TC_ENV: "136"}), (2, {SL_ENV: "3", TC_ENV: "104"}),
        (3, {SL_ENV: "2", TC_ENV: "72"}), (4, {SL_ENV: "1", TC_ENV: "40"})]
    assert all(DEFAULT.env(c) == {SL_ENV: "0", TC_ENV: "0"} for c in (5, 6, 7))
    tcs = [int(DEFAULT.env(c)[TC_ENV]) for c in range(8)]
    assert all(tc & 3 == 0 for tc in tcs), "the ECN bits stay clear"
    assert [tc >> 5 for tc in tcs[:5]] == [5, 4, 3, 2, 1], "DSCP >> 3 is the priority the SL names"
    assert DEFAULT.env(None) == {} and traffic_env(None, 0) == {}
    assert parse(DEFAULT.text()) == DEFAULT


def test_custom_table():
    table = parse(" 1 : tc=104 ; 0:sl=3,tc=136;7:SL=15;")
    assert table.markings == (Marking(0, 3, 136), Marking(1, None, 104), Marking(7, 15, None))
    assert table.env(0) == {SL_ENV: "3", TC_ENV: "136"} and table.env(1) == {TC_ENV: "104"}
    assert table.env(7) == {SL_ENV: "15"} and table.env(2) == {}, "a class left out sets nothing"
    assert parse(table.text()) == table


@pytest.mark.parametrize("text, says", [
    ("", "empty traffic class table"),
    ("0:sl=16,tc=104", "'0:sl=16,tc=104': sl must be a whole number 0 to 15, got '16'"),
    ("0:sl=3;1:tc=256", "'1:tc=256': tc must be a whole number 0 to 255, got '256'"),
    ("8:sl=1", "'8:sl=1': the class must be a whole number 0 to 7, got '8'"),
    ("-1:sl=1", "the class must be a whole number 0 to 7, got '-1'"),
    ("0:sl=1;0:sl=2", "'0:sl=2': class 0 is given twice"),
    ("0:sl=1,sl=2", "sl is given twice"),
    ("0:dscp=26", "expected sl=N or tc=N, got 'dscp=26'"),
    ("0:", "expected sl=N or tc=N"),
    ("0 sl=1", "'0 sl=1': expected CLASS:sl=N,tc=N"),
    ("0:sl=1;;1:sl=2", "an empty entry"),
    ("0:sl=x", "sl must be a whole number 0 to 15, got 'x'"),
    ("0:tc=1.5", "got '1.5'"),
])
def test_bad_tables_are_refused_naming_the_entry(text, says):
    with pytest.raises(TrafficClassError) as err:
        parse(text)
    assert says in str(err.value)


def agent_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["agent", *argv])


def test_the_agents_command_line(capsys):
    assert traffic_classes(agent_args()) == DEFAULT
    assert traffic_classes(agent_args("--traffic-classes", "0:sl=3,tc=136;1:sl=2,tc=104")) == TrafficClasses(
        (Marking(0, 3, 136), Marking(1, 2, 104)))
    assert traffic_classes(agent_args("--no-traffic-classes")) is None
    with pytest.raises(SystemExit):
        agent_args("--no-traffic-classes", "--traffic-classes", "0:sl=1")
    capsys.readouterr()
    assert run_agent(agent_args("--traffic-classes", "0:sl=3;1:sl=99")) != 0
    assert "--traffic-classes: traffic class entry '1:sl=99': sl must be a whole number 0 to 15" in \
        capsys.readouterr().err


def test_only_the_policy_publishes_network_decided():
    assert may_publish(Identity("policy"), "network.decided")
    for who in (Identity("agent", "n1"), Identity("submitter"), Identity("modeler"), Identity("recorder")):
        assert not may_publish(who, "network.decided"), who


# --- the local launcher: real processes ---------------------------------------------------------

DUMP = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in ('NCCL_IB_SL', 'NCCL_IB_TC', 'HF_HOME')}, "
        "open(sys.argv[1], 'w'))")


def _local_launch(launcher: LocalLauncher, job_id: str, out, traffic_class, env=None, device=0) -> None:
    share = NodeShare(node="n0", gpus=1, cpus=1)
    workload = Workload(command=(sys.executable, "-c", DUMP, str(out)), env=env or {})
    launcher.launch(Launch(job=JobInfo(job_id, "example", 4, 10, workload), plan=Plan(dp=1), allocation=(share,),
                           share=share, attempt=1, devices=(device,), cpu_cores=(), traffic_class=traffic_class))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_local_launcher_puts_the_class_in_the_training_processes_environment(tmp_path, monkeypatch):
    for name in (SL_ENV, TC_ENV):
        monkeypatch.delenv(name, raising=False)
    default = LocalLauncher(tmp_path / "a", "n0", None, lease_s=0)
    custom = LocalLauncher(tmp_path / "b", "n0", None, lease_s=0, traffic_classes=parse("0:sl=7,tc=224"))
    off = LocalLauncher(tmp_path / "c", "n0", None, lease_s=0, traffic_classes=None)
    outs = {name: tmp_path / f"{name}.json" for name in ("classed", "override", "none", "custom", "off")}
    try:
        _local_launch(default, "classed", outs["classed"], 1)
        _local_launch(default, "override", outs["override"], 2, env={TC_ENV: "0", "HF_HOME": "/cache"}, device=1)
        _local_launch(default, "none", outs["none"], None, device=2)
        _local_launch(custom, "custom", outs["custom"], 0)
        _local_launch(off, "off", outs["off"], 0)
        exited: dict[str, Exited] = {}
        deadline = time.monotonic() + 180
        while len(exited) < len(outs) and time.monotonic() < deadline:
            for launcher in (default, custom, off):
                exited.update({f.job_id: f for f in launcher.poll() if isinstance(f, Exited)})
            time.sleep(0.2)
        assert sorted(exited) == sorted(outs), exited
        assert all(f.exit_code == 0 for f in exited.values()), exited
    finally:
        for launcher in (default, custom, off):
            for job_id in list(launcher.procs):
                launcher.kill(job_id)
    got = {name: json.loads(path.read_text()) for name, path in outs.items()}
    assert got["classed"] == {SL_ENV: "4", TC_ENV: "136", "HF_HOME": None}
    assert got["override"] == {SL_ENV: "3", TC_ENV: "0", "HF_HOME": "/cache"}, "the workload's env wins"
    assert got["none"] == {SL_ENV: None, TC_ENV: None, "HF_HOME": None}
    assert got["custom"] == {SL_ENV: "7", TC_ENV: "224", "HF_HOME": None}
    assert got["off"] == {SL_ENV: None, TC_ENV: None, "HF_HOME": None}


# --- the Kubernetes launcher: kmock's emulated API server ----------------------------------------

def _pod_env(kubelet: Kubelet, job_id: str) -> dict[str, str]:
    (pod,) = [p for p in kubelet.pods().values() if p["metadata"]["annotations"].get(m.JOB_ID_ANN) == job_id]
    (main,) = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in main["env"]}


def test_the_kubernetes_launcher_puts_the_class_in_the_pods_environment(server):
    lau = kube_launcher(server)
    try:
        d = Driver(lau)
        override = Workload(image=WORKLOAD.image, command=WORKLOAD.command, env={SL_ENV: "6"})
        d.handle(registered("n0"), registered("n1"), kube_submitted("j1"), kube_submitted("j2", override),
                 kube_submitted("j3"))
        d.handle(network(("j1", 0), ("j2", 2), ("j3", 1)), network(cleared=("j3",), round=2, t=1.8))
        d.handle(kube_decided(kube_decision("j1"), kube_decision("j2"), kube_decision("j3")))
        assert sorted(d.subjects()) == ["job.started.n0"] * 3 and not d.failed_launches
        kubelet = Kubelet(server)
        j1, j2, j3 = (_pod_env(kubelet, j) for j in ("j1", "j2", "j3"))
        assert (j1[SL_ENV], j1[TC_ENV], j1["HF_HOME"]) == ("5", "184", "/cache")
        assert (j2[SL_ENV], j2[TC_ENV]) == ("6", "104"), "the workload's env wins"
        assert SL_ENV not in j3 and TC_ENV not in j3, "a cleared job gets no class"
    finally:
        lau.close()


def kube_decided(*decisions, t=2.0):
    return ev("plan.decided", PlanDecided(round=int(t), policy="test", decisions=tuple(decisions)), t, id=f"plan-{t}")


def test_the_pods_environment_follows_the_agents_table():
    share = NodeShare(node="n0", gpus=2, cpus=8, mem_gb=64.0)
    launch = Launch(JobInfo("j1", "gpt2", 16, 100, WORKLOAD), DP2, (share,), share, 1, (0, 1), (), traffic_class=1)

    def env(**kw):
        pod = m.pod_manifest(launch, "n0", kube_settings(**kw))
        return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}

    assert (env()[SL_ENV], env()[TC_ENV]) == ("4", "136")
    custom = env(traffic_classes=parse("1:tc=96"))
    assert custom[TC_ENV] == "96" and SL_ENV not in custom
    off = env(traffic_classes=None)
    assert SL_ENV not in off and TC_ENV not in off
