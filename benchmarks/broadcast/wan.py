"""An emulated wide-area network on one machine: one network namespace per node, a veth pair into a
shared bridge, and a `tc tbf` token bucket on both ends of every veth, so each node's uplink and
downlink are capped in the kernel (exact; docs/design.md#link-emulation-with-network-namespaces-and-tc). Needs root and `ip`/`tc`.

    node ns  rlb-<name>: veth rlb<name>-n (10.77.0.x)   egress tbf = the node's uplink
    root ns  rlb<name>-h, enslaved to bridge rlb-br      egress tbf = the node's downlink

MTU 65000 on every link: tbf counts link-layer bytes, and at MTU 1500 the TCP/IP headers take 4.4%
of the cap (a 200 Mbit/s bucket gives 191 Mbit/s of goodput); at 65000 they take 0.1%, so the cap is
the goodput and the floor is simply size / B. `calibrate` measures it (raw TCP, within 0.5%).

Everything is named with the `rlb` prefix; `Wan.remove_leftovers()` deletes what a killed run left.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

PREFIX = "rlb"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.77.0"
MTU_BYTES = 65000
TBF_BURST = "256kb"  # >= a few MTUs; ~10 ms at 200 Mbit/s
# The bucket's queue. Deep on purpose: this kernel has tbf but no fair queueing (fq, sfq, fq_codel), and
# with a 100 ms drop-tail queue, 16 TCP flows sharing the learner's uplink (one-to-many) starve each
# other: a flow with a few 64 KB packets in flight recovers from loss only by RTO backoff and got no
# byte for 3 x 15 s. With room for every flow's receive window nothing is dropped and the flows share
# the cap evenly. A single relay flow per link never fills it (it sends at the rate it receives).
TBF_LATENCY = "5s"


class WanError(RuntimeError):
    """The emulated network could not be set up (not root, no `ip`/`tc`, a command failed)."""


@dataclass(frozen=True)
class Link:
    up_mbps: float
    down_mbps: float


def _run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise WanError(f"{' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
    return result.stdout


class Wan:
    """Nodes by name (short: they end up in interface names of at most 15 characters)."""

    def __init__(self) -> None:
        self.address: dict[str, str] = {}
        self.links: dict[str, Link] = {}

    @staticmethod
    def check_available() -> None:
        import os

        if os.geteuid() != 0:
            raise WanError("the broadcast benchmark caps links with network namespaces and tc: run it as root")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise WanError(f"`{tool}` is not on PATH (apt-get install iproute2)")

    @staticmethod
    def remove_leftovers() -> None:
        """Delete every namespace and the bridge a previous (killed) run left behind."""
        for line in _run("ip", "netns", "list").splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(f"{PREFIX}-"):
                subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)

    def create_bridge(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "link", "set", BRIDGE, "mtu", str(MTU_BYTES))
        _run("ip", "link", "set", BRIDGE, "up")

    def add_node(self, name: str, link: Link) -> str:
        """A namespace for `name` on the bridge with `link`'s caps; returns its IP address."""
        index = len(self.address) + 1
        namespace, host_end, node_end = f"{PREFIX}-{name}", f"{PREFIX}{name}-h", f"{PREFIX}{name}-n"
        address = f"{SUBNET}.{index}"
        _run("ip", "netns", "add", namespace)
        _run(
            "ip",
            "link",
            "add",
            host_end,
            "mtu",
            str(MTU_BYTES),
            "type",
            "veth",
            "peer",
            "name",
            node_end,
            "mtu",
            str(MTU_BYTES),
        )
        _run("ip", "link", "set", node_end, "netns", namespace)
        _run("ip", "link", "set", host_end, "master", BRIDGE, "up")
        _run("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{address}/24", "dev", node_end)
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", node_end, "up")
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        self.address[name] = address
        self.set_link(name, link, add=True)
        return address

    def set_link(self, name: str, link: Link, add: bool = False) -> None:
        """(Re)cap a node's uplink (egress of its own end) and downlink (egress of the bridge end)."""
        verb = "add" if add else "change"
        namespace = f"{PREFIX}-{name}"
        tbf = ["tbf", "rate", f"{link.up_mbps}mbit", "burst", TBF_BURST, "latency", TBF_LATENCY]
        _run("ip", "netns", "exec", namespace, "tc", "qdisc", verb, "dev", f"{PREFIX}{name}-n", "root", *tbf)
        tbf[2] = f"{link.down_mbps}mbit"
        _run("tc", "qdisc", verb, "dev", f"{PREFIX}{name}-h", "root", *tbf)
        self.links[name] = link

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside `name`'s namespace (`ip netns exec` execs it: the PID is the program's)."""
        return ["ip", "netns", "exec", f"{PREFIX}-{name}", *argv]

    def remove(self) -> None:
        for name in list(self.address):
            subprocess.run(["ip", "netns", "delete", f"{PREFIX}-{name}"], capture_output=True)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        self.address.clear()


def calibrate(wan: Wan, sender: str, receiver: str, num_bytes: int) -> dict:
    """Raw TCP goodput from `sender` to `receiver` through their caps (no HTTP, no Python chunking):
    how exact the emulated link is. Returns the nominal cap, the measured rate and their ratio."""
    port = 9009
    server = subprocess.Popen(
        wan.command(sender, [sys.executable, "-c", _SEND_PROGRAM, str(port), str(num_bytes)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "listening"
        output = _run(*wan.command(receiver, [sys.executable, "-c", _RECEIVE_PROGRAM, wan.address[sender], str(port)]))
        num_received, seconds = output.split()
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    nominal_mbps = min(wan.links[sender].up_mbps, wan.links[receiver].down_mbps)
    measured_mbps = int(num_received) * 8 / float(seconds) / 1e6
    return {
        "sender": sender,
        "receiver": receiver,
        "num_bytes": int(num_received),
        "seconds": round(float(seconds), 3),
        "nominal_mbps": nominal_mbps,
        "measured_mbps": round(measured_mbps, 2),
        "ratio": round(measured_mbps / nominal_mbps, 4),
    }


_SEND_PROGRAM = """
import socket, sys
port, total = int(sys.argv[1]), int(sys.argv[2])
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", port)); listener.listen(1); print("listening", flush=True)
connection, _ = listener.accept(); block = bytes(1 << 20); sent = 0
while sent < total:
    connection.sendall(block[: min(len(block), total - sent)]); sent += min(len(block), total - sent)
connection.close()
"""

_RECEIVE_PROGRAM = """
import socket, sys, time
started = time.perf_counter()
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))
received = 0
while data := connection.recv(1 << 20):
    received += len(data)
print(received, time.perf_counter() - started)
"""
