"""The pod and Service builders, the init container's contract files, node capacity and the agent's Kubernetes
flags: pure functions, so no API server (the launcher's own tests use kmock's Kubernetes emulator)."""

from __future__ import annotations

import json
import re

import pytest

from agents.cli import k8s_namespace, pod_labels
from agents.core import Launch
from agents.kube import contract_files
from agents.kube import manifests as m
from agents.kube.capacity import node_capacity, quantity
from agents.plan_check import JobInfo
from controlplane.events import NodeShare, Plan
from controlplane.events.workload import Workload

from .emulator import node_object
from .helpers import WORKLOAD, settings

DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def launch(job_id="j1", workload=WORKLOAD, shares=(("n0", 2),), attempt=1, cpus=8, mem=64.0):
    allocation = tuple(NodeShare(node=n, gpus=g, cpus=cpus, mem_gb=mem) for n, g in shares)
    plan = Plan(dp=sum(g for _, g in shares), zero_stage=2)
    return Launch(JobInfo(job_id, "gpt2", 16, 100, workload), plan, allocation, allocation[0], attempt, (0, 1), ())


@pytest.mark.parametrize("job_id", ["j1", "Team_A.GPT2.Run_07", "9lives", "a" * 200, "x.y", "X_Y", "-"[:0] + "0"])
def test_names_are_dns_labels_within_63_characters(job_id):
    for attempt in (1, 12345):
        for name in (m.pod_name(job_id, attempt, 0), m.pod_name(job_id, attempt, 31), m.service_name(job_id, attempt)):
            assert DNS_LABEL.fullmatch(name) and len(name) <= 63, name
        assert DNS_LABEL.fullmatch(m.job_slug(job_id))


def test_names_of_ids_that_read_alike_stay_apart():
    names = {m.pod_name(j, 1, 0) for j in ("Job.A", "job-a", "job_a", "JOB_A", "job.a")}
    assert len(names) == 5
    assert m.pod_name("j1", 1, 0) != m.pod_name("j1", 2, 0)


def test_label_values_for_long_or_odd_node_names():
    assert m.label_value("gpu-node-7.cluster.local") == "gpu-node-7.cluster.local"
    long = "n" * 100 + ".example.com"
    value = m.label_value(long)
    assert len(value) <= 63 and value != m.label_value("n" * 101 + ".example.com")
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value)


def test_pods_trust_the_nats_servers_ca_when_told():
    from agents.cli import tls_ca_settings
    pod = m.pod_manifest(launch(), "n0", settings(**tls_ca_settings("nats-ca:tls.ca")))
    main = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["RUBICK_NATS_TLS_CA"] == "/var/run/rubick/tls/ca.crt"
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == "nats-ca")
    assert vol["secret"]["secretName"] == "nats-ca" and vol["secret"]["items"] == [{"key": "tls.ca", "path": "ca.crt"}]
    assert {"name": "nats-ca", "mountPath": "/var/run/rubick/tls", "readOnly": True} in main["volumeMounts"]
    plain = m.pod_manifest(launch(), "n0", settings())
    assert "RUBICK_NATS_TLS_CA" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}
    assert tls_ca_settings("nats-ca") == {"tls_ca_secret": "nats-ca", "tls_ca_key": "ca.crt"}


