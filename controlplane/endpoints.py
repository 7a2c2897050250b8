"""Where a local `rubick up` is: its data folder and `endpoints.json` (stdlib only, so commands that only need
to find the server start fast)."""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_DATA_DIR = Path(".rubick")
DEFAULT_NATS_PORT = 4222
ENDPOINTS = "endpoints.json"


def read_endpoints(data_dir: Path = DEFAULT_DATA_DIR) -> dict | None:
    try:
        return json.loads((Path(data_dir) / ENDPOINTS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def resolve_nats_url(explicit: str | None, data_dir: Path = DEFAULT_DATA_DIR) -> str:
    """--nats-url, else $RUBICK_NATS_URL, else the running `rubick up` of data_dir, else the default port."""
    if explicit:
        return explicit
    if os.environ.get("RUBICK_NATS_URL"):
        return os.environ["RUBICK_NATS_URL"]
    endpoints = read_endpoints(data_dir)
    if endpoints and endpoints.get("nats_url"):
        return endpoints["nats_url"]
    return f"nats://127.0.0.1:{DEFAULT_NATS_PORT}"
