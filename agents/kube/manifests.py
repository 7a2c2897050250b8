"""A job's pod and rendezvous Service, from a `Launch` (pure: no API calls, no clock).

One pod per node share of a decision, pinned to the decided node by required node affinity on the
node's name (`matchFields metadata.name In [node]`, not `nodeName`: the scheduler, Kueue or KAI still
admit and bind it), requests = limits = the share. The training contract (`agents.contract`) lives in an
emptyDir at /var/run/rubick that an init container (`agents.kube.contract_files`, the agent's own image)
fills with the run file and the DeepSpeed configuration; the stop request is the pod annotation
`rubick.io/stop`, seen through a downward-API file; the first iteration makes the pod Ready (a probe on
the ready file); the final status is the container's termination message. The job's traffic class is in
the ranks' environment (`agents.traffic`; the workload's own env wins).

Names: Kubernetes wants lower-case DNS labels of at most 63 characters, and job ids may hold capitals,
dots and underscores. A job's name part is its id in lower case with the rest turned to dashes, cut to
fit, plus a hash of the exact id (two ids that read alike stay apart); the exact id, plan and allocation
travel in annotations, which is what `find()` reads back.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from controlplane.events.schema import to_plain

from .. import contract
from ..core import Launch
from ..plan_config import PlanError, torchrun_args, torchrun_env
from ..traffic import DEFAULT as DEFAULT_TRAFFIC_CLASSES
from ..traffic import TrafficClasses, traffic_env

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "rubick"
JOB_LABEL, ATTEMPT_LABEL, NODE_LABEL, RANK_LABEL = "rubick.io/job", "rubick.io/attempt", "rubick.io/node", \
    "rubick.io/node-rank"
JOB_ID_ANN, ATTEMPT_ANN, NODE_ANN = "rubick.io/job-id", "rubick.io/attempt", "rubick.io/node"
PLAN_ANN, ALLOCATION_ANN = "rubick.io/plan", "rubick.io/allocation"
DEVICES_ANN, CORES_ANN = "rubick.io/devices", "rubick.io/cpu-cores"
STOP_ANN = contract.STOP_ANNOTATION

CONTRACT_DIR = "/var/run/rubick"
PODINFO_DIR = "/etc/rubick/podinfo"
CREDS_DIR = f"{CONTRACT_DIR}/creds"
TLS_DIR = f"{CONTRACT_DIR}/tls"
CHECKPOINT_MOUNT = f"{CONTRACT_DIR}/checkpoint"
TERMINATION_LOG = "/dev/termination-log"
RDZV_PORT = 29400
TRAIN, INIT = "train", "contract"
TORCHRUN_ARGS_ENV = "RUBICK_TORCHRUN_ARGS"
"""How the ranks are to be started (space-separated torchrun arguments), for an image whose entrypoint
starts torchrun itself (a workload with no command)."""
CREDS_ENV = "RUBICK_NATS_CREDS"
TLS_CA_ENV = "RUBICK_NATS_TLS_CA"
DEFAULT_TRAINER = "/opt/rubick/src/examples/trainer/train.py"
"""The example trainer in the agent's image (the Dockerfile installs the repository at /opt/rubick/src)."""
FATAL_WAITING = ("InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError")
"""Waiting reasons that no amount of waiting cures: the launch failed."""

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


@dataclass(frozen=True)
class PodSettings:
    """What the agent's flags say about the pods it creates."""

    namespace: str = "default"
    contract_image: str | None = None
    """The agent's own image: the init container, and the example trainer of jobs without a workload."""
    trainer: str = DEFAULT_TRAINER
    nats_url: str | None = None
    reporter_secret: str | None = None
    """Secret holding `reporter-<node>.nk` per node: mounted as the ranks' NATS credentials."""
    tls_ca_secret: str | None = None
    """Secret (in the jobs' namespace) holding the CA of the NATS server's certificate, key `tls_ca_key`:
    mounted for the ranks' reporter (`RUBICK_NATS_TLS_CA`)."""
    tls_ca_key: str = "ca.crt"
    pod_labels: dict[str, str] = field(default_factory=dict)
    """Added to every pod (queue labels of Kueue or KAI, cost centres, ...)."""
    image_pull_secrets: tuple[str, ...] = ()
    gpu_resource: bool = True
    """Ask for `nvidia.com/gpu` (off for CPU-only test nodes)."""
    run_extra: dict[str, Any] = field(default_factory=dict)
    """Added to every run file (the example trainer's size, seed, ...)."""
    termination_grace_s: int = 60
    """How long a deleted pod's ranks get to checkpoint after SIGTERM."""
    traffic_classes: TrafficClasses | None = DEFAULT_TRAFFIC_CLASSES
    """What a job's traffic class sets in its ranks' environment (`agents.traffic`; None: nothing)."""


