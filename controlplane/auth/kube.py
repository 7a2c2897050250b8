"""Kubernetes Secrets (and the chart's values) from a credentials folder made by `rubick auth init`.

    rubick auth init --dir creds --agents gpu-0 gpu-1
    rubick auth kube --dir creds --namespace rubick --jobs-namespace training | kubectl apply -f -

What it prints, for the Helm chart (charts/rubick, docs/deploy.md):

- `<prefix>-<identity>` in the release namespace, key `<identity>.nk`, for admin, the five services and
  each submitter: one Secret per identity, so a Deployment mounts only its own seed;
- `<prefix>-agents` in the release namespace: `agent-<node>.nk` for every node (the agent DaemonSet mounts
  it and each pod picks its node's seed);
- `<prefix>-reporters` in the jobs' namespace: `reporter-<node>.nk` (the training pods' identities);
- as YAML comments, the values to give the chart: `auth.agents` and the NATS server's `authorization`
  block (public keys and permissions only) under `nats.config.merge`. `values()` returns the same as a
  mapping, for `--values FILE`.

Seeds go in `stringData` exactly as the files hold them. Nothing here talks to a cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from .roles import Identity, permissions
from .store import AuthError, AuthStore

DEFAULT_PREFIX = "rubick-auth"
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def _check_name(kind: str, name: str, limit: int = 253) -> str:
    if not _DNS_NAME.match(name) or len(name) > limit:
        raise AuthError(f"{kind} {name!r} is not a valid Kubernetes name (lower-case letters, digits, '-', '.')")
    return name


def _seed(store: AuthStore, identity: Identity) -> str:
    path = store.seed_file(identity)
    try:
        text = path.read_text()
    except OSError as exc:
        raise AuthError(f"{identity.name}: seed file {path} is unreadable: {exc}") from None
    if not text.strip():
        raise AuthError(f"{identity.name}: seed file {path} is empty")
    return text


def _secret(name: str, namespace: str, data: dict[str, str], component: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "rubick", "app.kubernetes.io/component": component},
        },
        "stringData": dict(sorted(data.items())),
    }


def secrets(folder: Path, namespace: str, jobs_namespace: str | None = None,
            prefix: str = DEFAULT_PREFIX) -> list[dict]:
    """The Secret manifests of every identity in `folder`, in a stable order."""
    store = AuthStore(folder)
    if not store.exists():
        raise AuthError(f"no credentials in {folder}: make them with `rubick auth init --dir {folder} --agents NODE ...`")
    _check_name("namespace", namespace, 63)
    _check_name("namespace", jobs_namespace or namespace, 63)
    _check_name("secret prefix", prefix, 200)
    identities = store.identities()
    out: list[dict] = []
    agents: dict[str, str] = {}
    reporters: dict[str, str] = {}
    for identity in identities:
        seed = _seed(store, identity)
        if identity.role == "agent":
            agents[f"{identity.name}.nk"] = seed
        elif identity.role == "reporter":
            reporters[f"{identity.name}.nk"] = seed
        else:
            out.append(_secret(_check_name("secret", f"{prefix}-{identity.name}"), namespace,
                               {f"{identity.name}.nk": seed}, identity.role))
    out.append(_secret(f"{prefix}-agents", namespace, agents, "agent"))
    out.append(_secret(f"{prefix}-reporters", jobs_namespace or namespace, reporters, "reporter"))
    return out


def authorization(folder: Path) -> dict:
    """The nats-server `authorization` block of `folder` (public keys and permissions only), as
    `AuthStore.write_server_config` writes it into server.conf."""
    store = AuthStore(folder)
    known = store.users()
    return {"users": [{"nkey": known[i.name], "permissions": permissions(i, known[i.name])}
                      for i in store.identities()]}


def values(folder: Path, prefix: str = DEFAULT_PREFIX) -> dict:
    """The chart values this folder implies: the auth settings and the NATS chart's authorization block."""
    store = AuthStore(folder)
    nodes = [i.node for i in store.identities() if i.role == "agent"]
    return {
        "auth": {"enabled": True, "secretPrefix": prefix, "agents": nodes,
                 "reporterSecret": f"{prefix}-reporters"},
        "nats": {"config": {"merge": {"authorization": authorization(folder)}}},
    }


def render(folder: Path, namespace: str, jobs_namespace: str | None = None, prefix: str = DEFAULT_PREFIX) -> str:
    """The YAML stream `rubick auth kube` prints: the chart values as comments, then the Secrets."""
    docs = secrets(folder, namespace, jobs_namespace, prefix)
    snippet = yaml.safe_dump(values(folder, prefix), sort_keys=False, width=120)
    head = ["# Secrets for the rubick chart, from the credentials folder " + str(folder) + ".",
            "# Apply them (`| kubectl apply -f -`), then give the chart these values (no secrets in them;",
            "# `rubick auth kube ... --values FILE` writes them to a file):",
            "#"]
    head += ["#   " + line for line in snippet.splitlines()]
    body = yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True, width=200)
    return "\n".join(head) + "\n" + body
