"""A worker's relay side for the relay tests (tests/integration/test_relay_broadcast.py, test_relay_liveness.py):
its chunk store, the chunk server over it, and the relay fetcher that fills it, fetching in the background."""

from __future__ import annotations

import threading

from shared.weight_channel import ChunkServer, ChunkStore, Manifest
from shared.weight_channel.relay_fetch import ArtifactFetch, RelayFetcher


class Holder:
    """A chunk server with its store, and the relay fetcher a worker would run next to it."""

    def __init__(self, store: ChunkStore, *, wait_s: float, stall_timeout_s: float) -> None:
        self.store = store
        self.server = ChunkServer(self.store, wait_s=wait_s).start()
        self.fetcher = RelayFetcher(
            self.store,
            own_url=self.url,
            stall_timeout_s=stall_timeout_s,
            manifest_wait_s=wait_s,
            version_timeout_s=30.0,
        )
        self.result: ArtifactFetch | BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    def fetch_in_background(self, manifest: Manifest, sources: list[str]) -> None:
        def fetch() -> None:
            try:
                self.result = self.fetcher.fetch(manifest, lambda: sources)
            except BaseException as exc:  # noqa: B036 (re-raised by the test through `done`)
                self.result = exc

        self._thread = threading.Thread(target=fetch, daemon=True)
        self._thread.start()

    def done(self, timeout_s: float = 30.0) -> ArtifactFetch:
        assert self._thread is not None
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "fetch did not finish"
        if isinstance(self.result, BaseException):
            raise self.result
        assert isinstance(self.result, ArtifactFetch)
        return self.result

    def close(self) -> None:
        self.fetcher.close()
        self.server.stop()
