"""The emulated WAN's bridge against the host's firewall (cluster/wan/namespaces.py `accept_forwarding_on`):
where bridged frames pass iptables, a dockerd's FORWARD policy of DROP would cut the nodes off from each other.
A DROP rule scoped to the test's own bridge stands in for that policy, so the host's policy is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.wan.namespaces import Link, Wan, accept_forwarding_on, stop_accepting_forwarding_on

PREFIX = "rlf"  # the test's own names: never the testbed's `rlw` or the broadcast benchmark's `rlb`
SUBNET = "10.79.0"
BRIDGE_NETFILTER = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
CONNECT_TIMEOUT_S = 1.0


def firewall_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    missing = [tool for tool in ("ip", "tc", "iptables") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    if not BRIDGE_NETFILTER.exists() or BRIDGE_NETFILTER.read_text().strip() != "1":
        return "bridged frames do not pass iptables on this host (br_netfilter off): no firewall to get through"
    return None


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(firewall_unavailable() is not None, reason=str(firewall_unavailable())),
]


def drop_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "DROP"]


def forward_rules() -> str:
    return subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=True).stdout


def connect_outcome(wan: Wan, source: str, address: str) -> str:
    """From `source`'s namespace, open a TCP connection to a closed port at `address`: "refused" means the
    packets got there and back (an RST), "timeout" that they were dropped on the way."""
    probe = (
        "import socket, sys\n"
        f"try: socket.create_connection((sys.argv[1], 9), timeout={CONNECT_TIMEOUT_S})\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except (TimeoutError, socket.timeout): print('timeout')\n"
        "else: print('connected')\n"
    )
    result = subprocess.run(wan.command(source, [sys.executable, "-c", probe, address]), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture
def wan() -> Iterator[Wan]:
    wan = Wan(prefix=PREFIX, subnet=SUBNET)
    wan.remove_leftovers()
    subprocess.run(["iptables", "-w", "-A", *drop_rule(wan.bridge)], check=True)  # what a dockerd's policy does to it
    try:
        wan.create_bridge()
        for name in ("a", "b"):
            wan.add_node(name, Link(up_mbps=100, down_mbps=100))
        yield wan
    finally:
        wan.remove()
        while subprocess.run(["iptables", "-w", "-D", *drop_rule(wan.bridge)], capture_output=True).returncode == 0:
            pass


def test_the_bridge_gets_through_a_firewall_that_drops_forwarded_frames_and_leaves_no_rule_behind(wan: Wan) -> None:
    address_b = wan.address["b"]
    assert connect_outcome(wan, "a", address_b) == "refused"  # through the DROP rule: the bridge's ACCEPT is first

    stop_accepting_forwarding_on(wan.bridge)  # the same network without it: the stand-in policy cuts the nodes off
    assert connect_outcome(wan, "a", address_b) == "timeout"

    accept_forwarding_on(wan.bridge)
    accept_forwarding_on(wan.bridge)  # a second call (a run after a killed one) still leaves one rule
    assert forward_rules().count(f"-i {wan.bridge} -o {wan.bridge} -j ACCEPT") == 1
    assert connect_outcome(wan, "a", address_b) == "refused"

    wan.remove()
    assert f"-i {wan.bridge} -o {wan.bridge} -j ACCEPT" not in forward_rules()
