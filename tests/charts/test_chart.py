"""charts/rubick rendered and linted by Helm's own code, every object validated against the Kubernetes schemas.

The NATS subchart is not downloaded here (no network): the value sets use an existing NATS
(`nats.enabled=false`, `nats.url`), except where the defaults themselves are under test, which render
without the subchart's objects (tests/charts/chart.py says how lint deals with it).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from controlplane.cli import build_parser

from . import chart as C
from .chart import EXTERNAL, find, merge, one, pod_specs, render

SERVICES = ("recorder", "admission", "modeler", "policy", "clock")

TLS_EXTERNAL = merge(EXTERNAL, {"nats": {"url": "tls://nats.messaging.svc:4222"},
                                "tls": {"caSecretName": "rubick-nats-ca"}})
TLS_BUNDLED = {"tls": {"secretName": "rubick-nats-tls", "caSecretName": "rubick-nats-ca"},
               "nats": {"config": {"nats": {"tls": {"enabled": True, "secretName": "rubick-nats-tls"}}}}}
FULL = merge(EXTERNAL, {
    "auth": {"agents": ["gpu-0", "gpu-1"], "reporterSecret": "train-seeds"},
    "jobs": {"namespace": "training", "kueueQueue": "team-a", "kaiQueue": "research",
             "pendingTimeoutSeconds": 600, "podLabels": {"team": "vision", "cost-center": "42"}},
    "agent": {"priorityClassName": "system-node-critical", "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
              "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]},
    "services": {"policy": {"replicas": 2, "policy": "sia", "restartCostSeconds": 30, "quotas": {"team-a": 8, "team-b": 4}},
                 "recorder": {"replicas": 2, "rollRows": 1000000, "compact": False,
                              "persistence": {"accessModes": ["ReadWriteMany"], "size": "100Gi",
                                              "storageClassName": "cephfs"}},
                 "clock": {"tickPeriodSeconds": 30}, "admission": {"replicas": 3},
                 "modeler": {"resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}},
    "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
                   "grafanaDashboard": {"enabled": True, "namespace": "monitoring"}},
})

VALUE_SETS = {
    "defaults": {},
    "external-nats": EXTERNAL,
    "no-monitoring": merge(EXTERNAL, {"monitoring": {"serviceMonitor": {"enabled": False},
                                                     "grafanaDashboard": {"enabled": False}}}),
    "monitoring": merge(EXTERNAL, {"monitoring": {"serviceMonitor": {"enabled": True},
                                                  "grafanaDashboard": {"enabled": True}}}),
    "auth-off": merge(EXTERNAL, {"auth": {"enabled": False}}),
    "auth-on": merge(EXTERNAL, {"auth": {"enabled": True, "agents": ["gpu-0"]}}),
    "tls-external": TLS_EXTERNAL,
    "tls-bundled-nats": TLS_BUNDLED,
    "full": FULL,
    "no-agent-no-bootstrap": merge(EXTERNAL, {"agent": {"enabled": False}, "bootstrap": {"enabled": False}}),
}


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Path:
    return C.with_stub(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="module")
def rendered():
    """Every value set rendered once (the chart loaded once)."""
    with C.load() as chart:
        return {name: render(values, chart=chart) for name, values in VALUE_SETS.items()}


def container(spec: dict, name: str | None = None) -> dict:
    return spec["containers"][0] if name is None else next(c for c in spec["containers"] if c["name"] == name)


def env_of(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


# -- every value set renders and every object is valid -------------------------------------------------------------

@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_value_set_renders_and_validates(rendered, name):
    objects = rendered[name]
    assert objects
    assert C.validate(objects) == []
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ServiceAccount", "PersistentVolumeClaim"} <= kinds


def test_validation_is_strict(rendered):
    """A control: an unknown field or a wrong type in a rendered object is caught."""
    dep = json.loads(json.dumps(one(rendered["external-nats"], "Deployment", "rubick-policy")))
    dep["spec"]["template"]["spec"]["containers"][0]["comand"] = ["x"]
    assert C.validate([dep])
    dep = json.loads(json.dumps(one(rendered["external-nats"], "Deployment", "rubick-policy")))
    dep["spec"]["replicas"] = "two"
    assert C.validate([dep])


def test_install_dry_run_with_full_values(stub):
    manifest = C.install_dry_run(FULL, stub)
    objects = [d for d in yaml.safe_load_all(manifest) if d]
    assert C.validate(objects) == []
    assert {o["kind"] for o in objects} >= {"DaemonSet", "Deployment", "Role", "ClusterRole", "ServiceMonitor"}


def test_install_needs_the_dependency_downloaded(stub):
    """As with `helm install`: `helm dependency build` first, even for an external NATS (docs/deploy.md)."""
    config = C.helm.Config(namespace=C.NAMESPACE, storage_driver="memory")
    try:
        with pytest.raises(Exception, match="missing in charts/ directory: nats"):
            config.install(str(C.CHART), C.RELEASE, EXTERNAL, namespace=C.NAMESPACE, dry_run="client")
    finally:
        config.close()


def test_lint_only_misses_the_nats_dependency():
    report = C.lint(EXTERNAL)
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert [m["error"] for m in serious] == ["chart directory is missing these dependencies: nats"]


@pytest.mark.parametrize("values", [{}, EXTERNAL, FULL, TLS_BUNDLED], ids=["defaults", "external", "full", "tls"])
def test_lint_clean_with_the_dependency_present(stub, values):
    report = C.lint(values, stub)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# -- NATS --------------------------------------------------------------------------------------------------------

def test_nats_url_default_is_the_subcharts_service(rendered):
    for spec_name, spec in pod_specs(rendered["defaults"]):
        assert env_of(container(spec))["RUBICK_NATS_URL"] == "nats://rubick-nats:4222", spec_name
    for spec_name, spec in pod_specs(rendered["external-nats"]):
        assert env_of(container(spec))["RUBICK_NATS_URL"] == EXTERNAL["nats"]["url"], spec_name
    objects = render({}, release="prod")
    assert env_of(container(pod_specs(objects)[0][1]))["RUBICK_NATS_URL"] == "nats://prod-nats:4222"
    objects = render({}, release="nats-rubick")
    assert env_of(container(pod_specs(objects)[0][1]))["RUBICK_NATS_URL"] == "nats://nats-rubick:4222"


def test_nats_defaults_are_a_three_server_jetstream_cluster():
    with C.load() as chart:
        values = chart.values
        deps = chart.metadata["dependencies"]
    assert deps == [{"name": "nats", "version": deps[0]["version"], "repository": "https://nats-io.github.io/k8s/helm/charts/",
                     "condition": "nats.enabled"}]
    nats = values["nats"]
    assert nats["enabled"] is True and nats["url"] == ""
    assert nats["config"]["cluster"] == {"enabled": True, "replicas": 3}
    assert nats["config"]["jetstream"]["enabled"] is True
    assert nats["config"]["jetstream"]["fileStore"]["enabled"] is True
    assert values["bootstrap"]["streamReplicas"] == nats["config"]["cluster"]["replicas"]


def test_no_nats_at_all_is_refused():
    with pytest.raises(Exception, match="set nats.url"):
        render({"nats": {"enabled": False}})


# -- the agent DaemonSet -----------------------------------------------------------------------------------------

def test_agent_daemonset_runs_on_gpu_nodes_only(rendered):
    ds = one(rendered["full"], "DaemonSet", "rubick-agent")
    spec = ds["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1
    assert terms[0]["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
    # auth.agents: only the nodes that have credentials
    assert terms[0]["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-0", "gpu-1"]}]
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                   {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"] == "rubick-agent"
    c = container(spec)
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    assert env_of(c)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert [e["name"] for e in c["env"]][0] == "NODE_NAME", "NODE_NAME must come first for $(NODE_NAME) references"

    default = one(rendered["defaults"], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"]
    assert "priorityClassName" not in default
    assert "matchFields" not in default["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]
    assert default["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def image_of(c: dict) -> str:
    """The agent's own image: its pods' init container writes the contract files with it."""
    assert c["image"].startswith("ghcr.io/") or ":" in c["image"]
    return c["image"]


def test_agent_command(rendered):
    c = container(one(rendered["full"], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"])
    assert c["command"] == ["rubick"]
    assert c["args"] == [
        "agent", "--launcher", "kubernetes", "--node", "$(NODE_NAME)", "--k8s-namespace", "training",
        "--creds", "/var/run/rubick/agents/agent-$(NODE_NAME).nk", "--reporter-secret", "train-seeds",
        "--pod-label", "kueue.x-k8s.io/queue-name=team-a", "--pod-label", "kai.scheduler/queue=research",
        "--pod-label", "cost-center=42", "--pod-label", "team=vision",
        "--pending-timeout", "600", "--contract-image", image_of(c), "--stop-timeout", "300",
        "--state-dir", "/var/lib/rubick-agent", "--data-dir", "/tmp/rubick",
        "--log-level", "warning"]
    # defaults: jobs in the release namespace, the reporter Secret named after the prefix, no queues
    c = container(one(rendered["defaults"], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"])
    args = c["args"]
    assert args[args.index("--k8s-namespace") + 1] == C.NAMESPACE
    assert args[args.index("--reporter-secret") + 1] == "rubick-auth-reporters"
    assert "--pod-label" not in args and "--pending-timeout" not in args
    # without auth: no seeds at all
    c = container(one(rendered["auth-off"], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"])
    assert "--creds" not in c["args"] and "--reporter-secret" not in c["args"]


def test_agent_args_parse_with_the_agent_cli(rendered):
    """The agent's Kubernetes flags are added beside this chart; once `rubick agent` has them, its own parser
    must accept the rendered command."""
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["agent"]
    known = {o for a in sub._actions for o in a.option_strings}
    wanted = {"--launcher", "--k8s-namespace", "--reporter-secret", "--pod-label", "--pending-timeout"}
    if not wanted <= known:
        pytest.skip(f"rubick agent lacks {sorted(wanted - known)} here")
    for name in ("full", "defaults", "auth-off"):
        args = container(one(rendered[name], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"])["args"]
        ns = parser.parse_args([a.replace("$(NODE_NAME)", "gpu-0") for a in args])
        assert ns.node == "gpu-0" and ns.launcher == "kubernetes"


# -- RBAC --------------------------------------------------------------------------------------------------------

def rules(role: dict) -> list[tuple]:
    return sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"]))) for r in role["rules"])


def test_rbac_is_least_privilege(rendered):
    objects = rendered["full"]
    role = one(objects, "Role", "rubick-agent")
    assert role["metadata"]["namespace"] == "training"
    assert rules(role) == sorted([
        (("",), ("pods",), tuple(sorted(["create", "delete", "get", "list", "watch", "patch"]))),
        (("",), ("pods/log",), ("get",)),
        (("",), ("services",), tuple(sorted(["create", "delete", "get", "list", "watch"]))),
    ])
    binding = one(objects, "RoleBinding", "rubick-agent")
    assert binding["metadata"]["namespace"] == "training"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rubick-agent"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rubick-agent", "namespace": C.NAMESPACE}]
    [cluster_role] = find(objects, "ClusterRole")
    assert rules(cluster_role) == [(("",), ("nodes",), ("get", "list", "watch"))]
    [cluster_binding] = find(objects, "ClusterRoleBinding")
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    assert cluster_binding["subjects"] == [{"kind": "ServiceAccount", "name": "rubick-agent", "namespace": C.NAMESPACE}]
    # nothing else grants anything, and only the agent is bound
    assert len(find(objects, "Role")) == 1 and len(find(objects, "RoleBinding")) == 1
    # the services have their own account, no token, no binding
    services_sa = one(objects, "ServiceAccount", "rubick-services")
    assert services_sa["automountServiceAccountToken"] is False
    for kind_name, spec in pod_specs(objects):
        if kind_name.startswith("DaemonSet"):
            assert spec["serviceAccountName"] == "rubick-agent"
        else:
            assert spec["serviceAccountName"] == "rubick-services", kind_name
            assert spec["automountServiceAccountToken"] is False, kind_name


def test_no_rbac_without_the_agent(rendered):
    objects = rendered["no-agent-no-bootstrap"]
    assert not find(objects, "DaemonSet") and not find(objects, "Job")
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    assert [o["metadata"]["name"] for o in find(objects, "ServiceAccount")] == ["rubick-services"]


# -- pods: security context, writable paths ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["defaults", "full", "auth-off", "tls-external"])
def test_every_pod_is_locked_down(rendered, name):
    specs = pod_specs(rendered[name])
    assert len(specs) >= 6
    for kind_name, spec in specs:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001, kind_name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, kind_name
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001, kind_name
            assert sc["readOnlyRootFilesystem"] is True, kind_name
            assert sc["allowPrivilegeEscalation"] is False, kind_name
            assert sc["capabilities"] == {"drop": ["ALL"]}, kind_name
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, kind_name
            assert "add" not in sc["capabilities"]
            for mount in c.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if mount.get("readOnly"):
                    assert "secret" in volume or "configMap" in volume, (kind_name, mount)
                else:  # writable: scratch or the event log
                    assert "emptyDir" in volume or "persistentVolumeClaim" in volume, (kind_name, mount)
            assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), kind_name
            assert not any("hostPath" in v for v in volumes.values()), kind_name


def test_resources_are_settable(rendered):
    spec = one(rendered["full"], "Deployment", "rubick-modeler")["spec"]["template"]["spec"]
    assert container(spec)["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}}
    spec = one(rendered["defaults"], "Deployment", "rubick-modeler")["spec"]["template"]["spec"]
    assert "resources" not in container(spec)


# -- the services ------------------------------------------------------------------------------------------------

def service_args(objects, name) -> list[str]:
    c = container(one(objects, "Deployment", f"rubick-{name}")["spec"]["template"]["spec"])
    assert c["command"] == ["rubick"]
    return c["args"]


def test_service_deployments_parse_with_the_service_cli(rendered):
    parser = build_parser()
    for value_set in ("defaults", "full"):
        objects = rendered[value_set]
        for name in SERVICES:
            args = service_args(objects, name)
            ns = parser.parse_args(args)
            assert ns.command == "service" and ns.name == name
            assert ns.metrics_port == 9464
            dep = one(objects, "Deployment", f"rubick-{name}")
            port = container(dep["spec"]["template"]["spec"])["ports"]
            assert port == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
            svc = one(objects, "Service", f"rubick-{name}")
            assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
            assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
            assert svc["spec"]["selector"] == {k: v for k, v in dep["spec"]["template"]["metadata"]["labels"].items()
                                               if k in svc["spec"]["selector"]}
    full = {name: parser.parse_args(service_args(rendered["full"], name)) for name in SERVICES}
    assert str(full["recorder"].log_dir) == "/var/lib/rubick/events"
    assert full["recorder"].roll_rows == 1000000
    assert full["recorder"].compact is False  # services.recorder.compact: false
    assert parser.parse_args(service_args(rendered["defaults"], "recorder")).compact is True
    assert full["policy"].policy == "sia" and full["policy"].restart_cost == 30
    assert str(full["policy"].quotas) == "/etc/rubick/quotas.yaml"
    assert full["clock"].tick_period == 30
    default_policy = parser.parse_args(service_args(rendered["defaults"], "policy"))
    assert default_policy.quotas is None and default_policy.policy == "rubick"


def test_replicas(rendered):
    objects = rendered["full"]
    replicas = {n: one(objects, "Deployment", f"rubick-{n}")["spec"]["replicas"] for n in SERVICES}
    assert replicas == {"recorder": 2, "admission": 3, "modeler": 1, "policy": 2, "clock": 1}


def test_policy_quotas_configmap(rendered, tmp_path):
    from controlplane.cli.service import read_quotas

    objects = rendered["full"]
    cm = one(objects, "ConfigMap", "rubick-quotas")
    path = tmp_path / "quotas.yaml"
    path.write_text(cm["data"]["quotas.yaml"])
    assert read_quotas(path) == {"team-a": 8, "team-b": 4}
    spec = one(objects, "Deployment", "rubick-policy")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(spec)["volumeMounts"]}
    assert mounts["quotas"]["mountPath"] == "/etc/rubick" and mounts["quotas"]["readOnly"] is True
    assert {v["name"]: v for v in spec["volumes"]}["quotas"]["configMap"]["name"] == "rubick-quotas"
    assert not find(rendered["defaults"], "ConfigMap", "rubick-quotas")


def test_event_log_on_a_pvc(rendered):
    pvc = one(rendered["defaults"], "PersistentVolumeClaim", "rubick-events")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert "storageClassName" not in pvc["spec"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    dep = one(rendered["defaults"], "Deployment", "rubick-recorder")
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    spec = dep["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(spec)["volumeMounts"]}
    assert mounts["events"] == "/var/lib/rubick/events"
    assert {v["name"]: v for v in spec["volumes"]}["events"] == {"name": "events",
                                                                 "persistentVolumeClaim": {"claimName": "rubick-events"}}
    # RWX: several recorders share the folder, rolling updates are fine
    full = rendered["full"]
    pvc = one(full, "PersistentVolumeClaim", "rubick-events")
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "cephfs",
                           "resources": {"requests": {"storage": "100Gi"}}}
    assert "strategy" not in one(full, "Deployment", "rubick-recorder")["spec"]
    # an existing claim: no PVC rendered, that claim mounted
    objects = render(merge(EXTERNAL, {"services": {"recorder": {"persistence": {"existingClaim": "old-log"}}}}))
    assert not find(objects, "PersistentVolumeClaim")
    spec = one(objects, "Deployment", "rubick-recorder")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in spec["volumes"]}["events"]["persistentVolumeClaim"] == {"claimName": "old-log"}


def test_bootstrap_job(rendered):
    job = one(rendered["defaults"], "Job", "rubick-bootstrap")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    c = container(job["spec"]["template"]["spec"])
    ns = build_parser().parse_args(c["args"])
    assert (ns.command, ns.auth_command, ns.replicas) == ("auth", "bootstrap", 3)
    assert env_of(c)["RUBICK_NATS_CREDS"] == "/var/run/rubick/creds.nk"
    volume = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}["creds"]
    assert volume["secret"]["secretName"] == "rubick-auth-admin"
    assert volume["secret"]["items"] == [{"key": "admin.nk", "path": "creds.nk"}]
    replicas = render(merge(EXTERNAL, {"bootstrap": {"streamReplicas": 1}}))
    c = container(one(replicas, "Job", "rubick-bootstrap")["spec"]["template"]["spec"])
    assert build_parser().parse_args(c["args"]).replicas == 1


# -- auth and TLS wiring -----------------------------------------------------------------------------------------

def test_each_component_mounts_only_its_own_seed(rendered):
    objects = rendered["auth-on"]
    for name in SERVICES:
        spec = one(objects, "Deployment", f"rubick-{name}")["spec"]["template"]["spec"]
        c = container(spec)
        assert env_of(c)["RUBICK_NATS_CREDS"] == "/var/run/rubick/creds.nk"
        mount = next(m for m in c["volumeMounts"] if m["name"] == "creds")
        assert mount == {"name": "creds", "mountPath": "/var/run/rubick", "readOnly": True}
        secret = {v["name"]: v for v in spec["volumes"]}["creds"]["secret"]
        assert secret["secretName"] == f"rubick-auth-{name}"
        assert secret["items"] == [{"key": f"{name}.nk", "path": "creds.nk"}]
    spec = one(objects, "DaemonSet", "rubick-agent")["spec"]["template"]["spec"]
    mount = next(m for m in container(spec)["volumeMounts"] if m["name"] == "agent-creds")
    assert mount == {"name": "agent-creds", "mountPath": "/var/run/rubick/agents", "readOnly": True}
    assert {v["name"]: v for v in spec["volumes"]}["agent-creds"]["secret"]["secretName"] == "rubick-auth-agents"


def test_auth_off_mounts_no_seed(rendered):
    for kind_name, spec in pod_specs(rendered["auth-off"]):
        assert "RUBICK_NATS_CREDS" not in env_of(container(spec)), kind_name
        assert not [v for v in spec["volumes"] if "secret" in v], kind_name


def test_tls_ca_in_every_component(rendered):
    for value_set, url in (("tls-external", "tls://nats.messaging.svc:4222"), ("tls-bundled-nats", "tls://rubick-nats:4222")):
        for kind_name, spec in pod_specs(rendered[value_set]):
            c = container(spec)
            env = env_of(c)
            assert env["RUBICK_NATS_TLS_CA"] == "/var/run/rubick-tls/ca.crt", kind_name
            assert env["RUBICK_NATS_URL"] == url
            assert {"name": "tls-ca", "mountPath": "/var/run/rubick-tls", "readOnly": True} in c["volumeMounts"]
            volume = {v["name"]: v for v in spec["volumes"]}["tls-ca"]["secret"]
            assert volume["secretName"] == "rubick-nats-ca" and volume["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    for kind_name, spec in pod_specs(rendered["defaults"]):
        assert "RUBICK_NATS_TLS_CA" not in env_of(container(spec))
    # the training pods' reporters trust the same CA (its Secret in the jobs' namespace)
    args = container(one(rendered["tls-external"], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"])["args"]
    assert args[args.index("--pod-tls-ca-secret") + 1] == "rubick-nats-ca:ca.crt"
    args = container(one(rendered["defaults"], "DaemonSet", "rubick-agent")["spec"]["template"]["spec"])["args"]
    assert "--pod-tls-ca-secret" not in args


def test_tls_secret_must_reach_the_nats_chart():
    with pytest.raises(Exception, match="nats.config.nats.tls.secretName"):
        render({"tls": {"secretName": "rubick-nats-tls", "caSecretName": "ca"}})


# -- monitoring --------------------------------------------------------------------------------------------------

def test_service_monitor(rendered):
    assert not find(rendered["no-monitoring"], "ServiceMonitor")
    assert not find(rendered["defaults"], "ServiceMonitor")
    [sm] = find(rendered["full"], "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    spec = sm["spec"]
    assert set(spec) == {"namespaceSelector", "selector", "endpoints"}
    assert spec["namespaceSelector"] == {"matchNames": [C.NAMESPACE]}
    assert spec["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    selector = spec["selector"]
    selected = [s for s in find(rendered["full"], "Service")
                if all(s["metadata"]["labels"].get(k) == v for k, v in selector["matchLabels"].items())
                and s["metadata"]["labels"]["app.kubernetes.io/component"] in selector["matchExpressions"][0]["values"]]
    assert sorted(s["metadata"]["name"] for s in selected) == sorted(f"rubick-{n}" for n in SERVICES)
    assert all(any(p["name"] == "metrics" for p in s["spec"]["ports"]) for s in selected)


def test_grafana_dashboard_uses_the_exported_metrics(rendered):
    from prometheus_client import generate_latest

    from controlplane import metrics

    assert not find(rendered["no-monitoring"], "ConfigMap", "rubick-dashboard")
    cm = one(rendered["full"], "ConfigMap", "rubick-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    dashboard = json.loads(cm["data"]["rubick.json"])
    assert dashboard == json.loads((C.CHART / "dashboards" / "rubick.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 10
    used = {m for e in exprs for m in re.findall(r"\b(rubick_[a-z_]+)\b", e)}
    # what the services export: the series names of the registry's families (tests/charts/test_dashboard.py
    # checks each query's metrics and labels in full)
    from .test_dashboard import exported
    exposed = set(exported())
    assert used and used <= exposed, used - exposed
    metrics.MESSAGES_IN.labels("policy", "job.submitted").inc(0)  # the exposition names series as `exported` does
    metrics.HANDLER_SECONDS.labels("policy").observe(0)
    series = set(re.findall(r"^(rubick_[a-z_]+)[{ ]", generate_latest(metrics.REGISTRY).decode(), re.M))
    assert series <= exposed and {"rubick_messages_in_total", "rubick_handler_seconds_bucket"} <= series
    families = {"rubick_messages_in", "rubick_messages_out", "rubick_messages_rejected", "rubick_handler_seconds",
                "rubick_consumer_lag", "rubick_recorder_rows", "rubick_recorder_bytes", "rubick_recorder_files"}
    assert {f for f in families if any(u.startswith(f) for u in used)} == families


# -- the values schema -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"services": {"policy": {"replicas": "two"}}}, r"/services/policy/replicas.*got string, want integer"),
    ({"services": {"policy": {"replica": 2}}}, r"additional properties 'replica' not allowed"),
    ({"agent": {"priorityClass": "high"}}, r"additional properties 'priorityClass' not allowed"),
    ({"services": {"policy": {"policy": "fifo"}}}, r"/services/policy/policy.*value must be one of"),
    ({"services": {"recorder": {"replicas": -1}}}, r"/services/recorder/replicas.*minimum"),
    ({"jobs": {"podLabels": {"team": 3}}}, r"/jobs/podLabels/team.*want string"),
    ({"auth": {"enabled": "yes"}}, r"/auth/enabled.*want boolean"),
    ({"services": {"recorder": {"compact": "no"}}}, r"/services/recorder/compact.*want boolean"),
    ({"bogus": 1}, r"additional properties 'bogus' not allowed"),
    ({"nats": {"url": "http://nats:4222"}}, r"/nats/url"),
])
def test_schema_refuses(stub, values, message):
    values = merge(EXTERNAL, values)
    with pytest.raises(Exception, match=message) as render_error:
        render(values)
    assert "schema" in str(render_error.value)
    with pytest.raises(Exception, match=message):
        C.install_dry_run(values, stub)


def test_defaults_satisfy_the_schema():
    with C.load() as chart:
        chart.validate_schema(chart.values)
        chart.validate_schema(FULL)
    schema = json.loads((C.CHART / "values.schema.json").read_text())

    def closed(node, where):
        if node.get("type") == "object" and "properties" in node and where != "nats":
            assert node.get("additionalProperties") is False, where
        for key, child in node.get("properties", {}).items():
            closed(child, f"{where}.{key}".lstrip("."))
    closed(schema, "")


# -- docs --------------------------------------------------------------------------------------------------------

def leaf_values(values: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in ("nats.config",):
            out += leaf_values(value, path + ".")
        else:
            out.append(path)
    return out


def test_every_value_is_documented():
    doc = (C.CHART.parents[1] / "docs" / "deploy.md").read_text()
    with C.load() as chart:
        keys = leaf_values(chart.values)
    missing = [k for k in keys if f"`{k}`" not in doc]
    assert not missing, missing


def test_notes_name_the_nats_url():
    assert "nats://rubick-nats:4222" in C.notes({})
    assert "auth.enabled=false" in C.notes({"auth": {"enabled": False}})


def test_args_are_plain_strings(rendered):
    """Every argument is a string a shell would pass unchanged (no YAML numbers, no templating left)."""
    for kind_name, spec in pod_specs(rendered["full"]):
        for c in spec["containers"]:
            assert all(isinstance(a, str) and "{{" not in a for a in c["args"]), kind_name
            assert shlex.split(shlex.join(c["args"])) == c["args"]


@pytest.mark.parametrize("name", ["full", "auth-off", "tls-bundled-nats"])
def test_rendered_text_is_tidy(name):
    """No line of the rendered manifests ends in blanks (what an empty optional block would leave)."""
    with C.load() as chart:
        manifests = chart.render(VALUE_SETS[name], name=C.RELEASE, namespace=C.NAMESPACE, is_install=True)
    untidy = [(path, n) for path, text in manifests.items() for n, line in enumerate(text.splitlines(), 1)
              if line != line.rstrip()]
    assert untidy == []
