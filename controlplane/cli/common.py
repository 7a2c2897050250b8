"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from ..runtime import DEFAULT_DATA_DIR, resolve_nats_url


def add_nats_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", help="NATS server URL (default: $RUBICK_NATS_URL, else the running "
                                           "`rubick up` of --data-dir, else nats://127.0.0.1:4222)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="folder of the local control plane (default: .rubick)")


def fail(message: str, code: int = 2) -> int:
    print(f"rubick: {message}", file=sys.stderr)
    return code


def run_against_nats(args: argparse.Namespace, main) -> int:
    """Set up logging, find the NATS URL and run `main(args, url)`; an unreachable server is a clear
    error (exit 1), not a traceback."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    url = resolve_nats_url(args.nats_url, args.data_dir)
    try:
        return asyncio.run(main(args, url))
    except (ConnectionError, OSError) as exc:
        return fail(f"cannot reach NATS at {url}: {exc}", 1)
