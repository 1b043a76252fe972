"""A head, gateways and racks in network namespaces of their own: nodes the head can reach only through
a gateway, to test ClusterShell's tree (`--via clush --topology`) on real sshd hosts.

Each namespace is held by one `sleep` started through `unshare --net` in its own process group, so it
vanishes with that process (and the veth pairs with it): a killed test leaves no namespace behind, and no
name under /run/netns is ever made. The links are point-to-point veth pairs on private 10.41/10.42
addresses that exist only inside these namespaces; nothing is routed, so the head has no route to any
rack at all (the kernel answers "Network is unreachable"), and each gateway reaches its own rack only:

    head 10.41.<g>.1 ── 10.41.<g>.2 gw<g> 10.42.<g>.1 ── 10.42.<g>.<10+i> the rack's nodes

With `flat_client` (the fleet benchmark) a namespace of its own has a direct link to every rack, for the
contenders without gateways (`flat 10.43.<g>.1 ── 10.43.<g>.2 rack`, a route to the rack's /24), and with
`firewall` each rack's sshds admit only its gateway and that client (an iptables rule inside the rack's
namespace): nothing forwarded from the head would get in either.

Every sshd (gateways and nodes, tests/support/hosts.py) runs inside one of these namespaces; the head's
commands run through `nsenter --net` (`TreeLab.run_head`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.hosts import REPO, SSH_PORT, HostFactory, TestHost, record_pid


class Netns:
    """One network namespace, held by a sleeping process of its own (its loopback up)."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep 100000"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        record_pid(self.holder.pid, kind="sleep")
        self.links = 0

    @property
    def prefix(self) -> list[str]:
        """A command prefix that runs the command in this namespace."""
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net"]

    def ip(self, *words: str) -> None:
        subprocess.run([*self.prefix, "ip", *words], check=True, capture_output=True, timeout=10)

    def iptables(self, *words: str) -> None:
        """A firewall rule of this namespace only (its own tables; the machine's are not touched)."""
        subprocess.run([*self.prefix, "iptables", *words], check=True, capture_output=True, timeout=10)

    def pids(self) -> list[int]:
        """Every process in this namespace but its holder."""
        inode = os.stat(f"/proc/{self.holder.pid}/ns/net").st_ino
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.holder.pid:
                continue
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    found.append(int(entry))
        return found

    def signal_all(self, sig: signal.Signals) -> int:
        """Send `sig` to every process in this namespace but its holder (a gateway machine failing: its
        sshd, its sessions, ClusterShell's gateway and its ssh clients); how many were there."""
        count = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
                count += 1
        return count

    def close(self) -> None:
        if self.holder.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.wait(timeout=5)


def _wait_namespace(ns: Netns) -> None:
    # The holder's own namespace exists once `unshare` has exec'd sh; `ip` inside tells.
    for _ in range(200):
        probe = subprocess.run([*ns.prefix, "ip", "-o", "link", "show", "lo"], capture_output=True, text=True)
        if probe.returncode == 0 and "UP" in probe.stdout:
            return
        time.sleep(0.02)
    raise RuntimeError("the test network namespace did not come up")


def link(a: Netns, a_address: str, b: Netns, b_addresses: Sequence[str]) -> None:
    """A veth pair between `a` and `b`, `a_address` on a's end and every address of `b_addresses` on b's."""
    a.links += 1
    b.links += 1
    a_end, b_end = f"v{a.links}", f"p{b.links}"
    a.ip("link", "add", a_end, "type", "veth", "peer", "name", b_end, "netns", str(b.holder.pid))
    a.ip("addr", "add", f"{a_address}/24", "dev", a_end)
    a.ip("link", "set", a_end, "up")
    for address in b_addresses:
        b.ip("addr", "add", f"{address}/24", "dev", b_end)
    b.ip("link", "set", b_end, "up")


