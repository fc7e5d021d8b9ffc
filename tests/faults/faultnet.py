"""Machines for fault tests: network namespaces on a bridge this module creates.

Each machine is a namespace with one veth pair: `eth0` inside, with its own address on a /24,
and the other end on the bridge. The root namespace gets the bridge's `.1`, so clients run
there and reach every machine, and nothing else is reachable from a machine. Names carry the
creating process's pid (`rqf<pid>...`), so concurrent runs never collide, and leftovers of a
run that died (its pid is gone) are removed by the next one.

Faults that act on the network: `partition` (the machine's link down), `slow` (a `tbf` rate
limit both ways; `netem` is not available on this kernel). Faults on processes: `signal_all`
(every process in the namespace, from `ip netns pids`). `tmpfs` mounts a small file system.

Every created thing is recorded, and `destroy()` removes it: it is called by the fixtures'
finalizers, and by `atexit` and SIGTERM for a run that is interrupted.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "rqf"
SUBNET_FIRST = "10.231"


class NamespacesUnavailable(RuntimeError):
    """This machine cannot create namespaces, bridges or veth pairs (not root, no iproute2)."""


def ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except OSError as error:  # no `ip` at all: cleanup paths must not raise
        if check:
            raise RuntimeError(f"{' '.join(command)}: {error}") from None
        return ""
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.stdout


def tc(*args: str, netns: str | None = None) -> None:
    command = ["tc", *args] if netns is None else ["ip", "netns", "exec", netns, "tc", *args]
    _run(command)


@dataclass
class Machine:
    name: str  # m1, m2, ...
    netns: str
    address: str
    veth: str  # the root namespace's end, on the bridge

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def pids(self) -> list[int]:
        out = ip("netns", "pids", self.netns, check=False)
        return [int(pid) for pid in out.split() if pid.isdigit()]

    def signal_all(self, sig: int) -> list[int]:
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def partition(self) -> None:
        ip("link", "set", self.veth, "down")

    def heal_partition(self) -> None:
        ip("link", "set", self.veth, "up")

    def slow(self, rate: str = "256kbit") -> None:
        """Both directions through a token bucket: into the machine on the bridge's end, out of
        it on eth0."""
        shape = ["tbf", "rate", rate, "burst", "4kb", "latency", "300ms"]
        tc("qdisc", "add", "dev", self.veth, "root", *shape)
        tc("qdisc", "add", "dev", "eth0", "root", *shape, netns=self.netns)

    def heal_slow(self) -> None:
        tc("qdisc", "del", "dev", self.veth, "root")
        tc("qdisc", "del", "dev", "eth0", "root", netns=self.netns)


@dataclass
class Network:
    count: int
    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    machines: list[Machine] = field(default_factory=list)
    mounts: list[Path] = field(default_factory=list)
    subnet: str = ""

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    def create(self) -> None:
        _check_capable()
        remove_leftovers()
        _install_sigterm()
        _LIVE.append(self)
        self.subnet = _free_subnet()
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for index in range(1, self.count + 1):
            self.machines.append(self._machine(index))

    def _machine(self, index: int) -> Machine:
        netns, outer, inner = f"{self.tag}m{index}", f"{self.tag}v{index}", f"{self.tag}p{index}"
        address = f"{self.subnet}.{10 + index}"
        ip("netns", "add", netns)
        machine = Machine(f"m{index}", netns, address, outer)
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", netns)
        ip("link", "set", inner, "name", "eth0", netns=netns)
        ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
        ip("link", "set", "eth0", "up", netns=netns)
        ip("link", "set", "lo", "up", netns=netns)
        ip("link", "set", outer, "master", self.bridge)
        ip("link", "set", outer, "up")
        return machine

    def tmpfs(self, path: Path, size: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        _run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)])
        self.mounts.append(path)

    def destroy(self) -> None:
        """Kill every process of every machine, then remove namespaces, links, bridge and
        mounts. Safe to call twice; every step is attempted even if one fails."""
        for machine in self.machines:
            for _ in range(3):  # processes a dying host forks meanwhile are caught next round
                if not machine.signal_all(signal.SIGKILL):
                    break
                time.sleep(0.2)
        for mount in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=20)
        self.mounts.clear()
        for machine in self.machines:
            ip("netns", "del", machine.netns, check=False)
            ip("link", "del", machine.veth, check=False)
        ip("link", "del", self.bridge, check=False)
        self.machines.clear()
        if self in _LIVE:
            _LIVE.remove(self)

    def leftovers(self) -> list[str]:
        """Names of this run's namespaces and links that still exist (empty after destroy)."""
        names = ip("netns", "list", check=False) + ip("-br", "link", check=False)
        return sorted(set(re.findall(rf"\b{self.tag}\w*", names)))


def _run(command: list[str]) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except OSError as error:
        raise RuntimeError(f"{' '.join(command)}: {error}") from None
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


def _check_capable() -> None:
    if os.geteuid() != 0:
        raise NamespacesUnavailable("fault tests need root to create network namespaces")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise NamespacesUnavailable(f"{' and '.join(missing)} not found (package iproute2)")
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        ip("netns", "add", probe)
        ip("link", "add", f"{PREFIX}{os.getpid()}pb", "type", "bridge")
    except (OSError, RuntimeError) as error:
        raise NamespacesUnavailable(f"cannot create a namespace and a bridge: {error}") from None
    finally:
        ip("netns", "del", probe, check=False)
        ip("link", "del", f"{PREFIX}{os.getpid()}pb", check=False)


def _free_subnet() -> str:
    """A 10.231.N.0/24 no interface of this machine uses (another run may hold one)."""
    used = ip("-4", "-br", "addr", check=False)
    for third in [*range(os.getpid() % 200, 250), *range(1, 250)]:
        if f"{SUBNET_FIRST}.{third}." not in used:
            return f"{SUBNET_FIRST}.{third}"
    raise NamespacesUnavailable(f"every {SUBNET_FIRST}.N.0/24 is in use")


def remove_leftovers() -> None:
    """Remove namespaces and links of runs whose process is gone (killed with SIGKILL: no
    finalizer ran)."""
    names = ip("netns", "list", check=False) + ip("-br", "link", check=False)
    for pid in {int(p) for p in re.findall(rf"\b{PREFIX}(\d+)", names)}:
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        stale = Network(0, tag=f"{PREFIX}{pid}")
        for netns in set(re.findall(rf"\b{stale.tag}m\d+", names)):
            stale.machines.append(Machine("stale", netns, "", f"{stale.tag}v{netns[-1]}"))
        stale.destroy()
        for link in set(re.findall(rf"\b{stale.tag}\w+", ip("-br", "link", check=False))):
            ip("link", "del", link.split("@")[0], check=False)


_LIVE: list[Network] = []


def _destroy_live() -> None:
    for network in list(_LIVE):
        network.destroy()


def _on_sigterm(signum: int, frame: Any) -> None:
    _destroy_live()
    sys.exit(128 + signum)


atexit.register(_destroy_live)


def _install_sigterm() -> None:
    """A run stopped with SIGTERM (CI's timeout, an xdist worker torn down) cleans up too;
    Ctrl-C is a KeyboardInterrupt, and the fixtures' finalizers handle it."""
    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        with contextlib.suppress(ValueError):  # not the main thread: atexit still runs
            signal.signal(signal.SIGTERM, _on_sigterm)
