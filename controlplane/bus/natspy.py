"""nats-py, imported without aiohttp until a WebSocket URL needs it.

nats-py imports aiohttp (and multidict) as it is imported, for its WebSocket transport alone (`ws://` and `wss://`
URLs). aiohttp is installed beside it (the Kubernetes client needs it) and takes about a quarter of a second to
import: most of what `rubick submit` spent before it could connect. Here nats-py's transport module is imported with
the two hidden, then given stand-ins that import them on first use, so a WebSocket URL works as it did
(tests/controlplane/test_natspy.py connects through one). Every module of the control plane that imports nats-py
imports this first; where nats-py was imported already, nothing changes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

_DEFERRED = ("aiohttp", "multidict")


class _OnFirstUse:
    """Stands for a module in nats-py's transport module until one of its names is read: then imports it, puts it in
    the stand-in's place, and answers from it."""

    def __init__(self, owner, name: str) -> None:
        self._owner, self._name = owner, name

    def __bool__(self) -> bool:  # nats-py checks the module is there before it uses it
        return True

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._name)
        setattr(self._owner, self._name, module)
        return getattr(module, attr)


def _import_transport() -> None:
    if "nats.aio.transport" in sys.modules or any(name in sys.modules for name in _DEFERRED):
        return  # imported already (nats-py, or the modules themselves): nothing to save
    if any(importlib.util.find_spec(name) is None for name in _DEFERRED):
        return  # not installed: nats-py binds None, as it would anyway
    for name in _DEFERRED:
        sys.modules[name] = None  # an import of it raises ImportError
    try:
        from nats.aio import transport
    finally:
        for name in _DEFERRED:
            del sys.modules[name]
    for name in _DEFERRED:
        if getattr(transport, name, None) is None:
            setattr(transport, name, _OnFirstUse(transport, name))


_import_transport()
