"""Pipelined relay fetch of one artifact: stream its chunks from the best holder, verify each one,
store it (so this worker's own chunk server relays it at once), and route around failures.

    sources   = resolve()                     # parent first, then fallbacks; the learner last
    while a chunk is missing and the deadline has not passed:
        stream the missing chunks from the first source that has not failed
            each chunk: socket -> its place in the store's buffer, piece by piece
                                              # each piece is forwarded to children at once (cut-through)
                        -> the sender's verdict -> verify there -> held
            the sender says it was bad: refetch that chunk (a repair), no blame, carry on
            corrupt chunk: repair it from another source, carry on with the stream
                (a repair is a stream of that one chunk, under the same bounds as any stream)
            dead, refusing, or silent for stall_timeout_s: that source has failed, take the next
            a worker too slow to finish by the relay deadline: that source has failed, take the next
        every source failed: ask resolve() again (the coordinator re-plans around the dead)

The bound on what one holder can cost (issue 23, attack 7; issue 35, item 5). The learner is the
resolver's last source (the last resort); every other source is a worker, and the fetch leaves all of
them by the relay deadline, started + RELAY_SHARE x version_timeout_s (half), and streams the rest from
the learner:
    silent holder        stall_timeout_s (the read timeout), once per fetch (a failed source is not
                         asked again within the fetch); the same for one that sends its headers and
                         then nothing, or part of the version and then nothing
    slow or dribbling    left at the first read after stall_timeout_s at which its rate so far would
                         finish after the relay deadline (StreamGuard); a read that returns nothing
                         for stall_timeout_s is aborted, so a byte now and then cannot hold it;
                         at the relay deadline at the latest (the watchdog aborts the read)
    opening a stream     stall_timeout_s + chunk_wait_s in all for the response head (the holder may
                         wait chunk_wait_s for the manifest): the guard watches the opening too, so a
                         head dribbled in a byte at a time is cut off like a body
    another version's    (or any bytes the manifest does not sign) each such chunk is refetched from
    chunks               another source; the holder is left at its MAX_CORRUPT_PER_SOURCE-th
    a repair             the same bounds as a stream (a holder that says "rejected" and then dribbles
                         the repair is left like one that dribbles the stream)
so one bad worker holds a child for at most 2 x stall_timeout_s once its stream is open (the first
read after stall_timeout_s returns within another stall_timeout_s), all workers together until the
relay deadline, version_timeout_s / 2 (60 s with the default 120), and the learner keeps the rest.
An honest chain slower than that hands the rest of the version to the learner: keep
version_timeout_s at twice the transfer time or more. What the child got from its first source (the
parent it was assigned) goes back in its swap report (`ArtifactFetch.parent_url`, `parent_bytes`): the
coordinator ranks parents by it, and a parent that did not deliver all of it (the child fetched any
part elsewhere) is counted a miss and made a leaf for a while (relay_plan.py), which is what keeps a
parent that stalls part-way through every version to log2(V) + 1 of V versions with children.

Nothing here imports torch or talks to Redis: the benchmark runs this same code with no model.
Every wait is bounded (the holder's wait for progress, `stall_timeout_s` per read,
`version_timeout_s` overall) and the error that ends a fetch names every source and why it failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from shared.weight_channel.client import ChunkStream, FetchError
from shared.weight_channel.manifest import ChunkVerificationError, Manifest, WeightsError, verify_chunk
from shared.weight_channel.store import ChunkStore

log = logging.getLogger(__name__)

RETRY_ALL_FAILED_S = 0.5  # pause before asking for sources again once every one has failed
RELAY_SHARE = 0.5  # workers (every source but the learner, the last) get this share of version_timeout_s
MAX_ROUNDS = 3  # give up once every source (the learner included) has failed this many times over
MAX_CORRUPT_PER_SOURCE = 2  # a source that sent this many bad chunks is dropped at its next bad one
# a relay that forwarded bytes cut-through which then failed its own check says so (the verdict byte):
# not its lie, but a source that keeps doing it (a bad upstream it does not leave) is left after this many
MAX_REJECTED_PER_SOURCE = 4

SourceResolver = Callable[[], list[str]]  # base URLs: parent first, then fallbacks (learner last)


class RelayFetchError(WeightsError):
    """No source delivered the artifact within the deadline; the message names each failure."""


@contextmanager
def in_local_store(manifest: Manifest) -> Iterator[None]:
    """The artifact being fetched left this worker's own store (evicted or replaced by a newer one):
    the store's KeyError ends the fetch as a RelayFetchError."""
    try:
        yield
    except KeyError as exc:
        raise RelayFetchError(f"version {manifest.artifact} left the local store mid-fetch: {exc}") from exc


