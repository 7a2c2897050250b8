"""`rubick auth`: the identities of a deployment, their credentials and what each may do.

    rubick auth list                      identities of the local control plane, public keys, seed files
    rubick auth add agent NODE            a new node agent (and its node's reporter); the running server
                                          reloads its configuration, no restart
    rubick auth add submitter             credentials for another submitting system
    rubick auth permissions [ROLE]        what each role may publish and subscribe to
    rubick auth init --dir DIR            a credentials folder for a deployment (seeds to put in Secrets,
                                          server.conf to give nats-server)
    rubick auth bootstrap --nats-url URL --creds admin.nk
                                          create the stream and the lease bucket with the bootstrap identity
    rubick auth kube --dir DIR --namespace NS   Secrets (and the chart's values) for the Helm chart
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from ..auth import AuthError, AuthStore, Identity, RoleError, permissions
from ..auth.roles import ROLES
from ..endpoints import DEFAULT_DATA_DIR, read_endpoints, resolve_nats_url
from .common import fail
from ..bus.nats import redact_url


def register(sub) -> None:
    p = sub.add_parser("auth", help="credentials and permissions of the deployment's identities")
    auth = p.add_subparsers(dest="auth_command", metavar="ACTION")

    def folder_args(q) -> None:
        q.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                       help="data folder of the local control plane (its credentials are in DATA_DIR/auth)")
        q.add_argument("--dir", type=Path, help="a credentials folder elsewhere (default: DATA_DIR/auth)")

    q = auth.add_parser("list", help="identities, public keys and seed files")
    folder_args(q)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_list)

    q = auth.add_parser("add", help="create credentials for a new identity (agent NODE, reporter NODE, submitter, ...)")
    q.add_argument("role", choices=ROLES)
    q.add_argument("node", nargs="?", help="the node, for agent and reporter")
    folder_args(q)
    q.set_defaults(func=_add)

    q = auth.add_parser("permissions", help="what each role may publish and subscribe to")
    q.add_argument("role", nargs="?", choices=ROLES)
    q.add_argument("node", nargs="?", default="NODE")
    q.set_defaults(func=_permissions)

    q = auth.add_parser("init", help="create a credentials folder for a deployment")
    q.add_argument("--dir", type=Path, required=True)
    q.add_argument("--agents", nargs="*", default=[], metavar="NODE", help="nodes to create agent credentials for")
    q.set_defaults(func=_init)

    q = auth.add_parser("bootstrap", help="create the stream and the lease bucket (bootstrap identity)")
    q.add_argument("--nats-url")
    q.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    q.add_argument("--creds", type=Path, help="the bootstrap identity's seed (default: $RUBICK_NATS_CREDS, "
                                              "else DATA_DIR/auth/admin.nk)")
    q.add_argument("--tls-ca", type=Path)
    q.add_argument("--replicas", type=int, default=1, help="stream replicas (3 on a three-server NATS cluster)")
    q.set_defaults(func=_bootstrap)

    q = auth.add_parser("kube", help="Kubernetes Secrets and chart values from a credentials folder")
    q.add_argument("--dir", type=Path, required=True, help="a folder made by `rubick auth init`")
    q.add_argument("--namespace", required=True, help="the chart's release namespace")
    q.add_argument("--jobs-namespace", help="the training pods' namespace (default: --namespace)")
    q.add_argument("--prefix", default="rubick-auth", help="Secret name prefix (the chart's auth.secretPrefix)")
    q.add_argument("--values", type=Path, help="also write the chart values (auth, nats.config.merge) to this file")
    q.set_defaults(func=_kube)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _store(args) -> tuple[AuthStore, dict | None]:
    if args.dir:
        return AuthStore(args.dir), None
    endpoints = read_endpoints(args.data_dir)
    if endpoints and endpoints.get("auth_dir"):
        return AuthStore(Path(endpoints["auth_dir"])), endpoints
    return AuthStore(Path(args.data_dir) / "auth"), endpoints


def _list(args) -> int:
    store, _ = _store(args)
    if not store.exists():
        return fail(f"no credentials in {store.folder}: start `rubick up` (secure by default) or `rubick auth init`")
    users = store.users()
    rows = [{"identity": i.name, "role": i.role, "node": i.node, "public_key": users[i.name],
             "seed_file": str(store.seed_file(i))} for i in store.identities()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['identity']:<24} {r['public_key']}  {r['seed_file']}")
    return 0


def _add(args) -> int:
    try:
        identity = Identity(args.role, args.node)
    except RoleError as exc:
        return fail(str(exc))
    store, endpoints = _store(args)
    if not store.exists():
        return fail(f"no credentials in {store.folder}: start `rubick up` (secure by default) or `rubick auth init`")
    wanted = [identity] + ([Identity("reporter", args.node)] if args.role == "agent" else [])
    from ..auth.admin import provision
    try:
        created = provision(store, wanted, endpoints if not args.dir else None)
    except AuthError as exc:
        return fail(str(exc), 1)
    for i in wanted:
        state = "created" if i in created else "exists"
        print(f"{i.name}: {state}, seed file {store.seed_file(i)} (give it only to that component), "
              f"public key {store.users()[i.name]}")
    if created and endpoints and endpoints.get("server_pid") and not args.dir:
        print("the running nats-server reloaded its configuration")
    return 0


def _permissions(args) -> int:
    roles = [args.role] if args.role else list(ROLES)
    for role in roles:
        identity = Identity(role, args.node if role in ("agent", "reporter") else None)
        perms = permissions(identity, "U" + "K" * 55)
        pub = [s for s in perms["publish"]["allow"] if not s.startswith("$")]
        api = [s for s in perms["publish"]["allow"] if s.startswith("$")]
        print(f"{identity.name}:")
        print(f"  publishes: {', '.join(pub) or 'nothing'}")
        print(f"  subscribes: {', '.join(perms['subscribe']['allow'])}")
        if api:
            print(f"  JetStream API: {len(api)} subjects (stream info, its own consumer, reads; no stream changes)")
    return 0


def _init(args) -> int:
    store = AuthStore(args.dir)
    try:
        created = store.init()
        for node in args.agents:
            for identity in (Identity("agent", node), Identity("reporter", node)):
                if store.add(identity):
                    created.append(identity)
    except (RoleError, AuthError, OSError) as exc:
        return fail(str(exc))
    store.write_server_config(store.saved_tls())
    print(f"{len(created)} identities created in {store.folder}; server authorization block: {store.server_config}")
    return 0


def _bootstrap(args) -> int:
    from ..auth import find_credentials
    from ..bus.nats import JetStreamBus
    from ..lease import ensure_lease_bucket

    url = resolve_nats_url(args.nats_url, args.data_dir)
    credentials = find_credentials(Identity("admin"), creds=args.creds, data_dir=args.data_dir, tls_ca=args.tls_ca,
                                   endpoints=read_endpoints(args.data_dir))

    async def main() -> int:
        bus = await JetStreamBus.connect(url, name="rubick-bootstrap", credentials=credentials, replicas=args.replicas)
        try:
            # the stream first (connect made it), then the bucket: a service waiting for the bucket finds both
            await ensure_lease_bucket(bus.js, replicas=args.replicas)
            print(f"stream {bus.stream} ready on {redact_url(url)}", flush=True)
        finally:
            await bus.close()
        return 0

    try:
        return asyncio.run(main())
    except (AuthError, PermissionError) as exc:
        return fail(str(exc), 1)
    except (ConnectionError, OSError) as exc:
        return fail(f"cannot reach NATS at {redact_url(url)}: {exc}", 1)


def _kube(args) -> int:
    import sys

    import yaml

    from ..auth import kube
    try:
        text = kube.render(args.dir, args.namespace, args.jobs_namespace, args.prefix)
        if args.values:
            args.values.write_text(yaml.safe_dump(kube.values(args.dir, args.prefix), sort_keys=False, width=120))
    except (AuthError, OSError) as exc:
        return fail(str(exc))
    sys.stdout.write(text)
    return 0
