"""The whole cluster across an emulated wide-area network (docs/wan.md).

    root namespace      the runner and its tools; address <subnet>.254 on the bridge
    rlw-core            Redis, coordinator, reward, learner (<subnet>.1), behind the fleet's core profile
    rlw-w0, rlw-w1 ...  one rollout worker each (<subnet>.2, .3, ...), behind its own profile

Each node's link (cluster/wan/namespaces.py): `tbf` caps on both ends of its veth (uplink, downlink);
in each worker's namespace an nftables table `rlw` redirects the TCP connections it opens to other
nodes into its delay line (cluster/wan/delay_line.py: RTT and jitter) and drops a random share of
packets both ways (loss); a NAT'd worker also drops every new inbound connection. Faults are further
tables, added and deleted whole (`partition`, `set_loss`, `block_port`). Needs root, `ip`, `tc`, `nft`.
Every name starts with `rlw`; `start` deletes what a killed run left and `stop` everything it made.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cluster.wan.delay_line import DelayTable
from cluster.wan.namespaces import Link, Wan, WanError
from cluster.wan.profiles import Fleet, LinkProfile

log = logging.getLogger("wan")

PREFIX = "rlw"
SUBNET = "10.78.0"
HOST_ADDRESS = f"{SUBNET}.254"  # the root namespace's address on the bridge
CORE = "core"
DELAY_LINE_PORT = 15000
DELAY_LINE_MARK = 0x5257
DELAY_LINE_START_TIMEOUT_S = 20.0
BASE_TABLE = PREFIX  # each namespace's permanent rules (redirect, loss, NAT)


def worker_node(index: int) -> str:
    return f"w{index}"


def tbf_burst_bytes(rate_mbps: float) -> int:
    """10 ms at the rate, at least 10 full frames, at most 256 KiB (what a GSO super-packet needs at high
    rates): a burst much larger than that lets small transfers through a slow link at line rate."""
    return int(min(256 * 1024, max(10 * 1514, rate_mbps * 1e6 / 8 * 0.01)))


def link_of(profile: LinkProfile) -> Link:
    """The node's tbf caps: its profile's rates, each with a bucket fitted to it."""
    return Link(
        up_mbps=profile.up_mbps,
        down_mbps=profile.down_mbps,
        up_burst=str(tbf_burst_bytes(profile.up_mbps)),
        down_burst=str(tbf_burst_bytes(profile.down_mbps)),
    )


def nft(namespace_command: list[str], script: str) -> None:
    result = subprocess.run([*namespace_command, "nft", "-f", "-"], input=script, capture_output=True, text=True)
    if result.returncode != 0:
        raise WanError(f"nft failed: {result.stderr.strip()}\n{script}")


def random_drop(loss_percent: float) -> str:
    """An nftables match for `loss_percent` of the packets (out of 100,000: 0.001% resolution)."""
    return f"numgen random mod 100000 < {round(loss_percent * 1000)}"


def netdev_drop_table(table: str, device: str, match: str) -> str:
    """A table dropping the packets `device` receives that `match` (at ingress: the sender's stack never
    learns of the drop, as on a real link; an output-chain drop would fail its send() with EPERM)."""
    return (
        f'table netdev {table} {{\n chain lose {{ type filter hook ingress device "{device}" priority -10;'
        f" {match} drop; }}\n}}\n"
    )


@dataclass
class Testbed:
    __test__ = False  # not a pytest test class, for all its name
    fleet: Fleet
    work_dir: Path
    wan: Wan = field(default_factory=lambda: Wan(prefix=PREFIX, subnet=SUBNET))
    delay_lines: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    num_workers: int = 0

    # the table of contents
    def start(self, num_workers: int) -> None:
        check_available()
        kill_leftover_processes()
        remove_root_tables()
        self.wan.remove_leftovers()
        self.num_workers = num_workers
        try:
            self.wan.create_bridge(HOST_ADDRESS)
            self.wan.add_node(CORE, link_of(self.fleet.core))
            self.set_base_rules(CORE, self.fleet.core)
            for index in range(num_workers):
                node = worker_node(index)
                profile = self.fleet.worker_profile(index)
                self.wan.add_node(node, link_of(profile))
                self.set_base_rules(node, profile, nat=index in self.fleet.nat)
            for index in range(num_workers):
                self.start_delay_line(worker_node(index))
        except BaseException:
            self.stop()
            raise
        log.info(
            "WAN testbed %s: core %s, workers %s",
            self.fleet.name,
            self.address(CORE),
            ", ".join(f"{worker_node(i)}={self.fleet.worker_profile(i).name}" for i in range(num_workers)),
        )

    def stop(self) -> None:
        for process in self.delay_lines.values():
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        self.delay_lines.clear()
        remove_root_tables()
        self.wan.remove()

    # nodes
    def address(self, node: str) -> str:
        return self.wan.address[node]

    def command(self, node: str, argv: list[str]) -> list[str]:
        """`argv` inside `node`'s namespace (the PID of the Popen is the program's: `ip netns exec` execs)."""
        return self.wan.command(node, argv)

    def profile(self, node: str) -> LinkProfile:
        return self.fleet.core if node == CORE else self.fleet.worker_profile(int(node[1:]))

    def set_base_rules(self, node: str, profile: LinkProfile, nat: bool = False) -> None:
        interface = self.wan.node_end(node)
        rules = ""
        if node != CORE:  # the core's profile has no delay of its own: rtt is measured to it
            rules += (
                "chain to_delay_line { type nat hook output priority -100;"
                f" meta mark {DELAY_LINE_MARK} return; ip daddr != {SUBNET}.0/24 return;"
                f" ip daddr {{ {self.address(node)}, {HOST_ADDRESS} }} return;"
                f" tcp dport != {DELAY_LINE_PORT} redirect to :{DELAY_LINE_PORT}; }}\n"
            )
        if nat:  # behind NAT: nothing from outside may open a connection to it
            rules += f'chain nat_in {{ type filter hook input priority 0; iifname "{interface}" ct state new drop; }}\n'
        if rules:
            nft(self.command(node, []), f"table ip {BASE_TABLE} {{\n{rules}}}\n")
        if profile.loss_percent > 0:
            match = random_drop(profile.loss_percent)
            self.add_fault(node, "profile_loss", sent=match, received=match)

    def start_delay_line(self, node: str) -> None:
        profile = self.profile(node)
        peers = {self.address(other): self.profile(other).rtt_ms for other in self.wan.address if other != node}
        table = DelayTable(
            listen_port=DELAY_LINE_PORT,
            mark=DELAY_LINE_MARK,
            rtt_ms=profile.rtt_ms,
            jitter_ms=profile.jitter_ms,
            window_bytes=window_bytes(profile),
            peer_rtt_ms=peers,
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        path = self.work_dir / f"delay-{node}.json"
        path.write_text(json.dumps(table.__dict__))
        log_file = open(self.work_dir / f"delay-{node}.log", "ab")  # noqa: SIM115 - the child holds it
        process = subprocess.Popen(
            self.command(node, [sys.executable, "-m", "cluster.wan.delay_line", str(path)]),
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=Path(__file__).resolve().parents[2],
            start_new_session=True,
        )
        log_file.close()
        self.delay_lines[node] = process
        assert process.stdout is not None
        line = process.stdout.readline()  # "listening", or "" if it died
        if line.strip() != b"listening":
            raise WanError(f"delay line of {node} did not start; see {self.work_dir / f'delay-{node}.log'}")

    # faults: each a pair of netdev tables, added and deleted whole
    def partition(self, node: str) -> None:
        """Cut `node` off: every packet in and out of its link is dropped (connections stall, as a cable pulled)."""
        self.add_fault(node, "partition", sent="", received="")

    def heal(self, node: str) -> None:
        self.remove_fault(node, "partition")

    def set_loss(self, node: str, loss_percent: float) -> None:
        """A loss burst on `node`'s link, both ways, on top of its profile's (`clear_loss` ends it)."""
        match = random_drop(loss_percent)
        self.add_fault(node, "loss", sent=match, received=match)

    def clear_loss(self, node: str) -> None:
        self.remove_fault(node, "loss")

    def block_port(self, node: str, port: int, name: str, except_address: str | None = HOST_ADDRESS) -> None:
        """Drop every packet to and from TCP `port` of `node` on its link: the service is unreachable from the
        other nodes and its connections stall. `except_address` (the runner's, by default) still gets through."""
        sent = f"ip daddr != {except_address} " if except_address else ""
        received = f"ip saddr != {except_address} " if except_address else ""
        self.add_fault(node, name, sent=f"{sent}tcp sport {port}", received=f"{received}tcp dport {port}")

    def unblock_port(self, node: str, name: str) -> None:
        self.remove_fault(node, name)

    def add_fault(self, node: str, name: str, sent: str, received: str) -> None:
        """Drop what `node` sends that matches `sent` (at its veth's far end, in this namespace) and what it
        receives that matches `received` (at its own end, in its namespace)."""
        nft([], netdev_drop_table(f"{PREFIX}_{node}_{name}", self.wan.host_end(node), sent))
        nft(self.command(node, []), netdev_drop_table(f"{PREFIX}_{name}", self.wan.node_end(node), received))

    def remove_fault(self, node: str, name: str) -> None:
        subprocess.run(["nft", "delete", "table", "netdev", f"{PREFIX}_{node}_{name}"], capture_output=True)
        subprocess.run(
            [*self.command(node, []), "nft", "delete", "table", "netdev", f"{PREFIX}_{name}"], capture_output=True
        )


def kill_leftover_processes() -> None:
    """SIGKILL every process still inside an `rlw-` namespace: a killed run's services and delay lines (deleting
    the namespace alone would leave them running, unreachable)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for namespace in [line.split()[0] for line in listing.splitlines() if line.startswith(f"{PREFIX}-")]:
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid], capture_output=True)


def remove_root_tables() -> None:
    """Delete this namespace's `rlw_*` nftables tables (a fault's sent half, on a node's far veth end)."""
    listing = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        family, _, table = line.removeprefix("table ").partition(" ")
        if table.startswith(f"{PREFIX}_"):
            subprocess.run(["nft", "delete", "table", family, table], capture_output=True)


def window_bytes(profile: LinkProfile) -> int:
    """The delay line's window: 4 MiB (Linux's receive-window autotuning reaches 6 MiB), or 2 x the path's
    bandwidth-delay product where that is more, so the window is never what limits a profile's rate."""
    bdp_bytes = max(profile.down_mbps, profile.up_mbps) * 1e6 / 8 * (2 * profile.rtt_ms / 1000)
    return max(4 * 1024 * 1024, math.ceil(2 * bdp_bytes))


def check_available() -> None:
    Wan.check_available()
    if shutil.which("nft") is None:
        raise WanError("`nft` is not on PATH (apt-get install nftables): the testbed drops packets with it")