@dataclass
class ArtifactFetch:
    """The outcome of one fetch: the payload (every chunk verified; a view of the store's buffer, no
    copy) and how it came."""

    manifest: Manifest
    blob: memoryview
    seconds: float
    done_at_s: float = 0.0  # wall clock: the last chunk verified
    bytes_by_source: Counter[str] = field(default_factory=Counter)  # bytes received from the network
    corrupt_by_source: Counter[str] = field(default_factory=Counter)  # chunks that failed verification
    rejected_by_source: Counter[str] = field(default_factory=Counter)  # chunks the sender itself said were bad
    failures: list[str] = field(default_factory=list)  # one line per source failure, in order
    parent_url: str = ""  # the first source the resolver named (the assigned parent), as named

    @property
    def parent_bytes(self) -> int:
        """Bytes that came from the assigned parent: its delivery, as this child observed it."""
        return self.bytes_by_source[self.parent_url.rstrip("/")] if self.parent_url else 0

    @property
    def num_corrupt_chunks(self) -> int:
        return sum(self.corrupt_by_source.values())

    @property
    def num_bytes(self) -> int:
        return sum(self.bytes_by_source.values())

    @property
    def main_source(self) -> str:
        return self.bytes_by_source.most_common(1)[0][0] if self.bytes_by_source else ""


class SourceTooSlowError(Exception):
    """A source cannot finish by its deadline at the rate it has sent so far (StreamGuard)."""


