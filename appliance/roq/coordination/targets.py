"""Where the cluster's metrics and health listeners are: one ephemeral znode per listener
(`<ns>/metrics/<role>@<name>`, paths.py), written by the process that serves it (a GCM, a host,
an HTTP gateway) and read by `roq metrics scrape-config` and `roq health`.

The znode goes with its process's session; `TargetKeeper` writes it again when a new session
(after an expiry) lacks it, from a thread of its own that looks every
`limits.metrics_target_check_s`, so no main loop spends a ZooKeeper round trip on it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from roq import limits
from roq.coordination.paths import Paths
from roq.errors import CoordinationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    role: str  # gcm | host | http
    name: str  # unique within its role: a GCM's id, a host's name, a gateway's address
    address: str  # host:port of its /metrics, /healthz and /readyz
    scheme: str = "http"  # https: a gateway with http.tls.cert
    token: bool = False  # its /metrics wants a bearer token (a gateway)


def read_targets(zk: Any, paths: Paths) -> list[Target]:
    """Every registered listener, sorted by role and name; a znode that does not decode is
    skipped (logged)."""
    try:
        names = zk.get_children(paths.metrics)
    except NoNodeError:
        return []
    except KazooException as error:
        raise CoordinationError(f"reading {paths.metrics}: {error!r}") from None
    found = []
    for child in sorted(names)[: limits.metrics_targets_max]:
        role, _, name = child.partition("@")
        path = paths.metrics_target(unquote(role), unquote(name))  # as written: quoted again
        try:
            data, _ = zk.get(path)
            found.append(_decode(json.loads(data.decode())))
        except NoNodeError:
            continue  # gone meanwhile
        except (ValueError, TypeError, KeyError) as error:
            log.warning("skipping the metrics target %s: %s", child, error)
        except KazooException as error:
            raise CoordinationError(f"reading {path}: {error!r}") from None
    return sorted(found, key=lambda t: (t.role, t.name))


def _decode(doc: dict[str, Any]) -> Target:
    target = Target(str(doc["role"]), str(doc["name"]), str(doc["address"]),
                    str(doc.get("scheme", "http")), bool(doc.get("token", False)))  # fmt: skip
    if target.scheme not in ("http", "https") or ":" not in target.address:
        raise ValueError(f"not a listener address: {target.scheme}://{target.address}")
    return target


class TargetKeeper:
    """Keeps this process's target znode while it runs (a daemon thread)."""

    def __init__(self, zk: Any, paths: Paths, target: Target):
        self.zk, self.target = zk, target
        self.path = paths.metrics_target(target.role, target.name)
        self._data = json.dumps(asdict(target)).encode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-target", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.keep()
            self._stop.wait(limits.metrics_target_check_s)

    def keep(self) -> None:
        if not self.zk.connected:
            return
        try:
            if self.zk.exists(self.path) is None:
                self.zk.create(self.path, self._data, ephemeral=True, makepath=True)
                log.info("metrics target %s registered", self.path)
        except NodeExistsError:
            pass  # another session's (ours, just expired) goes within its timeout: next look
        except KazooException as error:
            log.debug("metrics target %s not registered yet: %r", self.path, error)

    def stop(self) -> None:
        """Stop looking and delete the znode if ZooKeeper answers (else it goes with the
        session)."""
        self._stop.set()
        try:
            stat = self.zk.exists(self.path) if self.zk.connected else None
            client_id = self.zk.client_id
            # only our own: a process of the same name started since may have written it
            if stat is not None and client_id and stat.ephemeralOwner == client_id[0]:
                self.zk.delete(self.path, version=stat.version)
        except KazooException:
            pass
