"""An emulated wide-area network on one machine: one network namespace per node, a veth pair into a
shared bridge, and a `tc tbf` token bucket on both ends of every veth, so each node's uplink and
downlink are capped in the kernel (exact; docs/design.md#link-emulation-with-network-namespaces-and-tc). Needs root and `ip`/`tc`.

    node ns  rlb-<name>: veth rlb<name>-n (10.77.0.x)   egress tbf = the node's uplink
    root ns  rlb<name>-h, enslaved to bridge rlb-br      egress tbf = the node's downlink

MTU 1500 on every link, the internet's. tbf counts link-layer bytes: a full TCP segment is 1514 bytes
on the wire (Ethernet 14 + IP 20 + TCP 20 + timestamps 12) for 1448 bytes of payload, so a B Mbit/s
bucket gives at most B * 1448/1514 = 0.956 B of goodput. `calibrate` measures it (raw TCP).

Queue depth. tbf's `latency` bounds how long a packet may wait in the bucket's drop-tail queue (its
`limit` in bytes is rate * latency). Every link gets `queue_ms` (default 100 ms: a plain access
link's buffer; cable and DSL modems hold 50-500 ms at full load). This kernel has tbf, htb and the
fifos but no fair queueing (fq, sfq, fq_codel, cake: `tc qdisc add ... fq_codel` says "unknown"), so
N flows through one bucket share it only as fairly as drop-tail TCP does: `shared_uplink` measures that
(N raw TCP flows out of the learner at once) and the driver reports it. At MTU 1500 a 100 ms queue at
200 Mbit/s holds ~1650 packets, ~100 per flow with 16 flows: losses are repaired by fast retransmit,
not by RTO backoff (the starvation seen at MTU 65000, where the same queue held 38 packets).

Everything is named with the Wan's prefix (`rlb` here, `rlw` for the cluster testbed); `Wan.remove_leftovers()`
deletes what a killed run left. The host's firewall: where bridged frames pass iptables (br_netfilter, as Docker
leaves it), the bridge gets its own ACCEPT rule in the FORWARD chain, so a DROP policy (a dockerd's) does not cut
the nodes off (`accept_forwarding_on`).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

PREFIX = "rlb"
SUBNET = "10.77.0"
MTU_BYTES = 1500
WIRE_BYTES_PER_SEGMENT = MTU_BYTES + 14  # Ethernet header: tbf on a veth counts it
TCP_PAYLOAD_PER_SEGMENT = MTU_BYTES - 20 - 20 - 12  # IP, TCP, TCP timestamp option
GOODPUT_FRACTION = TCP_PAYLOAD_PER_SEGMENT / WIRE_BYTES_PER_SEGMENT  # 0.9564: TCP goodput / line rate
# The bucket: 10 ms at 200 Mbit/s. It must hold a whole GSO super-packet (TCP hands the veth up to 64 KB
# plus headers at once; tbf counts every segment's headers in it): with a smaller bucket tbf splits each
# one into 1514-byte frames in software, and at N = 16 that alone took 63% of both cores (softirq) and
# 7 CPU s/GiB per receiver, against 5% and 1.5 with this bucket (64 MiB runs, 2026-11-24): the
# emulator's cost, not the relay's. The rate is unchanged: raw TCP still measures the goodput bound.
TBF_BURST = "256kb"
QUEUE_MS = 100.0


class WanError(RuntimeError):
    """The emulated network could not be set up (not root, no `ip`/`tc`, a command failed)."""


@dataclass(frozen=True)
class Link:
    up_mbps: float
    down_mbps: float
    up_queue_ms: float = QUEUE_MS  # the uplink's drop-tail queue (tbf latency)
    down_queue_ms: float = QUEUE_MS
    up_burst: str = TBF_BURST  # tbf's bucket, each way (the cluster testbed fits it to the rate)
    down_burst: str = TBF_BURST


def _run(*args: str) -> str:
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise WanError(f"{' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
    return result.stdout


class Wan:
    """Nodes by name (short: they end up in interface names of at most 15 characters). `prefix` names
    every namespace, link and the bridge (the broadcast benchmark's `rlb`, the cluster testbed's `rlw`:
    two users never delete each other's leftovers); `subnet` is the nodes' /24."""

    def __init__(self, prefix: str = PREFIX, subnet: str = SUBNET) -> None:
        self.prefix = prefix
        self.subnet = subnet
        self.bridge = f"{prefix}-br"
        self.address: dict[str, str] = {}
        self.links: dict[str, Link] = {}
        self.namespaces: list[str] = []

    @staticmethod
    def check_available() -> None:
        import os

        if os.geteuid() != 0:
            raise WanError("the broadcast benchmark caps links with network namespaces and tc: run it as root")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise WanError(f"`{tool}` is not on PATH (apt-get install iproute2)")

    def remove_leftovers(self) -> None:
        """Delete every link and namespace with this prefix, and the bridge, that a previous (killed) run left."""
        for line in _run("ip", "netns", "list").splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(f"{self.prefix}-"):
                subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        remove_links(self.prefix)
        stop_accepting_forwarding_on(self.bridge)

    def create_bridge(self, address: str | None = None) -> None:
        """The bridge every node's veth joins; `address` (e.g. "<subnet>.254") gives this (root) namespace
        an address on it, so the machine's own tools reach the nodes."""
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "mtu", str(MTU_BYTES))
        if address is not None:
            _run("ip", "addr", "add", f"{address}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        accept_forwarding_on(self.bridge)

    def add_node(self, name: str, link: Link) -> str:
        """A namespace for `name` on the bridge with `link`'s caps; returns its IP address."""
        index = len(self.address) + 1
        namespace, host_end, node_end = self.namespace(name), self.host_end(name), self.node_end(name)
        address = f"{self.subnet}.{index}"
        _run("ip", "netns", "add", namespace)
        self.namespaces.append(namespace)  # removed by `remove` even if the rest of this fails
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
        _run("ip", "link", "set", host_end, "master", self.bridge, "up")
        _run("ip", "netns", "exec", namespace, "ip", "addr", "add", f"{address}/24", "dev", node_end)
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", node_end, "up")
        _run("ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        self.address[name] = address
        self.set_link(name, link, add=True)
        return address

    def set_link(self, name: str, link: Link, add: bool = False) -> None:
        """(Re)cap a node's uplink (egress of its own end) and downlink (egress of the bridge end)."""
        verb = "add" if add else "change"
        namespace = self.namespace(name)
        up = ["tbf", "rate", f"{link.up_mbps}mbit", "burst", link.up_burst, "latency", f"{link.up_queue_ms}ms"]
        _run("ip", "netns", "exec", namespace, "tc", "qdisc", verb, "dev", self.node_end(name), "root", *up)
        down = ["tbf", "rate", f"{link.down_mbps}mbit", "burst", link.down_burst, "latency", f"{link.down_queue_ms}ms"]
        _run("tc", "qdisc", verb, "dev", self.host_end(name), "root", *down)
        self.links[name] = link

    def uplink_bytes(self, name: str) -> int:
        """Link-layer bytes `name` has sent so far (what its uplink carried: headers, HTTP and Redis included)."""
        with open(f"/sys/class/net/{self.host_end(name)}/statistics/rx_bytes") as counter:
            return int(counter.read())

    def command(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside `name`'s namespace (`ip netns exec` execs it: the PID is the program's)."""
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    def namespace(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def host_end(self, name: str) -> str:
        """The node's veth end in this namespace, on the bridge (its egress is the node's downlink)."""
        return f"{self.prefix}{name}-h"

    def node_end(self, name: str) -> str:
        """The node's veth end in its own namespace (its egress is the node's uplink)."""
        return f"{self.prefix}{name}-n"

    def remove(self) -> None:
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        remove_links(self.prefix)
        stop_accepting_forwarding_on(self.bridge)
        self.namespaces.clear()
        self.address.clear()


def _forward_accept_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def accept_forwarding_on(bridge: str) -> None:
    """Let the nodes' packets through the host's iptables FORWARD chain. Where `br_netfilter` is loaded
    (net.bridge.bridge-nf-call-iptables = 1, as Docker leaves it), frames crossing a bridge pass that chain,
    and a dockerd that turns IP forwarding on as it starts sets its policy to DROP: every connection between
    nodes would then time out. The rule matches only this bridge, and `stop_accepting_forwarding_on` removes
    it. No `iptables`: no Docker and no such policy, nothing to do."""
    if shutil.which("iptables") is None:
        return
    stop_accepting_forwarding_on(bridge)  # one rule, however many runs were killed before this one
    added = subprocess.run(["iptables", "-w", "-I", *_forward_accept_rule(bridge)], capture_output=True, text=True)
    if added.returncode != 0:  # policy: go on; without a firewall that drops bridged frames, nothing is missing
        log.warning(
            "could not let %s's traffic through iptables FORWARD (%s): if its policy is DROP (a dockerd that "
            "turned IP forwarding on sets it), the nodes will not reach each other",
            bridge,
            added.stderr.strip(),
        )


def stop_accepting_forwarding_on(bridge: str) -> None:
    """Delete `accept_forwarding_on`'s rule (every copy a killed run left)."""
    if shutil.which("iptables") is None:
        return
    while subprocess.run(["iptables", "-w", "-D", *_forward_accept_rule(bridge)], capture_output=True).returncode == 0:
        pass