class StreamGuard:
    """Bounds one stream from a holder, whatever the holder does between bytes:

        no response head within stall_timeout_s + head_wait_s (the holder may wait that long for the
            manifest), no read returned for stall_timeout_s after it, or its deadline passed
            -> the opening or the read is aborted (a holder sending a byte now and then, in the head
            or the body, never trips the socket's read timeout)
        after stall_timeout_s, at each read: the rest at its rate so far would end after its deadline
            -> SourceTooSlowError

    Start it before `stream.open()` and call `opened()` once that returned. One waiting thread per
    stream; `stop()` ends it."""

    def __init__(
        self,
        stream: ChunkStream,
        manifest: Manifest,
        first: int,
        deadline_s: float,
        stall_timeout_s: float,
        head_wait_s: float = 0.0,
        num_bytes: int | None = None,
    ) -> None:
        self.stream = stream
        self.deadline_s = deadline_s
        self.stall_timeout_s = stall_timeout_s
        self.opened_s = time.monotonic()
        self.last_piece_s = self.opened_s + head_wait_s  # the head's allowance: stall_timeout_s + head_wait_s
        # what the stream is to deliver by its deadline: the rest of the artifact, or `num_bytes` (a repair)
        self.remaining_bytes = manifest.total_size_bytes - first * manifest.chunk_size_bytes
        if num_bytes is not None:
            self.remaining_bytes = num_bytes
        self.num_bytes = 0  # of whole chunks read from this stream
        self.fired = ""  # why the read was aborted ('' while it was not)
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, name="relay-stream-guard", daemon=True).start()

    def watching(self, on_bytes: Callable[[int], None]) -> Callable[[int], None]:
        """`on_bytes` for read_chunk_into, noting each piece (and checking the rate) first."""

        def noted(num_bytes_in_chunk: int) -> None:
            self.piece(self.num_bytes + num_bytes_in_chunk)
            on_bytes(num_bytes_in_chunk)

        return noted

    def piece(self, num_bytes: int) -> None:
        """`num_bytes` arrived on this stream so far; raises SourceTooSlowError (see the class doc)."""
        now_s = self.last_piece_s = time.monotonic()
        elapsed_s = now_s - self.opened_s
        if elapsed_s >= self.stall_timeout_s:
            rate = num_bytes / elapsed_s  # bytes/s
            if now_s + (self.remaining_bytes - num_bytes) / rate > self.deadline_s:
                raise SourceTooSlowError(f"{rate * 8 / 1e6:.3g} Mbit/s would finish after its deadline")

    def opened(self) -> None:
        """The response head arrived: the body's clocks (stall, rate) start now."""
        self.opened_s = self.last_piece_s = time.monotonic()

    def chunk_done(self, num_bytes: int) -> None:
        self.num_bytes += num_bytes

    def resume(self) -> None:
        """Waiting for the holder again (after this worker's own work: a verification, a repair)."""
        self.last_piece_s = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while True:
            now_s = time.monotonic()
            if now_s >= self.deadline_s or now_s >= self.last_piece_s + self.stall_timeout_s:
                self.fired = (
                    "too slow: its deadline passed" if now_s >= self.deadline_s else "stalled: no read returned"
                )  # an opening cut off reads "stalled" too: no response head in time
                self.stream.abort()
                return
            if self._stopped.wait(min(self.deadline_s, self.last_piece_s + self.stall_timeout_s) - now_s):
                return


@dataclass(frozen=True)
class Deadlines:
    """One fetch's deadlines (monotonic s): the version's for the last resort (the learner), the relay
    deadline (the version's at the latest) for every worker."""

    version_s: float
    relay_s: float
    last_resort: str

    def of(self, url: str) -> float:
        return self.version_s if url == self.last_resort else min(self.version_s, self.relay_s)


