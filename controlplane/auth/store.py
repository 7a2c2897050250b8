"""The credentials folder: one nkey seed file per identity and the server's authorization config.

Layout (folder mode 0700, every file 0600)::

    <folder>/<identity>.nk     the identity's nkey seed (secret: give it only to that component)
    <folder>/users.json        identity -> public key (no secrets)
    <folder>/server.conf       the nats-server `authorization` block (public keys and permissions only),
                               plus a `tls` block when the server has a certificate

`rubick up` creates it in its data folder (`<data-dir>/auth`); `rubick auth` adds identities to it and
asks the running server to reload. On Kubernetes the seeds live in Secrets and the chart renders the
same server block (docs/security.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import nkeys

from .roles import Identity, permissions

SERVICE_IDENTITIES = tuple(Identity(r) for r in ("admin", "recorder", "admission", "clock", "modeler", "policy",
                                                 "submitter"))
"""What `rubick up` creates at first start; agents and their reporters are added per node."""


class AuthError(RuntimeError):
    """Missing, unreadable or wrong credentials, said with what is missing and where it was looked for."""


@dataclass(frozen=True)
class ServerTls:
    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    """With a CA, clients must present a certificate it signed (mutual TLS)."""


def new_seed() -> bytes:
    return nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)


def public_key(seed: bytes) -> str:
    try:
        return nkeys.from_seed(bytearray(seed.strip())).public_key.decode()
    except Exception as exc:  # nkeys raises its own types and binascii errors
        raise AuthError(f"not an nkey user seed ({type(exc).__name__})") from None


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` readable by the owner only, atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class AuthStore:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @property
    def server_config(self) -> Path:
        return self.folder / "server.conf"

    def seed_file(self, identity: Identity) -> Path:
        return self.folder / f"{identity.name}.nk"

    def exists(self) -> bool:
        return (self.folder / "users.json").exists()

    def users(self) -> dict[str, str]:
        try:
            return json.loads((self.folder / "users.json").read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as exc:
            raise AuthError(f"{self.folder / 'users.json'} is unreadable: {exc}") from None

    def init(self) -> list[Identity]:
        """Create the service identities that are missing; returns the ones created."""
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        return [i for i in SERVICE_IDENTITIES if self.add(i)]

    def add(self, identity: Identity) -> bool:
        """Create `identity`'s seed unless it exists; True when created."""
        self.folder.mkdir(parents=True, exist_ok=True)
        users = self.users()
        path = self.seed_file(identity)
        if identity.name in users and path.exists():
            return False
        seed = new_seed()
        write_private(path, seed + b"\n")
        users[identity.name] = public_key(seed)
        write_private(self.folder / "users.json", (json.dumps(users, indent=2, sort_keys=True) + "\n").encode())
        return True

    def identities(self) -> list[Identity]:
        out = []
        for name in sorted(self.users()):
            role, _, node = name.partition("-")
            out.append(Identity(role, node or None))
        return out

    def write_server_config(self, tls: ServerTls | None = None, *, users: bool = True) -> Path:
        """The server's authorization (and TLS) block, from users.json: public keys only. `users=False`
        leaves authentication out (an insecure server that still has TLS)."""
        text = []
        if users:
            known = self.users()
            entries = [{"nkey": known[i.name], "permissions": permissions(i, known[i.name])}
                       for i in self.identities()]
            text += ["# nats-server authorization: one nkey user per component identity (public keys only).",
                     "authorization: " + json.dumps({"users": entries}, indent=1)]
        saved = self.folder / "server-tls.json"
        if tls is not None:
            write_private(saved, json.dumps({k: str(v) if v else None for k, v in vars(tls).items()}).encode())
        else:
            saved.unlink(missing_ok=True)
        if tls is not None:
            block = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file), "timeout": 2}
            if tls.ca_file is not None:
                block.update(ca_file=str(tls.ca_file), verify=True)
            text.append("tls: " + json.dumps(block, indent=1))
        write_private(self.server_config, ("\n".join(text) + "\n").encode())
        return self.server_config

    def saved_tls(self) -> ServerTls | None:
        """The TLS settings the server config was last written with."""
        try:
            doc = json.loads((self.folder / "server-tls.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return ServerTls(Path(doc["cert_file"]), Path(doc["key_file"]), Path(doc["ca_file"]) if doc.get("ca_file") else None)
