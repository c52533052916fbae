"""Calibrate the WAN testbed: every profile's measured round trip, goodput and loss against its numbers.

For each profile one worker node behind it (and the core behind the core profile), then from the worker:
    rtt       median of 30 one-byte request/replies on an open TCP connection to an echo server in the core
              (through the delay line), and the first reply on a new connection (set-up included)
    goodput   raw TCP, core -> worker (the worker's downlink, or the core's uplink where that is smaller)
              and worker -> core, each transfer about --seconds at the cap
    loss      10,000 UDP datagrams each way at 2,500/s (below every cap), counted at the receiver (the delay
              line carries only TCP)

    python -m cluster.wan.calibrate [--profiles broadband,far] [--out benchmarks/results/wan_calibration.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cluster.wan.namespaces import GOODPUT_FRACTION, RECEIVE_PROGRAM, SEND_PROGRAM
from cluster.wan.profiles import LINKS_FILE, Fleet, read_profiles
from cluster.wan.testbed import CORE, Testbed, worker_node

ECHO_PORT = 9101
BULK_PORT = 9102
UDP_PORT = 9103
NUM_DATAGRAMS = 10_000
DATAGRAMS_PER_S = 2_500  # 2.1 Mbit/s on the wire: under every profile's rate, so the caps drop none


def run_in(testbed: Testbed, node: str, program: str, *args: str, timeout_s: float = 300) -> str:
    result = subprocess.run(
        testbed.command(node, [sys.executable, "-c", program, *args]), capture_output=True, text=True, timeout=timeout_s
    )
    if result.returncode != 0:
        raise RuntimeError(f"{node}: {result.stderr.strip()}")
    return result.stdout


def serve_in(testbed: Testbed, node: str, program: str, *args: str) -> subprocess.Popen[str]:
    server = subprocess.Popen(
        testbed.command(node, [sys.executable, "-c", program, *args]), stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    if server.stdout.readline().strip() != "listening":
        raise RuntimeError(f"{node}: a calibration server did not start")
    return server


def stop(server: subprocess.Popen[str]) -> None:
    if server.poll() is None:
        server.kill()
    server.wait()


def measure_rtt(testbed: Testbed, node: str) -> dict:
    server = serve_in(testbed, CORE, _ECHO_SERVER, str(ECHO_PORT))
    try:
        output = json.loads(run_in(testbed, node, _ECHO_CLIENT, testbed.address(CORE), str(ECHO_PORT)))
    finally:
        stop(server)
    samples_ms = output["samples_ms"]
    return {
        "rtt_ms_median": round(statistics.median(samples_ms), 2),
        "rtt_ms_p10": round(sorted(samples_ms)[len(samples_ms) // 10], 2),
        "rtt_ms_p90": round(sorted(samples_ms)[len(samples_ms) * 9 // 10], 2),
        "first_reply_on_new_connection_ms": round(output["first_ms"], 2),
    }


def measure_goodput(testbed: Testbed, sender: str, receiver: str, num_bytes: int) -> float:
    server = serve_in(testbed, sender, SEND_PROGRAM, str(BULK_PORT), str(num_bytes))
    try:
        received, seconds = run_in(testbed, receiver, RECEIVE_PROGRAM, testbed.address(sender), str(BULK_PORT)).split()
    finally:
        stop(server)
    return int(received) * 8 / float(seconds) / 1e6


def measure_loss(testbed: Testbed, sender: str, receiver: str) -> float:
    server = serve_in(testbed, receiver, _UDP_RECEIVER, str(UDP_PORT))
    try:
        run_in(
            testbed,
            sender,
            _UDP_SENDER,
            testbed.address(receiver),
            str(UDP_PORT),
            str(NUM_DATAGRAMS),
            str(DATAGRAMS_PER_S),
        )
        time.sleep(1.0)  # the last datagrams in flight
        server.terminate()
        output, _ = server.communicate(timeout=10)
    finally:
        stop(server)
    return 100 * (1 - int(output.split()[-1]) / NUM_DATAGRAMS)


def transfer_bytes(rate_mbps: float, seconds: float) -> int:
    """`seconds` of transfer at the cap: long enough that the bucket's burst and the first RTT do not count."""
    return int(min(256 << 20, max(1 << 20, rate_mbps * 1e6 / 8 * seconds)))