class RelayFetcher:
    def __init__(
        self,
        store: ChunkStore,
        *,
        own_url: str = "",
        stall_timeout_s: float = 15.0,
        manifest_wait_s: float = 10.0,
        version_timeout_s: float = 120.0,
    ) -> None:
        self.store = store
        self.own_url = own_url.rstrip("/")
        self.stall_timeout_s = stall_timeout_s
        self.manifest_wait_s = manifest_wait_s  # how long a holder may take to hear of the artifact
        self.version_timeout_s = version_timeout_s

    def fetch(
        self, manifest: Manifest, resolve: SourceResolver, *, manifest_wait_s: float | None = None
    ) -> ArtifactFetch:
        """Every chunk of `manifest` into the store, verified; returns the payload bytes.
        Raises RelayFetchError when the deadline passes with chunks still missing."""
        started_s = time.monotonic()
        deadline_s = started_s + self.version_timeout_s
        wait_s = self.manifest_wait_s if manifest_wait_s is None else manifest_wait_s
        result = ArtifactFetch(manifest, memoryview(b""), 0.0)
        self.store.add_manifest(manifest)
        relay_deadline_s = started_s + RELAY_SHARE * self.version_timeout_s
        failed: set[str] = set()
        num_rounds = 1
        named = resolve()
        result.parent_url = named[0] if named else ""
        sources, last_resort = self._usable(named), _last_resort(named)
        while missing := self.store.missing_chunks(manifest):
            candidates = [url for url in sources if url not in failed]
            if not candidates:  # every source failed: ask again (the plan may have changed), after a pause
                num_rounds += 1
                failed.clear()
                named = resolve()
                sources, last_resort = self._usable(named), _last_resort(named)
                candidates = sources
                time.sleep(min(RETRY_ALL_FAILED_S, max(0.0, deadline_s - time.monotonic())))
            if time.monotonic() >= relay_deadline_s:  # the workers had their share: the learner only
                candidates = [url for url in candidates if url == last_resort]
            if time.monotonic() >= deadline_s or num_rounds > MAX_ROUNDS or not candidates:
                why = (
                    f"after {self.version_timeout_s}s"
                    if time.monotonic() >= deadline_s
                    else f"after {num_rounds - 1} rounds over every source"
                )
                raise RelayFetchError(
                    f"version {manifest.artifact}: {len(missing)} of {manifest.num_chunks} chunks still missing {why}; "
                    f"failures: {'; '.join(result.failures) or 'no source to ask'}"
                )
            source = candidates[0]
            deadlines = Deadlines(deadline_s, relay_deadline_s, last_resort)
            reason = self._stream_from(source, manifest, missing[0], sources, result, wait_s, deadlines)
            if reason is not None:
                failed.add(source)
                result.failures.append(f"{source}: {reason}")
                log.warning("version %s: source %s failed (%s); switching", manifest.artifact, source, reason)
        result.seconds = time.monotonic() - started_s
        result.done_at_s = time.time()
        try:
            result.blob = self.store.payload(manifest)
        except KeyError as exc:
            raise RelayFetchError(f"version {manifest.artifact} left the local store as it completed: {exc}") from exc
        return result

    def close(self) -> None:
        """Nothing to release: every stream (repairs too) is closed when it ends."""

    def _stream_from(
        self,
        source: str,
        manifest: Manifest,
        first: int,
        sources: list[str],
        result: ArtifactFetch,
        wait_s: float,
        deadlines: Deadlines,
    ) -> str | None:
        """Stream chunks first.. from `source` into the store until its deadline (the version's, or the
        relay deadline for a worker). None when the stream reached the end; otherwise why this source must
        not be used again for this fetch."""
        deadline_s = deadlines.of(source)
        try:
            stream = ChunkStream(
                source,
                manifest,
                first,
                stall_timeout_s=self.stall_timeout_s,
                wait_manifest_s=wait_s,
                requester_url=self.own_url,
            )
        except FetchError as exc:
            return str(exc)
        self.store.set_source(manifest, source)  # a child that is this source is told at once (a relay cycle)
        # the guard watches the opening too: a head dribbled in a byte at a time is cut off like a body
        guard = StreamGuard(stream, manifest, first, deadline_s, self.stall_timeout_s, head_wait_s=wait_s)
        try:
            stream.open()
            guard.opened()
            while stream.next_index < manifest.num_chunks:
                guard.resume()
                if time.monotonic() >= deadline_s:
                    return f"too slow: its deadline passed at chunk {stream.next_index}"
                reason = self._take_chunk(stream, guard, source, sources, result, deadlines)
                if reason is not None:
                    return reason
        except SourceTooSlowError as exc:
            return f"too slow: {exc}"
        except FetchError as exc:
            return f"{guard.fired} ({exc})" if guard.fired else str(exc)
        finally:
            self.store.set_source(manifest, "")
            guard.stop()
            stream.close()
        return None

    def _take_chunk(
        self,
        stream: ChunkStream,
        guard: StreamGuard,
        source: str,
        sources: list[str],
        result: ArtifactFetch,
        deadlines: Deadlines,
    ) -> str | None:
        """The stream's next chunk into the store: read into its place, then verified, or repaired from
        another source (skipped when it is held already). None to carry on with the stream; otherwise why
        `source` must not be used again for this fetch."""
        manifest, index = result.manifest, stream.next_index
        try:
            with in_local_store(manifest):
                region = self.store.receive_region(manifest, index)
        except ValueError:  # held already (repaired meanwhile): read past it
            stream.next_chunk()
            return None
        with in_local_store(manifest):  # each piece is reported to the store: forwarded at once
            vouched = stream.read_chunk_into(region, guard.watching(partial(self.store.note_received, manifest, index)))
        result.bytes_by_source[source] += len(region)
        guard.chunk_done(len(region))
        if not vouched:  # the holder forwarded them before its own check, which they then failed
            with in_local_store(manifest):
                self.store.reject_chunk(manifest, index)
            result.rejected_by_source[source] += 1
            log.info("version %s chunk %d: %s passed on bad bytes; refetching", manifest.artifact, index, source)
            others = [url for url in sources if url != source]  # it repairs it too: ask it first
            self._repair(manifest, index, [source, *others], result, deadlines)
            if result.rejected_by_source[source] >= MAX_REJECTED_PER_SOURCE:
                return f"passed on {result.rejected_by_source[source]} chunks it could not verify"
            return None
        try:
            with in_local_store(manifest):  # verified in its place; a corrupt chunk stays missing
                self.store.commit_chunk(manifest, index)
        except ChunkVerificationError as exc:
            result.corrupt_by_source[source] += 1
            log.warning("version %s chunk %d from %s is corrupt (%s); repairing", manifest.artifact, index, source, exc)
            self._repair(manifest, index, [url for url in sources if url != source], result, deadlines)
            if result.corrupt_by_source[source] >= MAX_CORRUPT_PER_SOURCE:
                return f"sent {result.corrupt_by_source[source]} corrupt chunks"
        return None

    def _repair(
        self, manifest: Manifest, index: int, others: list[str], result: ArtifactFetch, deadlines: Deadlines
    ) -> None:
        """Chunk `index` from the first other source that has it intact. If none does, it stays missing
        and the main loop streams it again from the next source."""
        for url in others:
            try:
                data = self._fetch_one_chunk(url, manifest, index, deadlines.of(url))
            except WeightsError as exc:
                result.failures.append(f"{url}: repair of chunk {index}: {exc}")
                continue
            result.bytes_by_source[url] += len(data)
            with in_local_store(manifest):
                self.store.put_chunk(manifest.policy_version, index, data, manifest.payload)
            log.info("version %s chunk %d repaired from %s", manifest.artifact, index, url)
            return

    def _fetch_one_chunk(self, url: str, manifest: Manifest, index: int, deadline_s: float) -> bytearray:
        """Chunk `index` alone from `url`, verified: the first chunk of a stream, under a StreamGuard, so a
        repair is bounded as a stream is (a holder that says "rejected" and then dribbles the repair cannot
        hold this worker past its deadline). Raises FetchError or ChunkVerificationError."""
        stream = ChunkStream(url, manifest, index, stall_timeout_s=self.stall_timeout_s, wait_manifest_s=0.0)
        guard = StreamGuard(
            stream, manifest, index, deadline_s, self.stall_timeout_s, num_bytes=manifest.chunk_length(index)
        )
        data = bytearray(manifest.chunk_length(index))
        try:
            stream.open()
            guard.opened()
            vouched = stream.read_chunk_into(memoryview(data), guard.watching(lambda _: None))
        except SourceTooSlowError as exc:
            raise FetchError(f"too slow: {exc}") from exc
        except FetchError as exc:
            if guard.fired:
                raise FetchError(f"{guard.fired} ({exc})") from exc
            raise
        finally:
            guard.stop()
            stream.close()
        if not vouched:
            raise FetchError(f"{url} could not verify chunk {index} itself")
        verify_chunk(manifest, index, data)
        return data

    def _usable(self, urls: list[str]) -> list[str]:
        """Unique URLs in order, never this worker's own chunk server."""
        unique: list[str] = []
        for url in (u.rstrip("/") for u in urls):
            if url and url != self.own_url and url not in unique:
                unique.append(url)
        return unique


def _last_resort(named: list[str]) -> str:
    """The resolver's last source (the learner: SourceResolver), as `_usable` spells it."""
    return named[-1].rstrip("/") if named else ""
