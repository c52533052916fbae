"""The learner's newest weight announcement, for many long-polling workers (GET /v1/weights/latest,
services/coordinator/routers/weights.py). Workers hold no Redis credentials: this is how they learn
that a version can be fetched.

    watcher thread (one per coordinator)   XREVRANGE the newest entries of WEIGHTS, keep the newest that
                                           decodes (undecodable ones and other runs' are skipped, logged),
                                           then XREAD BLOCK for the next entry; each new announcement is
                                           handed to the event loop (`call_soon_threadsafe`)
    event loop                             sets the current `asyncio.Event` and replaces it: every waiter
                                           wakes at once, re-checks, answers or waits on the new event

So ~1,000 waiting workers cost one blocked Redis connection and 1,000 suspended coroutines, not a thread
each, and a new announcement reaches all of them within milliseconds of the learner's XADD (it is inside
the measured T_bcast). The answer's JSON is encoded once per announcement, not once per waiter.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import redis

from shared.api import is_news
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.messages import WeightsPublished
from shared.retry import Backoff, is_redis_outage
from shared.streams import WEIGHTS

log = logging.getLogger(__name__)

BLOCK_MS = 100  # the watcher's XREAD BLOCK: how long stop() may take (a new entry ends the block at once; idle, 10 reads a second)
NUM_SCANNED = 16  # entries looked at for the newest decodable one (garbage on top never hides it)


@dataclass(frozen=True)
class Announcement:
    message: WeightsPublished
    json_bytes: bytes  # the response body, encoded once


class FeedNotReadyError(RuntimeError):
    """The watcher has not read the stream yet (Redis unreachable since the coordinator started)."""


class WeightsFeed:
    def __init__(self, client: redis.Redis, keys: RunKeys, *, block_ms: int = BLOCK_MS) -> None:
        self.bus = StreamBus(client, keys, service="coordinator")
        self.run_id = keys.run_id
        self.block_ms = block_ms
        self.num_skipped = 0  # entries skipped: undecodable, or another run's
        self.num_waiting = 0  # long polls waiting now (event loop only)
        self._newest: Announcement | None = None  # written and read on the event loop only
        self._loaded = False  # the stream was read at least once
        self._closing = False  # the server is stopping: no long poll waits (event loop only)
        self._changed = asyncio.Event()  # set (and replaced) on every change
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # the event loop's side
    async def start(self, load_timeout_s: float = 5.0) -> None:
        """Start the watcher on the event loop that serves the waiters, and wait for its first read of the
        stream (at most `load_timeout_s`: with Redis unreachable, the endpoint answers 503 until then)."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._watch, name="weights-feed", daemon=True)
        self._thread.start()
        try:
            async with asyncio.timeout(load_timeout_s):
                while not self._loaded:
                    await self._changed.wait()
        except TimeoutError:
            log.warning("weights announcements not read within %.0fs of start; retrying", load_timeout_s)

    def release_waiters(self) -> None:
        """On the event loop, when the server starts to stop: every waiting long poll ends now with what it has
        (a 204 when nothing is news), and later ones do not wait, so open polls do not hold the stop."""
        self._closing = True
        self._wake_waiters()

    async def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.block_ms / 1000 + 5.0)

    async def wait_for_news(
        self, after_version: int, after_sha256: str | None, timeout_s: float
    ) -> Announcement | None:
        """The newest announcement as soon as it is news to a reader holding (`after_version`,
        `after_sha256`) (shared.api.is_news), waiting at most `timeout_s`; None if none came. Raises
        FeedNotReadyError if the stream was never read by then."""
        deadline_s = asyncio.get_running_loop().time() + timeout_s
        self.num_waiting += 1
        try:
            while True:
                changed = self._changed  # taken before the check: a change after it sets this very event
                newest = self._newest
                if newest is not None and is_news(newest.message, after_version, after_sha256):
                    return newest
                remaining_s = deadline_s - asyncio.get_running_loop().time()
                if remaining_s <= 0 or self._closing:
                    break
                try:
                    async with asyncio.timeout(remaining_s):
                        await changed.wait()
                except TimeoutError:
                    break
        finally:
            self.num_waiting -= 1
        if not self._loaded:
            raise FeedNotReadyError("the weights announcements were not read yet (is Redis reachable?)")
        return None

    def _publish(self, newest: Announcement | None) -> None:
        """On the event loop: note the newest announcement (None: none yet) and wake every waiter."""
        self._newest = newest if newest is not None else self._newest
        self._loaded = True
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """On the event loop: every waiter looks again (each waits on the event current when it looked)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # the watcher thread
    def _watch(self) -> None:
        backoff = Backoff()
        last_id = "0-0"  # the newest entry read: the next XREAD waits for one after it
        loaded = False
        while not self._stopping.is_set():
            try:
                newest, newest_id = self._read_newest(last_id)
                if newest is not None or not loaded:
                    self._hand_over(newest)
                    loaded = True
                last_id = newest_id
                self.bus.wait_for_entries(WEIGHTS, after_id=last_id, block_ms=self.block_ms)
                backoff.reset()
            except redis.RedisError as exc:
                if not is_redis_outage(exc):
                    raise
                backoff.wait(self._stopping, exc, "following weight announcements")

    def _read_newest(self, after_id: str) -> tuple[Announcement | None, str]:
        """The newest decodable announcement of this run after `after_id` (None: none), and the newest
        entry id."""
        messages, num_undecodable, newest_id = self.bus.newest(WEIGHTS, NUM_SCANNED, after_id=after_id)
        ours = [message for message in messages if message.run_id == self.run_id]
        num_skipped = num_undecodable + len(messages) - len(ours)
        if num_skipped:
            self.num_skipped += num_skipped
            log.warning("skipped %d undecodable or foreign entries on %s", num_skipped, self.bus.keys.name_of(WEIGHTS))
        if not ours:
            return None, newest_id
        return Announcement(ours[0], ours[0].model_dump_json().encode()), newest_id

    def _hand_over(self, newest: Announcement | None) -> None:
        assert self._loop is not None, "start() sets the loop before the thread runs"
        try:
            self._loop.call_soon_threadsafe(self._publish, newest)
        except RuntimeError:  # the loop closed under us (a shutdown without stop()): nobody is waiting
            self._stopping.set()
