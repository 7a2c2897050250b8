"""Helpers shared by the command modules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..runtime import DEFAULT_DATA_DIR


def add_nats_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", help="NATS server URL (default: $RUBICK_NATS_URL, else the running "
                                           "`rubick up` of --data-dir, else nats://127.0.0.1:4222)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="folder of the local control plane (default: .rubick)")


def fail(message: str, code: int = 2) -> int:
    print(f"rubick: {message}", file=sys.stderr)
    return code
