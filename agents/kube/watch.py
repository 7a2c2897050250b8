"""Objects of the Kubernetes API kept in memory by a thread: list, then watch from the list's version.

Why a watch and not a list per poll: the agent polls its jobs five times a second, and a list per
poll would be five API requests a second per node (a thousand-node cluster: five thousand), each of
which may block the agent's event loop for as long as the API server takes. Here one thread per kind
of object lists once, then holds a watch; `poll()` reads memory only. When the watch ends (the
server's timeout, a 410 Gone, a dropped connection, an RBAC 403) the thread lists again after a
backoff, and objects missing from the new list count as deleted.

Objects are plain dicts as the API serves them; `keep(obj)` filters again on the client (a selector
the server ignored, an unrelated object), so a bad object cannot reach the launcher.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from kubernetes import watch as k8s_watch

log = logging.getLogger(__name__)

MAX_GONE = 1000


def _name(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) and name else None


class Watcher:
    """`objects` (name -> latest object) and `gone` (name -> last state of an object deleted since it was
    seen), kept current by a daemon thread."""

    def __init__(self, list_fn: Callable[..., Any], keep: Callable[[dict[str, Any]], bool], what: str,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 30.0, watch_timeout_s: int = 240,
                 **kwargs: Any) -> None:
        self.list_fn, self.keep, self.what, self.kwargs = list_fn, keep, what, kwargs
        self.connect_timeout_s, self.read_timeout_s, self.watch_timeout_s = (connect_timeout_s, read_timeout_s,
                                                                             watch_timeout_s)
        self.objects: dict[str, dict[str, Any]] = {}
        self.gone: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.synced = threading.Event()
        self.error: str | None = None
        """The last failure to list or watch (None once it works again)."""
        self.version = 0
        self.lists = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._watch: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None

    # --- reading (any thread) --------------------------------------------------------------------
    def get(self, name: str) -> dict[str, Any] | None:
        with self._cond:
            return self.objects.get(name)

    def snapshot(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        with self._cond:
            return dict(self.objects), dict(self.gone)

    def forget_gone(self, name: str) -> None:
        with self._cond:
            self.gone.pop(name, None)

    def wait_change(self, since: int, timeout: float) -> int:
        """Block until `version` passes `since` (or the timeout); returns the version (tests, benchmarks)."""
        with self._cond:
            self._cond.wait_for(lambda: self.version > since, timeout)
            return self.version

    # --- the thread ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"watch-{self.what}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._list()
                failures = 0
                self._follow(version)
            except Exception as exc:  # noqa: BLE001 - API errors, connection errors, bad answers: list again
                if self._stop.is_set():
                    return
                failures += 1
                reason = getattr(exc, "reason", None) or type(exc).__name__
                status = getattr(exc, "status", None)
                self.error = f"{status} {reason}" if status else str(reason)
                if failures <= 3 or failures % 20 == 0:
                    log.warning("watching %s failed (%s); listing again", self.what, self.error)
                self._stop.wait(min(30.0, 0.2 * 2 ** min(failures, 8)))

    def _list(self) -> str | None:
        resp = self.list_fn(**self.kwargs, _preload_content=False,
                            _request_timeout=(self.connect_timeout_s, self.read_timeout_s))
        doc = json.loads(resp.data)
        items = doc.get("items") if isinstance(doc, dict) else None
        fresh: dict[str, dict[str, Any]] = {}
        for obj in items if isinstance(items, list) else ():
            name = _name(obj)
            if name is not None and self._keep(obj):
                fresh[name] = obj
        with self._cond:
            for name, obj in self.objects.items():
                if name not in fresh:
                    self._tombstone(name, obj)
            for name in fresh:
                self.gone.pop(name, None)
            self.objects = fresh
            self.lists += 1
            self.version += 1
            self.error = None
            self._cond.notify_all()
        self.synced.set()
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return rv if isinstance(rv, str) and rv else None

    def _follow(self, version: str | None) -> None:
        self._watch = w = k8s_watch.Watch()
        kwargs = dict(self.kwargs, timeout_seconds=self.watch_timeout_s, deserialize=False,
                      _request_timeout=(self.connect_timeout_s, self.watch_timeout_s + self.read_timeout_s))
        if version:
            kwargs["resource_version"] = version
        for event in w.stream(self.list_fn, **kwargs):
            if self._stop.is_set():
                break
            if not isinstance(event, dict):
                continue
            kind, obj = event.get("type"), event.get("raw_object", event.get("object"))
            if kind == "ERROR":  # 410 Gone (the version is too old) and the like: list again
                raise RuntimeError(f"watch error: {obj.get('message') if isinstance(obj, dict) else obj}")
            name = _name(obj)
            if name is None or kind not in ("ADDED", "MODIFIED", "DELETED"):
                continue
            with self._cond:
                if kind == "DELETED" or not self._keep(obj):
                    old = self.objects.pop(name, None)
                    if old is not None or (kind == "DELETED" and self._keep(obj)):
                        self._tombstone(name, obj if kind == "DELETED" else old)
                else:
                    self.objects[name] = obj
                    self.gone.pop(name, None)
                self.version += 1
                self._cond.notify_all()
        if not self._stop.is_set():
            time.sleep(0.05)  # the server ended the watch (its timeout): list again at once

    def _keep(self, obj: dict[str, Any]) -> bool:
        try:
            return bool(self.keep(obj))
        except Exception:  # noqa: BLE001 - an object the filter cannot read is not ours
            return False

    def _tombstone(self, name: str, obj: dict[str, Any] | None) -> None:
        self.gone[name] = obj if isinstance(obj, dict) else {}
        self.gone.move_to_end(name)
        while len(self.gone) > MAX_GONE:
            self.gone.popitem(last=False)
