"""Pipelined relay fetch of one artifact: stream its chunks from the best holder, verify each one,
store it (so this worker's own chunk server relays it at once), and route around failures.

    sources   = resolve()                     # parent first, then fallbacks; the learner last
    while a chunk is missing and the deadline has not passed:
        stream the missing chunks from the first source that has not failed
            each chunk: socket -> its place in the store's buffer, piece by piece
                                              # each piece is forwarded to children at once (cut-through)
                        -> the sender's verdict -> verify there -> held
            the sender says it was bad: refetch that chunk (single GET), no blame, carry on
            corrupt chunk: repair it from another source (single GET), carry on with the stream
            dead, refusing, or silent for stall_timeout_s: that source has failed, take the next
        every source failed: ask resolve() again (the coordinator re-plans around the dead)

Nothing here imports torch or talks to Redis: the benchmark runs this same code with no model.
Every wait is bounded (the holder's wait for progress, `stall_timeout_s` per read,
`version_timeout_s` overall) and the error that ends a fetch names every source and why it failed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import httpx

from shared.chunk_client import ChunkStream, FetchError, fetch_chunk
from shared.chunk_server import ChunkStore
from shared.weights import ChunkVerificationError, Manifest, WeightsError

log = logging.getLogger(__name__)

RETRY_ALL_FAILED_S = 0.5  # pause before asking for sources again once every one has failed
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

    @property
    def num_corrupt_chunks(self) -> int:
        return sum(self.corrupt_by_source.values())

    @property
    def num_bytes(self) -> int:
        return sum(self.bytes_by_source.values())

    @property
    def main_source(self) -> str:
        return self.bytes_by_source.most_common(1)[0][0] if self.bytes_by_source else ""


class RelayFetcher:
    def __init__(
        self,
        store: ChunkStore,
        *,
        own_url: str = "",
        stall_timeout_s: float = 15.0,
        manifest_wait_s: float = 10.0,
        version_timeout_s: float = 120.0,
        repair_timeout_s: float = 10.0,
    ) -> None:
        self.store = store
        self.own_url = own_url.rstrip("/")
        self.stall_timeout_s = stall_timeout_s
        self.manifest_wait_s = manifest_wait_s  # how long a holder may take to hear of the artifact
        self.version_timeout_s = version_timeout_s
        self._http = httpx.Client(timeout=repair_timeout_s)

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
        failed: set[str] = set()
        num_rounds = 1
        sources = self._usable(resolve())
        while missing := self.store.missing_chunks(manifest):
            candidates = [url for url in sources if url not in failed]
            if not candidates:  # every source failed: ask again (the plan may have changed), after a pause
                num_rounds += 1
                failed.clear()
                sources = self._usable(resolve())
                candidates = sources
                time.sleep(min(RETRY_ALL_FAILED_S, max(0.0, deadline_s - time.monotonic())))
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
            reason = self._stream_from(source, manifest, missing[0], sources, result, wait_s, deadline_s)
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
        self._http.close()

    def _stream_from(
        self,
        source: str,
        manifest: Manifest,
        first: int,
        sources: list[str],
        result: ArtifactFetch,
        wait_s: float,
        deadline_s: float,
    ) -> str | None:
        """Stream chunks first.. from `source` into the store. None when the stream reached the end;
        otherwise why this source must not be used again for this fetch."""
        try:
            stream = ChunkStream(source, manifest, first, stall_timeout_s=self.stall_timeout_s, wait_manifest_s=wait_s)
        except FetchError as exc:
            return str(exc)
        try:
            while stream.next_index < manifest.num_chunks:
                if time.monotonic() >= deadline_s:
                    return f"too slow: the version deadline passed at chunk {stream.next_index}"
                index = stream.next_index
                try:
                    with in_local_store(manifest):
                        region = self.store.receive_region(manifest, index)
                except ValueError:  # held already (repaired meanwhile): read past it
                    stream.next_chunk()
                    continue
                with in_local_store(manifest):  # each piece is reported to the store: forwarded at once
                    vouched = stream.read_chunk_into(region, partial(self.store.note_received, manifest, index))
                result.bytes_by_source[source] += len(region)
                if not vouched:  # the holder forwarded them before its own check, which they then failed
                    with in_local_store(manifest):
                        self.store.reject_chunk(manifest, index)
                    result.rejected_by_source[source] += 1
                    log.info(
                        "version %s chunk %d: %s passed on bad bytes; refetching", manifest.artifact, index, source
                    )
                    others = [url for url in sources if url != source]
                    self._repair(manifest, index, [source, *others], result)  # it repairs it too: ask it first
                    if result.rejected_by_source[source] >= MAX_REJECTED_PER_SOURCE:
                        return f"passed on {result.rejected_by_source[source]} chunks it could not verify"
                    continue
                try:
                    with in_local_store(manifest):  # verified in its place; a corrupt chunk stays missing
                        self.store.commit_chunk(manifest, index)
                except ChunkVerificationError as exc:
                    result.corrupt_by_source[source] += 1
                    log.warning(
                        "version %s chunk %d from %s is corrupt (%s); repairing", manifest.artifact, index, source, exc
                    )
                    self._repair(manifest, index, [url for url in sources if url != source], result)
                    if result.corrupt_by_source[source] >= MAX_CORRUPT_PER_SOURCE:
                        return f"sent {result.corrupt_by_source[source]} corrupt chunks"
        except FetchError as exc:
            return str(exc)
        finally:
            stream.close()
        return None

    def _repair(self, manifest: Manifest, index: int, others: list[str], result: ArtifactFetch) -> None:
        """Chunk `index` from the first other source that has it intact. If none does, it stays missing
        and the main loop streams it again from the next source."""
        for url in others:
            try:
                data = fetch_chunk(self._http, url, manifest, index)  # verifies its digest
            except WeightsError as exc:
                result.failures.append(f"{url}: repair of chunk {index}: {exc}")
                continue
            result.bytes_by_source[url] += len(data)
            with in_local_store(manifest):
                self.store.put_chunk(manifest.policy_version, index, data, manifest.payload)
            log.info("version %s chunk %d repaired from %s", manifest.artifact, index, url)
            return

    def _usable(self, urls: list[str]) -> list[str]:
        """Unique URLs in order, never this worker's own chunk server."""
        unique: list[str] = []
        for url in (u.rstrip("/") for u in urls):
            if url and url != self.own_url and url not in unique:
                unique.append(url)
        return unique