@dataclass
class TreeLab:
    """A head, `racks` gateways (gw1, gw2, …) and one rack of nodes behind each, on real sshd hosts."""

    factory: HostFactory
    racks: int
    nodes_per_rack: int = 8
    flat_client: bool = False  # a namespace linked to every rack directly (`flat`)
    firewall: bool = False  # each rack's sshds admit only its gateway (and the flat client)
    head: Netns = field(init=False)
    flat: Netns | None = field(init=False, default=None)
    gateway_ns: list[Netns] = field(init=False, default_factory=list)
    rack_ns: list[Netns] = field(init=False, default_factory=list)
    gateways: list[TestHost] = field(init=False, default_factory=list)
    nodes: dict[str, tuple[int, TestHost]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.head = Netns()
        self.gateway_ns = [Netns() for _ in range(self.racks)]
        self.rack_ns = [Netns() for _ in range(self.racks)]
        self.flat = Netns() if self.flat_client else None
        try:
            self._build()
        except BaseException:
            self.close()  # nothing outlives a lab that did not come up
            raise

    def _build(self) -> None:
        for ns in self._namespaces():
            _wait_namespace(ns)
        for g in range(1, self.racks + 1):
            gw, rack = self.gateway_ns[g - 1], self.rack_ns[g - 1]
            link(self.head, self.head_address(g), gw, [f"10.41.{g}.2"])
            link(gw, f"10.42.{g}.1", rack, [self.node_address(g, i) for i in range(self.nodes_per_rack)])
            if self.flat is not None:
                link(self.flat, self.flat_address(g), rack, [f"10.43.{g}.2"])
                self.flat.ip("route", "add", f"10.42.{g}.0/24", "via", f"10.43.{g}.2")
            if self.firewall:
                admitted = [self.gateway_address(g)] + ([self.flat_address(g)] if self.flat else [])
                rule = ["-p", "tcp", "--dport", str(SSH_PORT)]
                for source in admitted:
                    rack.iptables("-A", "INPUT", *rule, "-s", source, "-j", "ACCEPT")
                rack.iptables("-A", "INPUT", *rule, "-j", "REJECT", "--reject-with", "tcp-reset")
        for g in range(1, self.racks + 1):
            self.gateways.append(
                self.factory.start(f"gw{g}", netns=self.gateway_ns[g - 1].prefix, address=f"10.41.{g}.2")
            )

    @staticmethod
    def node_address(rack: int, index: int) -> str:
        return f"10.42.{rack}.{10 + index}"

    def start_node(
        self, name: str, rack: int, twin: Mapping[str, Any] | str, rig: str, extra_sshd_config: str = ""
    ) -> TestHost:
        index = sum(1 for r, _ in self.nodes.values() if r == rack)
        assert index < self.nodes_per_rack, f"rack {rack} has addresses for {self.nodes_per_rack} nodes"
        host = self.factory.start(
            name, twin, rig=rig, netns=self.rack_ns[rack - 1].prefix, address=self.node_address(rack, index),
            extra_sshd_config=extra_sshd_config,
        )  # fmt: skip
        self.nodes[name] = (rack, host)
        return host

    @staticmethod
    def head_address(rack: int) -> str:
        """The head's address on its link to gateway `rack`: where that gateway sees its connections from."""
        return f"10.41.{rack}.1"

    @staticmethod
    def flat_address(rack: int) -> str:
        """The flat client's address on its link to rack `rack`: where that rack sees its connections from."""
        return f"10.43.{rack}.1"

    def _namespaces(self) -> list[Netns]:
        return [self.head, *self.gateway_ns, *self.rack_ns, *([self.flat] if self.flat else [])]

    def gateway_address(self, rack: int) -> str:
        """The address gateway `rack` has on its rack's link: where its nodes see its connections from."""
        return f"10.42.{rack}.1"

    def write_topology(self, path: Path, head: str = "head", hosts: Collection[str] | None = None) -> Path:
        """ClusterShell's topology.conf: the head reaches the gateways, each gateway its rack's nodes (of
        `hosts` only, where given: a gateway with none of them is left out, as a name that routes nowhere
        would be a node)."""
        chosen = self.nodes if hosts is None else {n: self.nodes[n] for n in hosts}
        routes = {
            gateway.name: [name for name, (rack, _) in chosen.items() if rack == g]
            for g, gateway in enumerate(self.gateways, start=1)
        }
        used = [name for name, nodes in routes.items() if nodes or hosts is None]
        lines = ["[routes]", f"{head}: {','.join(used)}"]
        lines += [f"{gateway}: {','.join(nodes)}" for gateway, nodes in routes.items() if nodes]
        path.write_text("\n".join(lines) + "\n")
        return path

    def write_ssh_config(self, path: Path, also: Sequence[TestHost] = ()) -> Path:
        """How the head reaches its gateways (they are not hosts of the rig), and `also` (gateways behind
        them): the user's --ssh-config."""
        blocks = [
            f"Host {gw.name}\n  HostName {gw.address}\n  Port {gw.port}\n  User root\n"
            f"  IdentityFile {self.factory.client_key}\n  IdentitiesOnly yes\n"
            for gw in [*self.gateways, *also]
        ]
        path.write_text("\n".join(blocks))
        return path

    def run_head(
        self, argv: Sequence[str], home: Path, env: Mapping[str, str] | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """`mgpu-provision ARGV` on the head, in its namespace, with a HOME of its own; gateways run
        ClusterShell's gateway with this interpreter (ClusterShell's CLUSTERSHELL_GW_PYTHON_EXECUTABLE)."""
        home.mkdir(parents=True, exist_ok=True)
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            # Its scratch folders under the test's own: a head killed with its test (SIGTERM to a CI run
            # ends subprocess.run's child with SIGKILL) leaves no /tmp/mgpu-clush-* behind.
            "TMPDIR": str(home),
            "PYTHONPATH": str(REPO),
            "CLUSTERSHELL_GW_PYTHON_EXECUTABLE": sys.executable,
            "CLUSTERSHELL_GW_LOG_DIR": str(home),
            **(env or {}),
        }
        return subprocess.run(
            [*self.head.prefix, sys.executable, "-m", "mgpu_provision", *argv],
            capture_output=True,
            text=True,
            env=environment,
            timeout=timeout,
            cwd=home,
        )

    def close(self) -> None:
        for ns in self.gateway_ns:
            ns.signal_all(signal.SIGCONT)  # a frozen gateway's processes must be able to die
        for ns in self._namespaces():
            ns.close()
