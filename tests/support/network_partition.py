"""A small network of Linux network namespaces on one bridge, for tests that cut members off.

``PartitionNetwork(members=3)`` (as root) makes:

- a bridge ``jwb<tag>`` on the host with the address ``10.213.N.1/24``, where the test's own
  Kafka broker listens and through which the test process reaches the members;
- for member ``i`` (1, 2, 3, ...) a namespace ``jetwake-<tag>-m<i>`` with its loopback up and
  one end of a veth pair, ``eth0``, addressed ``10.213.N.<10+i>/24``; the other end,
  ``jwh<tag><i>``, is a port of the bridge.

``<tag>`` is random and ``N`` is a /24 no other bridge of this host uses (chosen under a lock
file), so runs in parallel never clash. Members run inside their namespaces through
:meth:`PartitionNetwork.command_prefix` (``ip netns exec NS ...``).

Two ways to cut a member off, both silent (packets vanish, nothing is refused), as a dead
switch port or a broken link does it:

- :meth:`cut` / :meth:`heal` take the member's bridge port (the host end of its veth pair)
  down and up: the member reaches nothing, neither Kafka nor its peers, and nothing reaches it.
- :meth:`isolate_from_peers` / :meth:`rejoin_peers` cut only the paths between the member and
  the other members, keeping its path to the host (Kafka): each side gets a permanent
  neighbour entry for the other's address with a link-layer address no port has, so the
  frames go out and the bridge floods them to ports that all discard them.

Why not an ``iptables``/``nft`` DROP rule: neither is part of iproute2 (Debian's minimal
images have no firewall tools), and the kernels of small VMs often lack the ``tc`` drop
action too; link state and neighbour entries are in every kernel that has namespaces and
veth pairs, and iproute2 sets them.

:meth:`close` kills whatever still runs inside the namespaces (processes the test started
there), deletes the namespaces (which deletes the veth pairs) and the bridge. A run that died
without closing (SIGKILL) is cleaned up by the next :class:`PartitionNetwork` on this host:
every network records its owner's pid under ``/run/jetwake-netns``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from support.waiting import poll_until, wait_until

__all__ = ["NamespacesUnavailable", "PartitionNetwork"]

STATE_DIR = Path("/run/jetwake-netns")
SUBNET_PREFIX = "10.213"


class NamespacesUnavailable(RuntimeError):
    """The kernel (or the lack of privileges) refuses to create a network namespace: the
    tests that need one cannot run here. The message says what ``ip`` answered."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed (exit {r.returncode}): "
                           f"{r.stderr.strip()}")
    return r


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _locked():
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class PartitionNetwork:
    """Namespaces on a bridge, with ways to cut members off (see the module doc)."""

    def __init__(self, members: int = 3) -> None:
        if type(members) is not int or not 1 <= members <= 200:
            raise ValueError(f"members must be an int in [1, 200], got {members!r}")
        self.size = members
        self.tag = secrets.token_hex(3)
        self.bridge = f"jwb{self.tag}"
        self._created: list[tuple[str, str]] = []  # ("netns"|"link", name) to delete at close
        self._isolated: set[int] = set()
        self._cut: set[int] = set()
        # first of all, whether the kernel lets us make a namespace at all (as root, with
        # network namespaces in the kernel): if not, nothing else is touched
        first = self.namespace(1)
        r = _ip("netns", "add", first, check=False)
        if r.returncode != 0:
            raise NamespacesUnavailable(
                f"the kernel refused a network namespace (`ip netns add` exit {r.returncode}: "
                f"{r.stderr.strip()}); these tests need root and a kernel with network "
                "namespaces and veth pairs")
        self._created.append(("netns", first))
        try:
            with _locked():
                _clean_up_abandoned()
                self.subnet = self._free_subnet()
                self.host_address = f"{SUBNET_PREFIX}.{self.subnet}.1"
                self._record({"pid": os.getpid(), "subnet": self.subnet})
                self._create()
        except BaseException:
            self.close()
            raise

    # --- names -------------------------------------------------------------------------------

    def namespace(self, i: int) -> str:
        self._check(i)
        return f"jetwake-{self.tag}-m{i}"

    def address(self, i: int) -> str:
        """Member ``i``'s address (1-based: 10.213.N.11 for the first)."""
        self._check(i)
        return f"{SUBNET_PREFIX}.{self.subnet}.{10 + i}"

    def host_port(self, i: int) -> str:
        """The bridge port of member ``i`` (the host end of its veth pair)."""
        self._check(i)
        return f"jwh{self.tag}{i}"

    def command_prefix(self, i: int) -> list[str]:
        """What runs a command inside member ``i``'s namespace (``ip netns exec`` execs the
        command, so its pid is the command's own)."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def _check(self, i: int) -> None:
        if type(i) is not int or not 1 <= i <= self.size:
            raise ValueError(f"member numbers go from 1 to {self.size}, got {i!r}")

    # --- making it ---------------------------------------------------------------------------

    def _free_subnet(self) -> int:
        used = set(int(n) for n in re.findall(
            rf"inet {re.escape(SUBNET_PREFIX)}\.(\d+)\.", _ip("-o", "-4", "addr", "show").stdout))
        for record in STATE_DIR.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                used.add(int(json.loads(record.read_text())["subnet"]))
        for n in range(256):
            if n not in used:
                return n
        raise RuntimeError(f"every {SUBNET_PREFIX}.N.0/24 of this host is in use")

    def _record(self, data: dict) -> None:
        (STATE_DIR / f"{self.tag}.json").write_text(json.dumps(data))

    def _create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._created.append(("link", self.bridge))
        _ip("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(1, self.size + 1):
            ns, port = self.namespace(i), self.host_port(i)
            if i > 1:
                _ip("netns", "add", ns)
                self._created.append(("netns", ns))
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._created.append(("link", port))
            _ip("link", "set", port, "master", self.bridge)
            _ip("link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        # the bridge forwards only once its ports are up (no STP: at once)
        wait_until(lambda: all(self._port_forwarding(i) for i in range(1, self.size + 1)),
                   timeout=10, interval=0.05,
                   what=f"the ports of bridge {self.bridge} to start forwarding")

    def _port_forwarding(self, i: int) -> bool:
        out = subprocess.run(["bridge", "link", "show", "dev", self.host_port(i)],
                             capture_output=True, text=True).stdout
        return "state forwarding" in out

    # --- cutting -----------------------------------------------------------------------------

    def cut(self, i: int) -> None:
        """Cuts member ``i`` off everything (Kafka and its peers), silently."""
        _ip("link", "set", self.host_port(i), "down")
        self._cut.add(i)

    def heal(self, i: int) -> None:
        """Reconnects member ``i`` (undoes :meth:`cut`); returns once its link is up on
        both ends."""
        _ip("link", "set", self.host_port(i), "up")
        self._cut.discard(i)
        wait_until(lambda: self._port_forwarding(i) and "LOWER_UP" in _ip(
                       "-n", self.namespace(i), "link", "show", "eth0").stdout,
                   timeout=10, interval=0.05, what=f"the link of member {i} to come back up")

    def isolate_from_peers(self, i: int) -> None:
        """Cuts only the paths between member ``i`` and the other members: both keep reaching
        the host (Kafka), silently losing what they send each other."""
        for j in range(1, self.size + 1):
            if j == i:
                continue
            self._blackhole(i, j)
            self._blackhole(j, i)
        self._isolated.add(i)

    def rejoin_peers(self, i: int) -> None:
        """Undoes :meth:`isolate_from_peers`: the neighbours are learnt again over ARP."""
        for j in range(1, self.size + 1):
            if j == i:
                continue
            _ip("-n", self.namespace(i), "neigh", "del", self.address(j), "dev", "eth0",
                check=False)
            _ip("-n", self.namespace(j), "neigh", "del", self.address(i), "dev", "eth0",
                check=False)
        self._isolated.discard(i)

    def _blackhole(self, on: int, to: int) -> None:
        # a locally administered unicast address that no interface has: frames to it are
        # flooded by the bridge and discarded by every port (not promiscuous); a permanent
        # entry is never replaced by what ARP learns
        _ip("-n", self.namespace(on), "neigh", "replace", self.address(to), "lladdr",
            "02:00:5e:00:de:ad", "dev", "eth0", "nud", "permanent")

    def heal_all(self) -> None:
        for i in sorted(self._cut):
            self.heal(i)
        for i in sorted(self._isolated):
            self.rejoin_peers(i)

    def reaches(self, i: int, address: str, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from member ``i``'s namespace to ``address:port`` is
        accepted (a probe the tests use to show what a cut cuts)."""
        probe = ("import socket,sys\n"
                 "try:\n"
                 f"    socket.create_connection(({address!r}, {port}), {timeout}).close()\n"
                 "except OSError:\n"
                 "    sys.exit(1)\n")
        r = subprocess.run([*self.command_prefix(i), sys.executable, "-c", probe],
                           capture_output=True, timeout=timeout + 20)
        return r.returncode == 0

    # --- removing it -------------------------------------------------------------------------

    def close(self) -> None:
        """Kills what still runs in the namespaces, removes them and the bridge."""
        _remove(self._created)
        self._created = []
        with contextlib.suppress(OSError):
            (STATE_DIR / f"{self.tag}.json").unlink()

    def __enter__(self) -> "PartitionNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remove(created: list[tuple[str, str]]) -> None:
    for kind, name in reversed(created):
        if kind == "netns":
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)


def _kill_inside(namespace: str) -> None:
    """SIGKILLs, by pid, the processes still running in ``namespace`` (started there by the
    tests: the namespace's name is unique to one run)."""
    pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # a clean-up: it goes on, whether they are gone or not
    poll_until(lambda: not any(_pid_alive(p) for p in pids), timeout=10, interval=0.05)


def _clean_up_abandoned() -> None:
    """Removes the networks of runs whose process is gone (killed before it could close
    them). Called under the lock."""
    for record in STATE_DIR.glob("*.json"):
        try:
            data = json.loads(record.read_text())
            owner = int(data["pid"])
        except (OSError, ValueError, KeyError):
            continue
        if _pid_alive(owner):
            continue
        tag = record.stem
        namespaces = [n.split()[0] for n in _ip("netns", "list", check=False).stdout.splitlines()
                      if n.startswith(f"jetwake-{tag}-m")]
        _remove([("link", f"jwb{tag}")] + [("netns", n) for n in namespaces])
        with contextlib.suppress(OSError):
            record.unlink()
