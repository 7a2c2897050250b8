"""`rubick agent` (the node agent) and `rubick profile` (measure a model type on this machine)."""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import socket
from pathlib import Path
from typing import Any

from controlplane.cli.common import add_nats_args, fail, run_against_nats
from controlplane.bus.nats import redact_url

from .traffic import DEFAULT as TRAFFIC_DEFAULT
from .traffic import TrafficClasses, TrafficClassError, parse as parse_traffic_classes

TRAFFIC_DEFAULT_TEXT = TRAFFIC_DEFAULT.text()


def register(sub: Any) -> None:
    p = sub.add_parser("agent", help="run the node agent: register, heartbeat, carry out plan.decided")
    add_nats_args(p)
    p.add_argument("--node", default=socket.gethostname().split(".")[0], help="node name (default: host name)")
    p.add_argument("--cpu-devices", type=int, default=0, metavar="N",
                   help="no GPUs: offer N CPU worker slots as the node's devices")
    p.add_argument("--cpus", type=int, default=0, help="CPU cores offered (default: all usable)")
    p.add_argument("--mem-gb", type=float, default=0.0, help="host memory offered, GB (default: all)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="jobs' run files, logs, checkpoints (default: <data-dir>/agent-<node>)")
    p.add_argument("--reporter-creds", type=Path,
                   help="nkey seed file the node's training processes report with (default: reporter-<node>.nk "
                        "beside the agent's own)")
    p.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
    p.add_argument("--stop-timeout", type=float, default=300.0,
                   help="seconds a job gets to checkpoint and exit before it is killed")
    p.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                   help="example trainer on CPU devices: start each training process afresh instead of forking it "
                        "from torchrun once torch and DeepSpeed are imported (docs/agents.md)")
    p.add_argument("--size", default="tiny", help="example trainer: model size (tiny, small, medium)")
    p.add_argument("--seed", type=int, default=0, help="example trainer: seed")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="example trainer: also checkpoint every N iterations (0: only when asked)")
    p.add_argument("--min-iteration-s", type=float, default=0.0, metavar="S",
                   help="example trainer: the least wall time of an iteration, the rest slept outside the measured "
                        "time (0: none; on CPU devices it keeps a long job from taking every core)")
    p.add_argument("--log-level", default="info")
    t = p.add_argument_group("traffic classes", "what a job's traffic class (network.decided) sets in its training "
                             "processes' environment at launch (docs/network.md)")
    tx = t.add_mutually_exclusive_group()
    tx.add_argument("--traffic-classes", default=None, metavar="TABLE",
                    help="CLASS:sl=N,tc=N entries separated by ';' (NCCL_IB_SL 0-15, NCCL_IB_TC 0-255, class 0-7); "
                         "replaces the default table whole; a class left out sets nothing "
                         f"(default: {TRAFFIC_DEFAULT_TEXT})")
    tx.add_argument("--no-traffic-classes", action="store_true",
                    help="set nothing for traffic classes (NCCL's own defaults or the workload's env apply)")
    k = p.add_argument_group("launcher", "how the node's jobs run: local processes, or pods (Kubernetes)")
    k.add_argument("--launcher", choices=("local", "kubernetes"), default="local",
                   help="local: torchrun processes on this machine; kubernetes: one pod per job on this node "
                        "(capacity from the Node's allocatable resources unless given)")
    k.add_argument("--k8s-namespace", default=None,
                   help="namespace of the jobs' pods (default: the agent pod's own, else default)")
    k.add_argument("--kubeconfig", type=Path, default=None,
                   help="kubeconfig file (default: the in-cluster service account, else ~/.kube/config)")
    k.add_argument("--reporter-secret", default=None, metavar="NAME",
                   help="Secret whose item reporter-<node>.nk the pods' ranks report iterations with")
    k.add_argument("--pod-tls-ca-secret", default=None, metavar="NAME[:KEY]",
                   help="Secret in the jobs' namespace with the NATS server's CA (key ca.crt unless given), "
                        "for the pods' reporter")
    k.add_argument("--pod-label", action="append", default=[], metavar="KEY=VALUE",
                   help="label added to every pod (kueue.x-k8s.io/queue-name=Q, kai.scheduler/queue=Q, ...); "
                        "repeatable")
    k.add_argument("--pending-timeout", type=float, default=600.0, metavar="S",
                   help="seconds a pod may stay Pending before its launch counts as failed")
    k.add_argument("--contract-image", default=None, metavar="IMAGE",
                   help="the agent's own image: the pods' init container and the example trainer "
                        "(default: $RUBICK_IMAGE)")
    k.add_argument("--no-gpu-resource", action="store_true",
                   help="do not ask for nvidia.com/gpu (CPU-only nodes; give --cpu-devices N)")
    k.add_argument("--image-pull-secret", action="append", default=[], metavar="NAME",
                   help="imagePullSecrets of the pods; repeatable")
    k.add_argument("--pod-trainer", default=None, metavar="PATH",
                   help="the example trainer's path in the agent's image "
                        "(default: /opt/rubick/src/examples/trainer/train.py)")
    k.add_argument("--node-lost-grace", type=float, default=40.0, metavar="S",
                   help="seconds the Node may be NotReady before the agent reports node.lost")
    p.set_defaults(func=run_agent)

    from .profile import register_profile
    register_profile(sub)