def test_pod_of_a_workload_with_a_command():
    pod = m.pod_manifest(launch(), "n0", settings(reporter_secret="reporters", image_pull_secrets=("regcred",),
                                                  pod_labels={"kueue.x-k8s.io/queue-name": "team-a"}))
    spec, meta = pod["spec"], pod["metadata"]
    assert meta["namespace"] == "jobs" and meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert meta["labels"][m.JOB_LABEL] == m.job_slug("j1") and meta["labels"][m.RANK_LABEL] == "0"
    assert json.loads(meta["annotations"][m.PLAN_ANN])["dp"] == 2
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    main = spec["containers"][0]
    assert main["command"][:1] == ["torchrun"] and main["command"][-3:] == ["--no-python", "python", "train.py"]
    assert main["workingDir"] == "/workspace" and main["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert main["readinessProbe"]["exec"]["command"] == ["test", "-e", "/var/run/rubick/ready"]
    assert main["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["RUBICK_NATS_CREDS"] == "/var/run/rubick/creds/creds.nk"
    assert env["RUBICK_RUN_FILE"] == "/var/run/rubick/run.json" and env["RUBICK_STATUS_FILE"].startswith("/var/run/")
    assert env["RUBICK_TERMINATION_LOG"] == "/dev/termination-log" and env["RUBICK_AGENT_LEASE_S"] == "0"
    assert env["RUBICK_TORCHRUN_ARGS"].startswith("--nnodes=1 --nproc-per-node=2")
    creds = next(v for v in spec["volumes"] if v["name"] == "creds")
    assert creds["secret"]["secretName"] == "reporters"
    assert creds["secret"]["items"] == [{"key": "reporter-n0.nk", "path": "creds.nk"}]
    init = spec["initContainers"][0]
    assert init["command"] == ["python", "-m", "agents.kube.contract_files"]
    init_env = {e["name"]: e["value"] for e in init["env"]}
    run = json.loads(init_env["RUBICK_RUN_JSON"])
    assert run["job_id"] == "j1" and run["attempt"] == 1 and run["nats_url"] == "nats://nats.rubick:4222"
    assert json.loads(init_env["RUBICK_DEEPSPEED_JSON"])["train_batch_size"] == 16


def test_pod_of_an_image_entrypoint_and_of_cpu_only_nodes():
    w = Workload(image="ghcr.io/a/b:1", args=("--epochs", "3"))
    pod = m.pod_manifest(launch(workload=w, cpus=0, mem=0.0), "n0", settings(gpu_resource=False))
    main = pod["spec"]["containers"][0]
    assert "command" not in main and main["args"] == ["--epochs", "3"]
    assert main["resources"] == {"requests": {}, "limits": {}}
    ckpt = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoint")
    assert ckpt == {"name": "checkpoint", "emptyDir": {}}


def test_images_are_required():
    with pytest.raises(ValueError, match="needs workload.image"):
        m.pod_manifest(launch(workload=Workload(command=("python", "x.py"))), "n0", settings())
    with pytest.raises(ValueError, match="--contract-image"):
        m.pod_manifest(launch(), "n0", settings(contract_image=None))


def test_service_only_from_the_first_node_of_a_multi_node_job():
    two = launch(shares=(("n0", 2), ("n1", 2)))
    assert m.service_manifest(launch(), "n0", settings()) is None
    assert m.service_manifest(two, "n1", settings()) is None
    svc = m.service_manifest(two, "n0", settings())
    assert svc["spec"]["selector"] == {m.MANAGED_BY: "rubick", m.JOB_LABEL: m.job_slug("j1"), m.ATTEMPT_LABEL: "1",
                                       m.RANK_LABEL: "0"}
    cmd = m.pod_manifest(two, "n1", settings())["spec"]["containers"][0]["command"]
    assert f"--rdzv-endpoint={svc['metadata']['name']}.jobs.svc:29400" in cmd and "--node-rank=1" in cmd


def test_contract_files_written_by_the_init_container(tmp_path):
    run = {"job_id": "j1", "attempt": 2}
    env = {"RUBICK_RUN_JSON": json.dumps(run), "RUBICK_DEEPSPEED_JSON": json.dumps({"train_batch_size": 8}),
           "RUBICK_RUN_FILE": str(tmp_path / "run.json"), "RUBICK_DEEPSPEED_CONFIG": str(tmp_path / "ds.json"),
           "RUBICK_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    assert contract_files.main(env) == 0
    assert json.loads((tmp_path / "run.json").read_text()) == run
    assert json.loads((tmp_path / "ds.json").read_text()) == {"train_batch_size": 8}
    assert (tmp_path / "ckpt").is_dir()
    assert contract_files.main({**env, "RUBICK_RUN_JSON": "[1]"}) == 2
    assert contract_files.main({}) == 2


def test_capacity_from_the_nodes_allocatable_resources():
    cap = node_capacity(node_object("n0", gpus=8, cpus="95500m", memory="1056Gi"), "n0")
    assert (cap.gpus, cap.cpus, cap.mem_gb) == (8, 95, round(1056 * 2**30 / 1e9, 1))
    assert cap.gpu_type == "NVIDIA-H100-80GB-HBM3" and cap.gpu_mem_gb == round(81559 * 2**20 / 1e9, 1)
    given = node_capacity(node_object("n0"), "n0", cpus=16, mem_gb=64.0, cpu_devices=2)
    assert (given.gpus, given.cpus, given.mem_gb, given.cpu_devices) == (2, 16, 64.0, True)
    assert node_capacity({"status": "junk"}, "n0").gpus == 0
    assert quantity("2Ki") == 2048 and quantity("1e3") == 1000 and quantity("abc") is None


def test_agent_flags(tmp_path):
    assert pod_labels(["kueue.x-k8s.io/queue-name=q", "kai.scheduler/queue=a=b"]) == {
        "kueue.x-k8s.io/queue-name": "q", "kai.scheduler/queue": "a=b"}
    with pytest.raises(ValueError):
        pod_labels(["novalue"])
    ns = tmp_path / "namespace"
    assert k8s_namespace(None, ns) == "default"
    ns.write_text("rubick-jobs\n")
    assert k8s_namespace(None, ns) == "rubick-jobs" and k8s_namespace("x", ns) == "x"