def calibrate_profile(testbed: Testbed, index: int, seconds: float) -> dict:
    node = worker_node(index)
    profile = testbed.fleet.worker_profile(index)
    core = testbed.fleet.core
    down_cap_mbps = min(profile.down_mbps, core.up_mbps)
    up_cap_mbps = min(profile.up_mbps, core.down_mbps)
    down_mbps = measure_goodput(testbed, CORE, node, transfer_bytes(down_cap_mbps, seconds))
    up_mbps = measure_goodput(testbed, node, CORE, transfer_bytes(up_cap_mbps, seconds))
    loss_down = measure_loss(testbed, CORE, node)
    loss_up = measure_loss(testbed, node, CORE)
    return {
        "profile": profile.name,
        "target": {
            "rtt_ms": profile.rtt_ms,
            "jitter_ms": profile.jitter_ms,
            "loss_percent": profile.loss_percent,
            "down_mbps": down_cap_mbps,
            "up_mbps": up_cap_mbps,
            "down_goodput_bound_mbps": round(down_cap_mbps * GOODPUT_FRACTION, 2),
            "up_goodput_bound_mbps": round(up_cap_mbps * GOODPUT_FRACTION, 2),
        },
        "measured": {
            **measure_rtt(testbed, node),
            "down_goodput_mbps": round(down_mbps, 2),
            "up_goodput_mbps": round(up_mbps, 2),
            "loss_percent_down": round(loss_down, 3),
            "loss_percent_up": round(loss_up, 3),
        },
        "ratios": {
            "down_goodput_to_bound": round(down_mbps / (down_cap_mbps * GOODPUT_FRACTION), 3),
            "up_goodput_to_bound": round(up_mbps / (up_cap_mbps * GOODPUT_FRACTION), 3),
        },
    }


def calibrate(profile_names: list[str], seconds: float, links_file: Path = LINKS_FILE) -> dict:
    profiles, _ = read_profiles(links_file)
    fleet = Fleet("calibration", profiles["core"], tuple(profiles[name] for name in profile_names))
    testbed = Testbed(fleet, Path(tempfile.mkdtemp(prefix="rlw-calibration-")))
    started_s = time.monotonic()
    testbed.start(len(profile_names))
    try:
        rows = [calibrate_profile(testbed, index, seconds) for index in range(len(profile_names))]
    finally:
        testbed.stop()
    return {
        "command": "python -m cluster.wan.calibrate " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "links_file": str(links_file.relative_to(links_file.parents[2])),
        "seconds": seconds,
        "wall_s": round(time.monotonic() - started_s, 1),
        "profiles": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.wan.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profiles", default="datacenter,broadband,far,mobile")
    parser.add_argument("--seconds", type=float, default=3.0, help="each goodput transfer lasts about this at the cap")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here (default: stdout only)")
    args = parser.parse_args()
    result = calibrate(args.profiles.split(","), args.seconds)
    text = json.dumps(result, indent=2) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)


_ECHO_SERVER = """
import socket, sys, threading
listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("0.0.0.0", int(sys.argv[1]))); listener.listen(8); print("listening", flush=True)
def serve(connection):
    while data := connection.recv(64):
        connection.sendall(data)
while True:
    connection, _ = listener.accept(); connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=serve, args=(connection,), daemon=True).start()
"""

_ECHO_CLIENT = """
import json, socket, sys, time
started = time.perf_counter()
connection = socket.create_connection((sys.argv[1], int(sys.argv[2])))
connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
connection.sendall(b"x"); connection.recv(1); first_ms = (time.perf_counter() - started) * 1000
samples = []
for _ in range(30):
    t = time.perf_counter(); connection.sendall(b"x"); connection.recv(1); samples.append((time.perf_counter() - t) * 1000)
    time.sleep(0.02)
print(json.dumps({"first_ms": first_ms, "samples_ms": samples}))
"""

_UDP_RECEIVER = """
import signal, socket, sys
received = 0
def done(*_):
    print(received, flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, done)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); sock.bind(("0.0.0.0", int(sys.argv[1])))
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)  # a busy machine must not drop what the link kept
print("listening", flush=True)
while True:
    sock.recv(2048); received += 1
"""

_UDP_SENDER = """
import socket, sys, time
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
started, rate = time.perf_counter(), float(sys.argv[4])
for i in range(int(sys.argv[3])):
    sock.sendto(b"x" * 64, (sys.argv[1], int(sys.argv[2])))
    if (wait := started + (i + 1) / rate - time.perf_counter()) > 0:
        time.sleep(wait)
"""


if __name__ == "__main__":
    main()