def run_agent(args: argparse.Namespace) -> int:
    if args.cpu_devices < 0:
        return fail("--cpu-devices must be >= 0")
    if not (math.isfinite(args.min_iteration_s) and args.min_iteration_s >= 0):
        return fail("--min-iteration-s must be a number of seconds, 0 or more")
    try:
        traffic_classes(args)
    except TrafficClassError as exc:
        return fail(f"--traffic-classes: {exc}")
    if args.launcher == "kubernetes":
        try:
            pod_labels(args.pod_label)
        except ValueError as exc:
            return fail(str(exc))
        if args.pending_timeout <= 0 or args.node_lost_grace < 0:
            return fail("--pending-timeout must be > 0 and --node-lost-grace >= 0")
    return run_against_nats(args, _agent)


async def _agent(args: argparse.Namespace, url: str) -> int:
    from controlplane.bus.nats import JetStreamBus

    from .launcher import LocalLauncher
    from .node import discover
    from .shell import AgentShell, state_dir_for

    state_dir = args.state_dir or state_dir_for(args.data_dir, args.node)
    run_extra = {"size": args.size, "seed": args.seed, "checkpoint_every": args.checkpoint_every}
    if args.min_iteration_s > 0:
        run_extra["min_iteration_s"] = args.min_iteration_s
    credentials = agent_credentials(args)
    if args.launcher == "kubernetes":
        try:
            launcher, capacity = kubernetes_launcher(args, url, run_extra)
        except Exception as exc:  # noqa: BLE001 - no cluster, no node, no permission: say so and stop
            return fail(f"kubernetes launcher: {exc}")
        state_dir = f"pods in namespace {launcher.namespace}"
    else:
        capacity = discover(args.node, cpu_devices=args.cpu_devices or None, cpus=args.cpus or None,
                            mem_gb=args.mem_gb or None)
        launcher = LocalLauncher(state_dir, args.node, url, cpu_devices=capacity.cpu_devices, run_extra=run_extra,
                                 stop_timeout_s=args.stop_timeout, traffic_classes=traffic_classes(args),
                                 warm=args.warm_start)
        launcher.env.update(reporter_env(args, credentials))
    if capacity.gpus == 0:
        print(f"rubick agent: no GPUs found on {args.node}; use --cpu-devices N to run on the CPU", flush=True)
    bus = await JetStreamBus.connect(url, name=f"rubick-agent-{args.node}", create_stream=False,
                                     credentials=credentials)
    shell = AgentShell(bus, capacity, launcher, heartbeat_s=args.heartbeat)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        # on Kubernetes the chart's bootstrap Job makes the stream after the agents start: wait for it
        if not await bus.wait_for_stream(stop, lambda why: print(
                f"agent {args.node} waiting for the deployment's bootstrap (`rubick auth bootstrap`): {why}",
                flush=True)):
            return 0
        task = asyncio.create_task(shell.run(stop))
        ready = asyncio.create_task(shell.ready.wait())
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
        print(f"agent {args.node} ready: {capacity.gpus} {'CPU device slots' if capacity.cpu_devices else 'GPUs'}, "
              f"{capacity.cpus} CPUs, {capacity.mem_gb:g} GB | NATS {redact_url(url)} | state {state_dir}", flush=True)
        await task
    finally:
        await bus.close()
        close = getattr(launcher, "close", None)
        if close is not None:
            close()
    return 0


def traffic_classes(args: argparse.Namespace) -> TrafficClasses | None:
    """The traffic-class table of `--traffic-classes` (the default when not given; None with
    `--no-traffic-classes`). TrafficClassError naming a bad entry."""
    if getattr(args, "no_traffic_classes", False):
        return None
    text = getattr(args, "traffic_classes", None)
    return TRAFFIC_DEFAULT if text is None else parse_traffic_classes(text)


