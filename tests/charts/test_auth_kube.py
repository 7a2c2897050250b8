"""`rubick auth kube`: Secrets and chart values from a real credentials folder (`rubick auth init`), and the
chart wired to exactly those Secrets."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml

from controlplane.auth import AuthStore
from controlplane.cli import main

from . import chart as C
from .chart import EXTERNAL, find, merge, pod_specs

SERVICE_IDENTITIES = ("admin", "recorder", "admission", "clock", "modeler", "policy", "submitter")
NODES = ("gpu-0", "gpu-1", "dgx-a100-7")


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kube") / "creds"
    assert main(["auth", "init", "--dir", str(folder), "--agents", *NODES]) == 0
    return folder


@pytest.fixture(scope="module")
def printed(creds, tmp_path_factory):
    import contextlib
    import io

    values_file = tmp_path_factory.mktemp("values") / "auth-values.yaml"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["auth", "kube", "--dir", str(creds), "--namespace", "rubick", "--jobs-namespace", "training",
                     "--values", str(values_file)])
    assert code == 0
    return out.getvalue(), yaml.safe_load(values_file.read_text())


def secrets_of(text: str) -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert all(d["kind"] == "Secret" and d["apiVersion"] == "v1" for d in docs)
    return {d["metadata"]["name"]: d for d in docs}


def test_one_secret_per_service_identity(creds, printed):
    text, _ = printed
    secrets = secrets_of(text)
    store = AuthStore(creds)
    assert sorted(secrets) == sorted([f"rubick-auth-{i}" for i in SERVICE_IDENTITIES]
                                     + ["rubick-auth-agents", "rubick-auth-reporters"])
    for identity in SERVICE_IDENTITIES:
        secret = secrets[f"rubick-auth-{identity}"]
        assert secret["metadata"]["namespace"] == "rubick"
        assert secret["type"] == "Opaque"
        # exactly its own seed, byte for byte the file's
        assert secret["stringData"] == {f"{identity}.nk": (creds / f"{identity}.nk").read_text()}
        assert store.users()[identity] == _public(secret["stringData"][f"{identity}.nk"])


def test_agent_and_reporter_seeds(creds, printed):
    secrets = secrets_of(printed[0])
    agents = secrets["rubick-auth-agents"]
    assert agents["metadata"]["namespace"] == "rubick"
    assert agents["stringData"] == {f"agent-{n}.nk": (creds / f"agent-{n}.nk").read_text() for n in NODES}
    reporters = secrets["rubick-auth-reporters"]
    assert reporters["metadata"]["namespace"] == "training"
    assert reporters["stringData"] == {f"reporter-{n}.nk": (creds / f"reporter-{n}.nk").read_text() for n in NODES}
    # no seed is printed twice, and no Secret holds another one's
    seeds = [v for s in secrets.values() for v in s["stringData"].values()]
    assert len(seeds) == len(set(seeds)) == len(SERVICE_IDENTITIES) + 2 * len(NODES)


def test_secrets_are_valid_kubernetes_objects(printed):
    for secret in secrets_of(printed[0]).values():
        kubernetes_validate.validate(secret, C.KUBE_VERSION, strict=True)


def test_values_snippet(creds, printed):
    text, values = printed
    store = AuthStore(creds)
    assert values["auth"] == {"enabled": True, "secretPrefix": "rubick-auth", "agents": sorted(NODES),
                              "reporterSecret": "rubick-auth-reporters"}
    users = values["nats"]["config"]["merge"]["authorization"]["users"]
    assert sorted(u["nkey"] for u in users) == sorted(store.users().values())
    # the same block `rubick auth init` wrote for nats-server
    conf = (creds / "server.conf").read_text()
    block = json.loads(re.search(r"authorization: (\{.*\})", conf, re.S).group(1))
    assert values["nats"]["config"]["merge"]["authorization"] == block
    # no secret in the values, and the comment block is the same snippet
    dumped = yaml.safe_dump(values)
    assert not [f for f in creds.glob("*.nk") if f.read_text().strip() in dumped]
    commented = "\n".join(line[4:] for line in text.splitlines() if line.startswith("#   "))
    assert yaml.safe_load(commented) == values


def test_chart_uses_exactly_the_printed_secrets(printed):
    """Render the chart with the printed values: every Secret it mounts exists with the keys it reads."""
    text, values = printed
    secrets = secrets_of(text)
    objects = C.render(merge(merge(EXTERNAL, values), {"jobs": {"namespace": "training"}}))
    assert C.validate(objects) == []
    used = 0
    for kind_name, spec in pod_specs(objects):
        for volume in spec["volumes"]:
            secret = volume.get("secret")
            if not secret:
                continue
            assert secret["secretName"] in secrets, (kind_name, secret["secretName"])
            held = secrets[secret["secretName"]]
            assert held["metadata"]["namespace"] == C.NAMESPACE
            for item in secret.get("items", []):
                assert item["key"] in held["stringData"], (kind_name, item)
            used += 1
    assert used == 5 + 1 + 1  # five services, the bootstrap Job, the agents
    [ds] = find(objects, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    reporter = args[args.index("--reporter-secret") + 1]
    assert secrets[reporter]["metadata"]["namespace"] == "training"
    creds_path = args[args.index("--creds") + 1]
    for node in NODES:  # each node's pod finds its own seed in the mounted Secret
        key = creds_path.replace("$(NODE_NAME)", node).rsplit("/", 1)[1]
        assert key in secrets["rubick-auth-agents"]["stringData"]
    fields = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert fields["matchFields"][0]["values"] == sorted(NODES)


def test_prefix_and_default_jobs_namespace(creds, capsys):
    assert main(["auth", "kube", "--dir", str(creds), "--namespace", "ml", "--prefix", "prod"]) == 0
    secrets = secrets_of(capsys.readouterr().out)
    assert "prod-policy" in secrets and "prod-agents" in secrets
    assert {s["metadata"]["namespace"] for s in secrets.values()} == {"ml"}


def test_refusals(tmp_path, creds, capsys):
    assert main(["auth", "kube", "--dir", str(tmp_path / "none"), "--namespace", "rubick"]) == 2
    assert "rubick auth init" in capsys.readouterr().err
    assert main(["auth", "kube", "--dir", str(creds), "--namespace", "Not_A_Namespace"]) == 2
    assert "not a valid Kubernetes name" in capsys.readouterr().err
    broken = tmp_path / "broken"
    assert main(["auth", "init", "--dir", str(broken)]) == 0
    (broken / "policy.nk").unlink()
    capsys.readouterr()
    assert main(["auth", "kube", "--dir", str(broken), "--namespace", "rubick"]) == 2
    assert "policy" in capsys.readouterr().err


def _public(seed: str) -> str:
    from controlplane.auth.store import public_key

    return public_key(seed.encode())