def _hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _dns(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def job_slug(job_id: str, room: int = 63) -> str:
    """A DNS-1123 label (starting with a letter, so also a valid Service name) naming the job, unique per
    exact id: lower case, other characters as dashes, cut to `room` with an 8-hex hash of the id."""
    head = _dns(job_id)
    if not head[:1].isalpha():
        head = ("j-" + head).rstrip("-")
    head = head[:max(1, room - 9)].rstrip("-")
    return f"{head}-{_hash(job_id)}"


def label_value(text: str) -> str:
    """`text` when it is a valid label value, else a cut, cleaned copy with a hash of the original."""
    if _LABEL_VALUE.fullmatch(text) and len(text) <= 63:
        return text
    head = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:54].strip("-_.")
    return f"{head}-{_hash(text)}" if head else _hash(text)


def pod_base(job_id: str, attempt: int) -> str:
    """Name shared by an attempt's pods and Service: `<job>-<hash>-a<attempt>`; leaves room for
    `-rdzv` and `-<rank>` within 63 characters."""
    suffix = f"-a{attempt}"
    return job_slug(job_id, 63 - len(suffix) - 5) + suffix


def pod_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{pod_base(job_id, attempt)}-{rank}"


def service_name(job_id: str, attempt: int) -> str:
    return f"{pod_base(job_id, attempt)}-rdzv"


def node_selector(node: str) -> str:
    """The label selector of the pods this launcher manages on `node`."""
    return f"{MANAGED_BY}={MANAGER},{NODE_LABEL}={label_value(node)}"


def node_labels(node: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, NODE_LABEL: label_value(node)}


def gpu_nodes(a: Launch) -> list[str]:
    return [s.node for s in a.allocation if s.gpus > 0]


def node_rank(a: Launch, node: str) -> int:
    nodes = gpu_nodes(a)
    if node not in nodes:
        raise PlanError(f"node {node} has no devices in the allocation")
    return nodes.index(node)


def pod_files(checkpoint_dir: str = CHECKPOINT_MOUNT) -> contract.Files:
    """Where the contract's files are inside the pod."""
    return contract.Files(run_file=f"{CONTRACT_DIR}/run.json", deepspeed_config=f"{CONTRACT_DIR}/deepspeed.json",
                          checkpoint_dir=checkpoint_dir, status_file=f"{CONTRACT_DIR}/status.json",
                          ready_file=f"{CONTRACT_DIR}/ready", podinfo=f"{PODINFO_DIR}/annotations",
                          termination_log=TERMINATION_LOG)


def rdzv_host(a: Launch, namespace: str) -> str | None:
    """The first node's rendezvous address of a multi-node job (None: one node, loopback)."""
    if len(gpu_nodes(a)) < 2:
        return None
    return f"{service_name(a.job.job_id, a.attempt)}.{namespace}.svc"


def labels(a: Launch, node: str, settings: PodSettings) -> dict[str, str]:
    out = {k: v for k, v in settings.pod_labels.items()}
    out.update({MANAGED_BY: MANAGER, JOB_LABEL: job_slug(a.job.job_id), ATTEMPT_LABEL: str(a.attempt),
                NODE_LABEL: label_value(node), RANK_LABEL: str(node_rank(a, node))})
    return out


def annotations(a: Launch, node: str) -> dict[str, str]:
    def js(x: Any) -> str:
        return json.dumps(x, sort_keys=True, separators=(",", ":"))
    return {JOB_ID_ANN: a.job.job_id, ATTEMPT_ANN: str(a.attempt), NODE_ANN: node,
            PLAN_ANN: js(to_plain(a.plan)), ALLOCATION_ANN: js([to_plain(s) for s in a.allocation]),
            DEVICES_ANN: js(list(a.devices)), CORES_ANN: js(list(a.cpu_cores))}


def _env(pairs: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
             "seccompProfile": {"type": "RuntimeDefault"}}


