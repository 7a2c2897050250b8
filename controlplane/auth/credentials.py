"""What a component connects with: its nkey seed file and, where the server has a certificate, TLS.

Found in this order: the command's own flags (`--creds`, `--tls-ca`), the environment
(`RUBICK_NATS_CREDS`, `RUBICK_NATS_TLS_CA`, `RUBICK_NATS_TLS_CERT`, `RUBICK_NATS_TLS_KEY`), then the
data folder of a `rubick up` on this machine (`<data-dir>/auth/<identity>.nk`). A file that is named but
missing or not an nkey seed is an error at start, naming the file; never a silent fallback.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from .roles import Identity, inbox_prefix
from .store import AuthError, AuthStore, public_key

ENV_CREDS = "RUBICK_NATS_CREDS"
ENV_TLS_CA = "RUBICK_NATS_TLS_CA"
ENV_TLS_CERT = "RUBICK_NATS_TLS_CERT"
ENV_TLS_KEY = "RUBICK_NATS_TLS_KEY"


@dataclass(frozen=True)
class Credentials:
    seed_file: Path | None = None
    tls_ca: Path | None = None
    """CA bundle that signed the server's certificate (TLS is used when given)."""
    tls_cert: Path | None = None
    """Client certificate, for a server that verifies clients (mutual TLS)."""
    tls_key: Path | None = None

    @property
    def empty(self) -> bool:
        return self.seed_file is None and self.tls_ca is None and self.tls_cert is None

    def describe(self) -> str:
        parts = [f"nkey seed {self.seed_file}" if self.seed_file else "no credentials"]
        if self.tls_ca or self.tls_cert:
            parts.append(f"TLS (CA {self.tls_ca or 'system'})")
        return ", ".join(parts)

    def public_key(self) -> str | None:
        if self.seed_file is None:
            return None
        try:
            return public_key(Path(self.seed_file).read_bytes())
        except FileNotFoundError:
            raise AuthError(f"credentials file {self.seed_file} does not exist") from None
        except PermissionError:
            raise AuthError(f"credentials file {self.seed_file} is not readable by this user") from None
        except AuthError as exc:
            raise AuthError(f"credentials file {self.seed_file}: {exc}") from None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        try:
            ctx = ssl.create_default_context(cafile=str(self.tls_ca) if self.tls_ca else None)
            if self.tls_cert:
                ctx.load_cert_chain(str(self.tls_cert), str(self.tls_key) if self.tls_key else None)
        except (OSError, ssl.SSLError) as exc:
            raise AuthError(f"TLS files unusable ({self.describe()}): {exc}") from None
        return ctx

    def nats_options(self) -> dict:
        """Keyword arguments for `nats.connect`; checks every named file first."""
        options: dict = {}
        key = self.public_key()
        if key is not None:
            options["nkeys_seed"] = str(self.seed_file)
            options["inbox_prefix"] = inbox_prefix(key)
        ctx = self.ssl_context()
        if ctx is not None:
            options["tls"] = ctx
        return options


def _path(value: str | os.PathLike | None) -> Path | None:
    return Path(value) if value else None


def find_credentials(identity: Identity, *, creds: str | os.PathLike | None = None,
                     data_dir: str | os.PathLike | None = None, tls_ca: str | os.PathLike | None = None,
                     tls_cert: str | os.PathLike | None = None, tls_key: str | os.PathLike | None = None,
                     endpoints: dict | None = None) -> Credentials:
    """The credentials `identity` connects with (see the module docstring for the order)."""
    env = os.environ
    seed = _path(creds) or _path(env.get(ENV_CREDS))
    auth_dir = None
    if endpoints and endpoints.get("auth_dir"):
        auth_dir = Path(endpoints["auth_dir"])
    elif data_dir is not None and (Path(data_dir) / "auth" / "users.json").exists():
        auth_dir = Path(data_dir) / "auth"
    if seed is None and auth_dir is not None:
        candidate = AuthStore(auth_dir).seed_file(identity)
        if candidate.exists():
            seed = candidate
    ca = _path(tls_ca) or _path(env.get(ENV_TLS_CA)) or _path((endpoints or {}).get("tls_ca"))
    cert = _path(tls_cert) or _path(env.get(ENV_TLS_CERT))
    key = _path(tls_key) or _path(env.get(ENV_TLS_KEY))
    return Credentials(seed, ca, cert, key)


def credentials_from_env() -> Credentials:
    """What a process started by an agent connects with: the files the agent named in its environment."""
    env = os.environ
    return Credentials(_path(env.get(ENV_CREDS)), _path(env.get(ENV_TLS_CA)), _path(env.get(ENV_TLS_CERT)),
                       _path(env.get(ENV_TLS_KEY)))


def missing_hint(identity: Identity, data_dir: str | os.PathLike | None = None) -> str:
    """What to do when the server wants credentials this component does not have."""
    where = f" (looked in {Path(data_dir) / 'auth'})" if data_dir is not None else ""
    return (f"the server requires credentials; this {identity.role} has none{where}: pass --creds FILE, set "
            f"{ENV_CREDS}, or create them with `rubick auth add {identity.role}"
            f"{' ' + identity.node if identity.node else ''}`")