def remove_links(prefix: str = PREFIX, timeout_s: float = 10.0) -> None:
    """Delete the bridge and every `<prefix>*` link left in the root namespace (deleting a veth end deletes
    its peer), until none is left: a deleted namespace's veths go away asynchronously, and a new run's
    `ip link add` of the same name fails while one lingers."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        names = [line.split(":")[1].strip().split("@")[0] for line in _run("ip", "-o", "link", "show").splitlines()]
        leftovers = [name for name in names if name.startswith(prefix)]
        if not leftovers:
            return
        if time.monotonic() >= deadline_s:
            raise WanError(f"links {leftovers} are still there {timeout_s}s after deleting them")
        for name in leftovers:
            subprocess.run(["ip", "link", "delete", name], capture_output=True)
        time.sleep(0.1)


def calibrate(wan: Wan, sender: str, receiver: str, num_bytes: int) -> dict:
    """Raw TCP goodput from `sender` to `receiver` through their caps (no HTTP, no Python chunking):
    how exact the emulated link is. Returns the nominal cap, the measured rate and their ratio."""
    port = 9009
    server = subprocess.Popen(
        wan.command(sender, [sys.executable, "-c", SEND_PROGRAM, str(port), str(num_bytes)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "listening"
        output = _run(*wan.command(receiver, [sys.executable, "-c", RECEIVE_PROGRAM, wan.address[sender], str(port)]))
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
        "expected_goodput_mbps": round(nominal_mbps * GOODPUT_FRACTION, 2),
        "ratio_to_expected_goodput": round(measured_mbps / (nominal_mbps * GOODPUT_FRACTION), 4),
    }


def shared_uplink(wan: Wan, sender: str, receivers: list[str], num_bytes_each: int, port: int = 9010) -> dict:
    """Raw TCP from `sender` to every receiver at once (one flow each, through the sender's uplink):
    how fairly drop-tail TCP shares one bucket. Returns the aggregate goodput and each flow's seconds
    (a starved flow shows as a long tail)."""
    servers = [
        subprocess.Popen(
            wan.command(sender, [sys.executable, "-c", SEND_PROGRAM, str(port + i), str(num_bytes_each)]),
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(len(receivers))
    ]
    seconds: dict[str, float] = {}
    try:
        for server in servers:
            assert server.stdout is not None
            server.stdout.readline()  # "listening"

        def receive(i: int, name: str) -> None:
            argv = [sys.executable, "-c", RECEIVE_PROGRAM, wan.address[sender], str(port + i)]
            seconds[name] = float(_run(*wan.command(name, argv)).split()[1])

        threads = [threading.Thread(target=receive, args=(i, name)) for i, name in enumerate(receivers)]
        started_s = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall_s = time.perf_counter() - started_s
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
            server.wait()
    nominal_mbps = wan.links[sender].up_mbps
    floor_s = num_bytes_each * len(receivers) * 8 / (nominal_mbps * GOODPUT_FRACTION * 1e6)
    return {
        "sender": sender,
        "num_flows": len(receivers),
        "num_bytes_each": num_bytes_each,
        "aggregate_mbps": round(num_bytes_each * len(receivers) * 8 / wall_s / 1e6, 2),
        "goodput_floor_s": round(floor_s, 3),
        "slowest_flow_s": round(max(seconds.values()), 3),
        "fastest_flow_s": round(min(seconds.values()), 3),
        "slowest_to_floor": round(max(seconds.values()) / floor_s, 3),
    }


# Raw TCP programs, run inside a namespace: the sender listens on argv[1] and sends argv[2] bytes to whoever
# connects; the receiver connects to argv[1]:argv[2], reads to the end and prints the bytes and the seconds from
# the first byte (the connection's set-up, a round trip on a long link, is not the link's rate).
SEND_PROGRAM = """
import socket, sys
port, total = int(sys.argv[1]), int(sys.argv[2])
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", port)); listener.listen(1); print("listening", flush=True)
connection, _ = listener.accept(); block = bytes(1 << 20); sent = 0
while sent < total:
    connection.sendall(block[: min(len(block), total - sent)]); sent += min(len(block), total - sent)
connection.close()
"""

RECEIVE_PROGRAM = """
import socket, sys, time
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))
received, started = 0, None
while data := connection.recv(1 << 20):
    started = started or time.perf_counter()
    received += len(data)
print(received, time.perf_counter() - (started or time.perf_counter()))
"""