def pod_manifest(a: Launch, node: str, settings: PodSettings) -> dict[str, Any]:
    """The pod of `node`'s share of the launch. PlanError when the plan cannot be launched, ValueError when
    an image is missing."""
    workload = a.job.workload
    if workload is not None and not workload.image:
        raise ValueError("the Kubernetes launcher runs a workload in its container image, and this job "
                         "needs workload.image")
    if not settings.contract_image:
        raise ValueError("the Kubernetes launcher needs the agent's image for the pods' init container "
                         "(--contract-image or RUBICK_IMAGE)")
    share = next((s for s in a.allocation if s.node == node), None)
    if share is None or share.gpus <= 0:
        raise PlanError(f"node {node} has no devices in the allocation")
    rank = node_rank(a, node)
    targs = torchrun_args(a.job.job_id, a.allocation, node, rdzv_host=rdzv_host(a, settings.namespace),
                          rdzv_port=RDZV_PORT)
    pvc = workload.checkpoint.pvc if workload and workload.checkpoint else None
    files = pod_files()
    run = contract.run_record(a.job.job_id, a.job.model_type, a.plan, a.allocation, a.share, node, a.attempt,
                              a.job.global_batch_size, a.job.target_iterations, settings.nats_url, CONTRACT_DIR,
                              **settings.run_extra)
    ds = contract.deepspeed_file_content(run)  # PlanError when the plan has none
    env: dict[str, str] = traffic_env(settings.traffic_classes, a.traffic_class)
    if workload is not None:
        env.update(workload.env)  # the workload's own values win over the traffic class's
    env.update(torchrun_env(a.allocation))
    env["OMP_NUM_THREADS"] = str(max(1, (share.cpus or 1) // max(1, share.gpus)))
    env.update(contract.contract_env(run, files, 0))  # pods live on without their agent: no lease
    env[TORCHRUN_ARGS_ENV] = " ".join(targs)
    mounts = [{"name": "rubick", "mountPath": CONTRACT_DIR},
              {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
              {"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT},
              {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": "rubick", "emptyDir": {}},
        {"name": "podinfo", "downwardAPI": {"items": [{"path": "annotations",
                                                       "fieldRef": {"fieldPath": "metadata.annotations"}}]}},
        {"name": "checkpoint", **({"persistentVolumeClaim": {"claimName": pvc}} if pvc else {"emptyDir": {}})},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if settings.reporter_secret:
        env[CREDS_ENV] = f"{CREDS_DIR}/creds.nk"
        mounts.append({"name": "creds", "mountPath": CREDS_DIR, "readOnly": True})
        volumes.append({"name": "creds", "secret": {"secretName": settings.reporter_secret, "defaultMode": 0o440,
                                                    "items": [{"key": f"reporter-{node}.nk", "path": "creds.nk"}]}})
    if settings.tls_ca_secret:
        env[TLS_CA_ENV] = f"{TLS_DIR}/ca.crt"
        mounts.append({"name": "nats-ca", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append({"name": "nats-ca", "secret": {"secretName": settings.tls_ca_secret, "defaultMode": 0o444,
                                                      "items": [{"key": settings.tls_ca_key, "path": "ca.crt"}]}})
    main: dict[str, Any] = {"name": TRAIN}
    if workload is not None:
        main["image"] = workload.image
        if workload.command:
            main["command"] = ["torchrun", *targs, "--no-python", *workload.command]
            if workload.args:
                main["args"] = list(workload.args)
        elif workload.args:
            main["args"] = list(workload.args)
        if workload.working_dir:
            main["workingDir"] = workload.working_dir
    else:
        app = str(PurePosixPath(settings.trainer).parents[2])
        main["image"] = settings.contract_image
        main["command"] = ["torchrun", *targs, settings.trainer, files.run_file]
        main["workingDir"] = app
        env["PYTHONPATH"] = app
    resources: dict[str, str] = {}
    if settings.gpu_resource:
        resources["nvidia.com/gpu"] = str(share.gpus)
    if share.cpus > 0:
        resources["cpu"] = str(share.cpus)
    if share.mem_gb > 0:
        resources["memory"] = f"{share.mem_gb:g}G"
    main.update({
        "env": _env(env),
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "volumeMounts": mounts,
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT}] if rank == 0 and len(gpu_nodes(a)) > 1 else [],
        "readinessProbe": {"exec": {"command": ["test", "-e", files.ready_file]},
                           "periodSeconds": 2, "failureThreshold": 1},
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": dict(_SECURITY),
    })
    if not main["ports"]:
        del main["ports"]
    from .contract_files import DEEPSPEED_JSON, RUN_JSON
    init = {"name": INIT, "image": settings.contract_image,
            "command": ["python", "-m", "agents.kube.contract_files"],
            "env": _env({RUN_JSON: json.dumps(run, sort_keys=True), DEEPSPEED_JSON: json.dumps(ds, sort_keys=True),
                         contract.RUN_FILE: files.run_file, contract.DEEPSPEED_CONFIG: files.deepspeed_config,
                         contract.CHECKPOINT_DIR: files.checkpoint_dir}),
            "volumeMounts": [{"name": "rubick", "mountPath": CONTRACT_DIR},
                             {"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT}],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "256Mi"}},
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": dict(_SECURITY)}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.termination_grace_s,
        "initContainers": [init],
        "containers": [main],
        "volumes": volumes,
    }
    if settings.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(a.job.job_id, a.attempt, rank), "namespace": settings.namespace,
                         "labels": labels(a, node, settings), "annotations": annotations(a, node)},
            "spec": spec}


def service_manifest(a: Launch, node: str, settings: PodSettings) -> dict[str, Any] | None:
    """The headless rendezvous Service of a multi-node job, made by its first node's agent (None
    otherwise): its name resolves to the node-rank-0 pod, Ready or not."""
    nodes = gpu_nodes(a)
    if len(nodes) < 2 or nodes[0] != node:
        return None
    selector = {MANAGED_BY: MANAGER, JOB_LABEL: job_slug(a.job.job_id), ATTEMPT_LABEL: str(a.attempt),
                RANK_LABEL: "0"}
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service_name(a.job.job_id, a.attempt), "namespace": settings.namespace,
                         "labels": {MANAGED_BY: MANAGER, JOB_LABEL: job_slug(a.job.job_id),
                                    ATTEMPT_LABEL: str(a.attempt), NODE_LABEL: label_value(node)},
                         "annotations": {JOB_ID_ANN: a.job.job_id, ATTEMPT_ANN: str(a.attempt)}},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                     "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}]}}
