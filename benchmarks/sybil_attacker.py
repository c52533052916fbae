"""One attacker process against a coordinator, as `make bench-sybil` (benchmarks/sybil_fleet.py) runs it: asyncio
and the public REST API only, with join credentials it was given, as an operator holding them could.

    python -m benchmarks.sybil_attacker --kind hoard --identities 20 --url URL --run-id ID --tokens T1,T2 \\
        --duration-s 60 --out summary.json

Kinds:
    hoard        `--identities` identities (spread over the tokens in turn) each heartbeat, lease 16 every 0.2 s and
                 never answer; an identity found dead registers again
    hit-and-run  identities register, lease 16 once and vanish (no heartbeat, no answer), one after another as
                 fast as the coordinator lets them
    garbage      `--identities` identities each lease 16, hold them until 1 s before the lease runs out and answer
                 every one with a well-formed group of garbage tokens signed with their own rollout key (the work
                 API accepts it; the reward service refuses it)
    bombs        `--identities` identities each post decode bombs to POST /v1/work/rollouts back to back: one
                 msgpack array of empty maps (one byte each), 16 MiB, halved while the coordinator answers 413
                 (the run's body limit), so each bomb is decoded (benchmarks/decode_bomb.py measures each shape)
A refused registration (429, 403) is tried again a second later: an attacker does not honour Retry-After.
The summary counts what it got: registrations, refusals by status, leases, answers accepted.

Each coroutine speaks HTTP/1.1 itself on a keep-alive connection of its own (`LeanHttp`: the request's bytes
written, the status line, headers and a Content-Length body read back): the attacker shares the cluster's 2
cores here, and a general HTTP client costs ~2 ms of CPU a request, so 200 identities retrying every second took
half a core that the learner lost; the coordinator sees the same requests either way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.decode_bomb import array_of_empty_maps
from engines.interface import Sample
from services.rollout.rollout_groups import build_rollout_group
from shared.messages import TaskGroup
from shared.rollout_mac import sign_rollout
from shared.work_api import LEASE_PATH, MSGPACK_CONTENT_TYPE, ROLLOUTS_PATH, SubmittedGroup, WorkSubmission

LEASE_EVERY_S = 0.2
HEARTBEAT_EVERY_S = 1.0
RETRY_S = 1.0
BOMB_BYTES = 16 * 1024 * 1024  # the first bomb's size; halved while the coordinator answers 413 (over its limit)
MIN_BOMB_BYTES = 64 * 1024
READ_TIMEOUT_S = 30.0
JSON = {"Content-Type": "application/json"}
MSGPACK = {"Content-Type": MSGPACK_CONTENT_TYPE}
LEASE_BODY = b'{"max_groups": 16}'
HEARTBEAT_BODY = b'{"policy_version": 0}'


@dataclass
class Tally:
    registrations: int = 0
    refusals: Counter[int] = field(default_factory=Counter)  # registration status code -> count
    leased: int = 0
    answers_accepted: int = 0
    answers_refused: int = 0
    bombs_sent: int = 0
    bomb_statuses: Counter[int] = field(default_factory=Counter)
    bomb_bytes: int = 0  # the size the bombs settled at


@dataclass
class Identity:
    worker_id: str
    token: str
    rollout_key: bytes


class LeanHttp:
    """HTTP/1.1 POSTs on one keep-alive connection to the coordinator (module doc); it reconnects after an error."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
        self.host, self.port = host, int(port or 80)
        self.stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body); (0, b"") on a network error."""
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
        try:
            if self.stream is None:
                self.stream = await asyncio.open_connection(self.host, self.port)
            reader, writer = self.stream
            writer.write(head.encode() + body)
            status_line = await asyncio.wait_for(reader.readline(), timeout=READ_TIMEOUT_S)
            length, close = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
                elif name.strip().lower() == "connection" and "close" in value.lower():
                    close = True
            answer = await reader.readexactly(length)
            if close:
                self.close()
            return int(status_line.split()[1]), answer
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            self.close()
            return 0, b""

    def close(self) -> None:
        if self.stream is not None:
            self.stream[1].close()
            self.stream = None


class Attacker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tokens: list[str] = args.tokens.split(",")
        self.tally = Tally()
        self.deadline = time.monotonic() + args.duration_s

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def register(self, http: LeanHttp, name: str, join_token: str) -> Identity | None:
        """Register, trying again every RETRY_S while refused, until the deadline."""
        body = json.dumps({"name": name}).encode()
        while self.running():
            status, answer = await http.post("/v1/workers", body, JSON | {"X-RL-Join-Token": join_token})
            if status == 201:
                registered = json.loads(answer)
                self.tally.registrations += 1
                key = bytes.fromhex(registered["access"]["rollout_key_hex"])
                return Identity(registered["worker_id"], registered["token"], key)
            if status:
                self.tally.refusals[status] += 1
            await asyncio.sleep(RETRY_S)
        return None

    async def lease(self, http: LeanHttp, identity: Identity) -> list[tuple[str, TaskGroup]] | None:
        """Leased tasks (maybe none: also on a network error, as from an overloaded coordinator); None when the
        identity is dead (register again)."""
        status, answer = await http.post(LEASE_PATH, LEASE_BODY, JSON | _bearer(identity))
        if status in (401, 404, 410):
            return None
        if status != 200:
            await asyncio.sleep(RETRY_S)
            return []
        tasks = [(t["lease_id"], TaskGroup.model_validate(t["task"])) for t in json.loads(answer)["tasks"]]
        self.tally.leased += len(tasks)
        return tasks

    async def heartbeat(self, http: LeanHttp, identity: Identity) -> bool:
        """False when the identity is dead or unknown (register again); a network error is not that."""
        status, _ = await http.post(
            f"/v1/workers/{identity.worker_id}/heartbeat", HEARTBEAT_BODY, JSON | _bearer(identity)
        )
        return status not in (401, 404, 410)

    # kinds
    async def hoard(self, http: LeanHttp, index: int) -> None:
        join_token = self.tokens[index % len(self.tokens)]
        while self.running():
            identity = await self.register(http, f"sybil-{index}", join_token)
            if identity is None:
                return
            beat_at = 0.0
            while self.running():
                if time.monotonic() >= beat_at:
                    if not await self.heartbeat(http, identity):
                        break
                    beat_at = time.monotonic() + HEARTBEAT_EVERY_S
                if await self.lease(http, identity) is None:
                    break
                await asyncio.sleep(LEASE_EVERY_S)

    async def hit_and_run(self, http: LeanHttp, index: int) -> None:
        while self.running():
            identity = await self.register(http, f"hit-{index}", self.tokens[index % len(self.tokens)])
            if identity is not None:
                await self.lease(http, identity)

    async def garbage(self, http: LeanHttp, index: int) -> None:
        join_token = self.tokens[index % len(self.tokens)]
        while self.running():
            identity = await self.register(http, f"garbage-{index}", join_token)
            if identity is None:
                return
            while self.running():
                leased = await self.lease(http, identity)
                if leased is None:
                    break
                if not leased:
                    await asyncio.sleep(LEASE_EVERY_S)
                    continue
                answer_at = time.monotonic() + self.args.lease_s - 1.0
                while time.monotonic() < answer_at and self.running():  # keep the identity alive meanwhile
                    await self.heartbeat(http, identity)
                    await asyncio.sleep(min(HEARTBEAT_EVERY_S, max(0.0, answer_at - time.monotonic())))
                await self.answer_garbage(http, identity, leased)

    async def answer_garbage(self, http: LeanHttp, identity: Identity, leased: list[tuple[str, TaskGroup]]) -> None:
        garbage = Sample(prompt_token_ids=[1, 2], token_ids=[3], logprobs=[-1.0], text="7", finish_reason="length")
        answers = []
        for lease_id, task in leased:
            group = build_rollout_group(task, [garbage] * task.num_samples, identity.worker_id, 0, 0.01)
            answers.append(SubmittedGroup(lease_id=lease_id, group=sign_rollout(group, identity.rollout_key).encode()))
        body = WorkSubmission(run_id=self.args.run_id, groups=answers).encode()
        status, answer = await http.post(ROLLOUTS_PATH, body, MSGPACK | _bearer(identity))
        if status == 200:
            outcome = json.loads(answer)
            self.tally.answers_accepted += len(outcome["accepted"])
            self.tally.answers_refused += len(outcome["refused"])

    async def bombs(self, http: LeanHttp, index: int) -> None:
        identity = await self.register(http, f"bomber-{index}", self.tokens[index % len(self.tokens)])
        if identity is None:
            return
        size = BOMB_BYTES
        bomb = array_of_empty_maps(size)
        while self.running():
            status, _ = await http.post(ROLLOUTS_PATH, bomb, MSGPACK | _bearer(identity))
            self.tally.bombs_sent += 1
            self.tally.bomb_statuses[status] += 1
            # 413, or a reset (the coordinator refused it by its length and closed while it was being sent): over
            # the run's body limit, so halve it until it gets in
            if status in (0, 413) and size > MIN_BOMB_BYTES:
                size //= 2
                bomb = array_of_empty_maps(size)
        self.tally.bomb_bytes = size

    async def run(self) -> None:
        kind = {"hoard": self.hoard, "hit-and-run": self.hit_and_run, "garbage": self.garbage, "bombs": self.bombs}
        attack = kind[self.args.kind]
        connections = [LeanHttp(self.args.url) for _ in range(self.args.identities)]
        try:
            await asyncio.gather(*(attack(http, index) for index, http in enumerate(connections)))
        finally:
            for http in connections:
                http.close()


def _bearer(identity: Identity) -> dict[str, str]:
    return {"Authorization": f"Bearer {identity.token}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=("hoard", "hit-and-run", "garbage", "bombs"), required=True)
    parser.add_argument("--identities", type=int, default=20, help="identities (or senders) at once")
    parser.add_argument("--url", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--tokens", required=True, help="join tokens, comma-separated: identities take them in turn")
    parser.add_argument("--lease-s", type=float, default=15.0, help="the run's lease time (garbage answers before it)")
    parser.add_argument("--duration-s", type=float, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    attacker = Attacker(args)
    cpu_before = time.process_time()
    asyncio.run(attacker.run())
    tally = attacker.tally
    summary = {
        "kind": args.kind,
        "identities": args.identities,
        "credentials": len(attacker.tokens),
        "registrations": tally.registrations,
        "registrations_refused": {str(code): n for code, n in sorted(tally.refusals.items())},
        "leased": tally.leased,
        "answers_accepted": tally.answers_accepted,
        "answers_refused": tally.answers_refused,
        "bombs_sent": tally.bombs_sent,
        "bomb_statuses": {str(code): n for code, n in sorted(tally.bomb_statuses.items())},
        "bomb_bytes": tally.bomb_bytes,
        "cpu_s": round(time.process_time() - cpu_before, 2),
    }
    args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
