"""Which workers can be reached from outside: the coordinator connects back to each worker's chunk server
(issue 36, item 3). The relay plan makes a worker a parent only once a probe reached it
(shared/weight_channel/relay_plan.py): a worker behind NAT or a firewall is a leaf, so no child waits
`chunk_wait_s` on a parent nobody can connect to.

    every TICK_S, or at once when woken (a registration, a rejoin):
      due     the workers owed a probe: asked for (a registration or a rejoin, which clears the old
              result), a relay child reported a miss of it (`broadcast:relay-misses`: its children may not
              reach it), never probed by this coordinator (or at another URL), or probed PROBE_INTERVAL_S
              ago; among the active and standby workers with a chunk server as of the control loop's last
              pass, asked-for first, then the longest unprobed
      probe   holder_answers(url): a new TCP connection and GET /healthz answered 200 "ok" within
              PROBE_TIMEOUT_S; each probe its own task, at most MAX_IN_FLIGHT at once, host names
              looked up in MAX_LOOKUPS threads of the probes' own
      record  `inbound_reachable` in the worker's record (WorkerInfo), when it changed, and only while
              the record still advertises the URL probed (a worker that left, or rejoined elsewhere, is
              not touched)

What a probe shows: a connection from the coordinator's network reached the chunk server. With the
coordinator on the public internet that is "reachable from the internet", which is what a relay child
on another network needs. It does not see networks the coordinator is outside of (two workers behind one
NAT reach each other, yet both are leaves), nor a firewall that admits the coordinator's address only.
`[broadcast] probe_inbound = false` turns probing off: every worker with a chunk server is then taken
as reachable, as before this module.

Cost with thousands of workers: at most MAX_IN_FLIGHT sockets open, each for at most PROBE_TIMEOUT_S, so
with every address silent MAX_IN_FLIGHT / PROBE_TIMEOUT_S probes a second (960 a minute: past that many
silent workers the interval stretches); a reachable worker answers in a round trip. The due list comes from
the control loop's snapshot (no read of the registry), the misses hash is one read a tick, and a record is
written only when its reachability changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import redis

from services.coordinator.broadcast_times import RelayKeys
from services.coordinator.worker_registry import WorkerRegistry
from shared.api import WorkerInfo
from shared.bus import redis_text
from shared.weight_channel import holder_answers

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 2.0  # connect + request + answer; a LAN or the internet answers in well under 1 s
PROBE_INTERVAL_S = 60.0  # a worker that opens (or loses) its port is a parent (or a leaf) within about this
MAX_IN_FLIGHT = 32  # probes at once: sockets and event-loop work stay bounded, whatever the fleet's size
MAX_LOOKUPS = 4  # host-name lookups at once, in threads of their own (a slow DNS holds up no other thread pool)
TICK_S = 1.0  # how often the due list is looked at (a registration does not wait for it)
REACHABLE, UNREACHABLE = "reachable", "unreachable"

# KEYS: the worker hash. ARGV: the endpoint URL probed, '1' (reachable) or '0'. Sets `inbound_reachable`
# only while the record advertises that URL (no record: the worker deregistered). Returns 1 when it did.
_RECORD_LUA = """
if redis.call('HGET', KEYS[1], 'endpoint_url') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'inbound_reachable', ARGV[2])
return 1
"""


@dataclass(frozen=True)
class Probe:
    worker_id: str
    endpoint_url: str
    recorded: bool | None  # what its record says now (None: nothing, or unknown: written whatever the outcome)


class InboundProbes:
    """The connect-back probes (module doc). `relay_workers()`: the active and standby workers with a chunk
    server, as of the control loop's last pass. `request` may be called from any thread."""

    def __init__(
        self, registry: WorkerRegistry, relay_workers: Callable[[], list[WorkerInfo]], *, enabled: bool = True
    ) -> None:
        self.enabled = enabled  # [broadcast] probe_inbound: off, nothing is probed or recorded
        self.redis = registry.redis
        self.keys = registry.keys
        self.relay_workers = relay_workers
        self.clock = time.monotonic  # seconds of the probe schedule (tests replace it)
        self._record_script = registry.redis.register_script(_RECORD_LUA)
        self._lock = threading.Lock()  # guards _asked: routes run in FastAPI's thread pool
        self._asked: dict[str, str] = {}  # worker id -> URL: probe at once, write whatever the outcome
        self._probed: dict[str, tuple[str, float]] = {}  # worker id -> (URL, clock) of its latest probe here
        self._misses_seen: dict[str, int] = {}  # parent URL -> its misses when last read
        self._in_flight: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._resolver: ThreadPoolExecutor | None = None  # the probes' name lookups, while the loop runs
        self.num_probes: Counter[str] = Counter()  # REACHABLE / UNREACHABLE -> probes with that outcome

    def request(self, worker_id: str, endpoint_url: str) -> None:
        """Probe this worker now (it registered or rejoined); nothing for a worker without a chunk server."""
        if not endpoint_url or not self.enabled:
            return
        with self._lock:
            self._asked[worker_id] = endpoint_url
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # the loop
    async def run_forever(self) -> None:
        if not self.enabled:
            return
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        self._resolver = ThreadPoolExecutor(MAX_LOOKUPS, thread_name_prefix="probe-lookup")
        try:
            while True:
                try:
                    await self.tick()
                except redis.RedisError as exc:  # Redis down or restarting: try again next tick
                    log.warning("reachability probes: %s", exc)
                except Exception:  # boundary: a failed tick is logged and the next one tried; the API keeps serving
                    log.exception("reachability probes: a tick failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=TICK_S)
                self._wake.clear()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._resolver.shutdown(wait=False, cancel_futures=True)  # a lookup in progress ends on its own

    async def tick(self) -> None:
        """Start the probes owed, as many as MAX_IN_FLIGHT allows; the rest wait for a later tick."""
        workers = self.relay_workers()
        missed = await asyncio.to_thread(self.read_new_misses)
        if missed:
            with self._lock:
                self._asked |= {w.worker_id: w.endpoint_url for w in workers if w.endpoint_url in missed}
        for probe in self.due(workers)[: max(0, MAX_IN_FLIGHT - len(self._in_flight))]:
            with self._lock:
                self._asked.pop(probe.worker_id, None)
            self._in_flight.add(probe.worker_id)
            task = asyncio.create_task(self.probe(probe), name=f"probe-{probe.worker_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # steps
    def read_new_misses(self) -> set[str]:
        """Parent URLs whose children reported a miss since the last read (the heartbeat script counts them)."""
        counts = {}
        for url, value in self.redis.hgetall(RelayKeys.of(self.keys).misses).items():
            count_text = redis_text(value).rpartition(" ")[2]
            counts[redis_text(url)] = int(count_text) if count_text.isdigit() else 0
        grown = {url for url, count in counts.items() if count > self._misses_seen.get(url, 0)}
        self._misses_seen = counts
        return grown

    def due(self, workers: list[WorkerInfo]) -> list[Probe]:
        """The probes owed now, most urgent first (module doc), none for a worker already being probed."""
        with self._lock:
            asked = dict(self._asked)
        now = self.clock()
        live = {w.worker_id for w in workers}
        # forget those that left (kept a while: a worker probed at registration may not be in the snapshot yet)
        self._probed = {
            worker_id: (url, at)
            for worker_id, (url, at) in self._probed.items()
            if worker_id in live or now - at < PROBE_INTERVAL_S
        }
        owed: list[tuple[float, WorkerInfo]] = []
        for w in workers:
            if w.worker_id in asked or w.worker_id in self._in_flight:
                continue
            url, probed_at = self._probed.get(w.worker_id, ("", -math.inf))
            if url != w.endpoint_url or now - probed_at >= PROBE_INTERVAL_S:
                owed.append((probed_at if url == w.endpoint_url else -math.inf, w))
        owed.sort(key=lambda item: item[0])
        first = [Probe(worker_id, url, None) for worker_id, url in asked.items() if worker_id not in self._in_flight]
        return first + [Probe(w.worker_id, w.endpoint_url, w.inbound_reachable) for _, w in owed]

    async def probe(self, probe: Probe) -> None:
        """One probe and its record; a Redis error leaves it owed (it is probed again next tick)."""
        try:
            reachable = await holder_answers(probe.endpoint_url, PROBE_TIMEOUT_S, self._resolver)
            self.num_probes[REACHABLE if reachable else UNREACHABLE] += 1
            if probe.recorded is not reachable:
                await asyncio.to_thread(self.record, probe, reachable)
            self._probed[probe.worker_id] = (probe.endpoint_url, self.clock())
        except redis.RedisError as exc:
            log.warning("reachability of worker %s not recorded: %s", probe.worker_id, exc)
        finally:
            self._in_flight.discard(probe.worker_id)

    def record(self, probe: Probe, reachable: bool) -> None:
        written = self._record_script(
            keys=[self.keys.worker(probe.worker_id)], args=[probe.endpoint_url, int(reachable)]
        )
        if not int(written):
            return
        if not reachable:
            log.info(
                "worker %s: the coordinator cannot reach its chunk server %s (NAT, a firewall?): it fetches weights "
                "and relays to nobody",
                probe.worker_id,
                probe.endpoint_url,
            )
        elif probe.recorded is False:
            log.info(
                "worker %s: its chunk server %s can be reached now: it may relay", probe.worker_id, probe.endpoint_url
            )
