"""Authentication and authorisation with NATS's own mechanisms: nkeys per component identity,
per-subject permissions, TLS (docs/security.md). Shell-side only: cores never import it."""

from .credentials import Credentials, find_credentials, missing_hint
from .roles import Identity, RoleError, may_publish, permissions
from .store import AuthError, AuthStore, ServerTls

__all__ = ["AuthError", "AuthStore", "Credentials", "Identity", "RoleError", "ServerTls", "find_credentials",
           "may_publish", "missing_hint", "permissions"]
