"""Helpers shared by the command modules.

The NATS client, the credentials and the lease are imported where a command uses them: commands that never
talk to NATS (`rubick replay`, `simulate`, `log`) import this module too, and the NATS client alone takes
about 0.15 s to import."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..endpoints import DEFAULT_DATA_DIR, ENDPOINTS, read_endpoints, resolve_nats_url

if TYPE_CHECKING:
    from ..auth import Credentials, Identity


def add_nats_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", help="NATS server URL (default: $RUBICK_NATS_URL, else the running "
                                           "`rubick up` of --data-dir, else nats://127.0.0.1:4222)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="folder of the local control plane (default: .rubick)")
    parser.add_argument("--creds", type=Path, help="nkey seed file of this component's identity (default: "
                                                   "$RUBICK_NATS_CREDS, else DATA_DIR/auth/<identity>.nk)")
    parser.add_argument("--tls-ca", type=Path, help="CA that signed the server's certificate "
                                                    "(default: $RUBICK_NATS_TLS_CA)")
    parser.add_argument("--tls-cert", type=Path, help="client certificate, for a server that verifies clients")
    parser.add_argument("--tls-key", type=Path, help="the client certificate's key")


def credentials_for(args: argparse.Namespace, identity: Identity) -> Credentials:
    """The credentials `identity` connects with, from the command's flags, the environment or the data
    folder of a `rubick up` on this machine."""
    from ..auth import find_credentials

    return find_credentials(identity, creds=args.creds, data_dir=args.data_dir, tls_ca=args.tls_ca,
                            tls_cert=args.tls_cert, tls_key=args.tls_key, endpoints=read_endpoints(args.data_dir))


def nats_url_for_client(args: argparse.Namespace) -> str | None:
    """The server a client command talks to: --nats-url, $RUBICK_NATS_URL, or the running `rubick up` of
    --data-dir. With none of them, a --data-dir given by hand is an error (its `rubick up` is not running,
    or never ran: None, after saying so); the default folder falls back to nats://127.0.0.1:4222, and
    says so on stderr."""
    if args.nats_url or os.environ.get("RUBICK_NATS_URL") or (read_endpoints(args.data_dir) or {}).get("nats_url"):
        return resolve_nats_url(args.nats_url, args.data_dir)
    if Path(args.data_dir) != DEFAULT_DATA_DIR:
        fail(f"no running `rubick up` in {args.data_dir} (no {Path(args.data_dir) / ENDPOINTS}): start one with "
             f"`rubick up --data-dir {args.data_dir}`, or name the server with --nats-url")
        return None
    url = resolve_nats_url(None, args.data_dir)
    print(f"rubick: no --nats-url, $RUBICK_NATS_URL or running `rubick up` in {args.data_dir}: trying {url}",
          file=sys.stderr)
    return url


def run_request(args: argparse.Namespace, request, what: str) -> int:
    """Run `request(args, url)` against the server a client command talks to (`nats_url_for_client`): a
    value the schema refuses is a usage error (exit 2, naming `what`), an unreachable server, refused
    credentials or a forbidden publish exit 1 with the reason."""
    from ..auth import AuthError
    from ..events import Invalid

    url = nats_url_for_client(args)
    if url is None:
        return 2
    try:
        return asyncio.run(request(args, url))
    except Invalid as exc:
        return fail(f"{what}: {exc}")
    except (ConnectionError, AuthError, PermissionError) as exc:
        return fail(str(exc), 1)


def fail(message: str, code: int = 2) -> int:
    print(f"rubick: {message}", file=sys.stderr)
    return code


def run_against_nats(args: argparse.Namespace, main) -> int:
    """Set up logging, find the NATS URL and run `main(args, url)`; an unreachable server is a clear
    error (exit 1), not a traceback."""
    from ..auth import AuthError
    from ..bus.nats import redact_url
    from ..lease import LeaseBucketMissing

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    url = resolve_nats_url(args.nats_url, args.data_dir)
    try:
        return asyncio.run(main(args, url))
    except (AuthError, PermissionError, LeaseBucketMissing) as exc:
        return fail(str(exc), 1)
    except (ConnectionError, OSError) as exc:
        return fail(f"cannot reach NATS at {redact_url(url)}: {exc}", 1)