def tls_ca_settings(value: str | None) -> dict[str, str]:
    """`--pod-tls-ca-secret NAME[:KEY]` as PodSettings fields."""
    if not value:
        return {}
    name, _, key = value.partition(":")
    return {"tls_ca_secret": name, "tls_ca_key": key or "ca.crt"}


SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def pod_labels(pairs: list[str]) -> dict[str, str]:
    """--pod-label KEY=VALUE pairs; ValueError naming a malformed one."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--pod-label {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def k8s_namespace(given: str | None, sa_file: Path = SA_NAMESPACE) -> str:
    if given:
        return given
    try:
        return sa_file.read_text().strip() or "default"
    except OSError:
        return "default"


def k8s_api_client(kubeconfig: Path | None):
    """An API client: the kubeconfig given, else the in-cluster service account, else ~/.kube/config."""
    from kubernetes import client, config

    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except config.ConfigException:
        return config.new_client_from_config()


def kubernetes_launcher(args: argparse.Namespace, url: str, run_extra: dict):
    """The pods launcher of `--launcher kubernetes`, and the node's capacity from its Node object."""
    import json
    import os

    from kubernetes import client

    from .kube.capacity import node_capacity
    from .kube.launcher import KubernetesLauncher, api_reason
    from .kube.manifests import DEFAULT_TRAINER, PodSettings

    api = k8s_api_client(args.kubeconfig)
    try:
        node = json.loads(client.CoreV1Api(api).read_node(args.node, _preload_content=False,
                                                          _request_timeout=(5, 15)).data)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"reading node {args.node}: {api_reason(exc)}") from None
    capacity = node_capacity(node, args.node, cpu_devices=args.cpu_devices or None, cpus=args.cpus or None,
                             mem_gb=args.mem_gb or None)
    settings = PodSettings(namespace=k8s_namespace(args.k8s_namespace),
                           contract_image=args.contract_image or os.environ.get("RUBICK_IMAGE") or None,
                           trainer=args.pod_trainer or DEFAULT_TRAINER, nats_url=url,
                           reporter_secret=args.reporter_secret, pod_labels=pod_labels(args.pod_label),
                           **tls_ca_settings(args.pod_tls_ca_secret),
                           image_pull_secrets=tuple(args.image_pull_secret), gpu_resource=not args.no_gpu_resource,
                           run_extra=run_extra, traffic_classes=traffic_classes(args))
    launcher = KubernetesLauncher(api, args.node, settings, stop_timeout_s=args.stop_timeout,
                                  pending_timeout_s=args.pending_timeout, node_grace_s=args.node_lost_grace)
    if not settings.contract_image:
        print("rubick agent: no --contract-image (or RUBICK_IMAGE): pods cannot be launched", flush=True)
    return launcher, capacity


def agent_credentials(args: argparse.Namespace):
    """The agent's own credentials: --creds, $RUBICK_NATS_CREDS, or DATA_DIR/auth/agent-<node>.nk, created
    there (with its reporter's) when this machine holds the credentials folder of a `rubick up`."""
    from controlplane.auth import AuthStore, Identity
    from controlplane.cli.common import credentials_for
    from controlplane.endpoints import read_endpoints

    identity = Identity("agent", args.node)
    found = credentials_for(args, identity)
    endpoints = read_endpoints(args.data_dir) or {}
    if found.seed_file is None and endpoints.get("auth_dir"):
        from controlplane.auth.admin import provision
        provision(AuthStore(endpoints["auth_dir"]), [identity, Identity("reporter", args.node)], endpoints)
        print(f"rubick agent: created credentials for {identity.name} in {endpoints['auth_dir']}", flush=True)
        found = credentials_for(args, identity)
    return found


def reporter_env(args: argparse.Namespace, agent) -> dict[str, str]:
    """What the node's training processes connect with: the node's reporter identity (it may publish only
    this node's `metrics.iteration`), found beside the agent's seed file; TLS as the agent's."""
    from controlplane.auth.credentials import ENV_CREDS, ENV_TLS_CA

    env = {}
    if agent.seed_file is not None:
        reporter = Path(agent.seed_file).with_name(f"reporter-{args.node}.nk")
        if args.reporter_creds:
            reporter = Path(args.reporter_creds)
        if reporter.exists():
            env[ENV_CREDS] = str(reporter.resolve())
        else:
            print(f"rubick agent: no reporter credentials at {reporter}: training processes cannot report "
                  "iterations (give --reporter-creds)", flush=True)
    if agent.tls_ca is not None:
        env[ENV_TLS_CA] = str(Path(agent.tls_ca).resolve())
    return env
