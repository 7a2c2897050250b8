"""Fixtures of the Kubernetes launcher tests: kmock's Kubernetes emulator served on 127.0.0.1 (no real API
server can run here), with nodes n0 and n1 Ready."""

from __future__ import annotations

import kubernetes
import pytest

from .emulator import ApiServer, node_object


@pytest.fixture
def server():
    s = ApiServer()
    v1 = kubernetes.client.CoreV1Api(s.api())
    for node in ("n0", "n1"):
        v1.create_node(node_object(node), _preload_content=False)
    yield s
    s.close()


@pytest.fixture
def launchers():
    """Launchers made by a test; their watch threads stop with it."""
    made = []
    yield made
    for launcher in made:
        launcher.close()
