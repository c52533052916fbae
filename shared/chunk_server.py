"""Chunk store and HTTP chunk server: every holder of weights (the learner, and each rollout worker
for relaying) serves the versions it has, chunk by chunk.

A request for a chunk of a known version that has not arrived yet waits for it (up to `wait_s`)
instead of failing: that is what lets a child pipeline behind its parent.

Routes:
  GET /healthz                           -> 200 "ok"
  GET /v1/weights/latest                 -> manifest JSON of the newest complete version (404 if none)
  GET /v1/weights/{version}/manifest     -> manifest JSON (404 if unknown)
  GET /v1/weights/{version}/chunks/{i}   -> chunk bytes (404 unknown, 504 still missing after wait_s)
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from shared.weights import Manifest, verify_chunk

log = logging.getLogger(__name__)


@dataclass
class _StoredVersion:
    manifest: Manifest
    chunks: dict[int, bytes] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.chunks) == self.manifest.num_chunks


class ChunkStore:
    """Thread-safe in-memory versions; keeps the newest `keep_versions`. Every chunk is verified on put."""

    def __init__(self, keep_versions: int = 4) -> None:
        self.keep_versions = keep_versions
        self._versions: OrderedDict[int, _StoredVersion] = OrderedDict()
        self._changed = threading.Condition()

    def add_manifest(self, manifest: Manifest) -> None:
        with self._changed:
            if manifest.policy_version not in self._versions:
                self._versions[manifest.policy_version] = _StoredVersion(manifest)
                self._versions = OrderedDict(sorted(self._versions.items()))
                while len(self._versions) > self.keep_versions:
                    self._versions.popitem(last=False)
            self._changed.notify_all()

    def put_chunk(self, policy_version: int, index: int, data: bytes) -> None:
        """Store a chunk after verifying it (raises ChunkVerificationError; nothing is stored then)."""
        with self._changed:
            stored = self._versions.get(policy_version)
            if stored is None:
                raise KeyError(f"no manifest for version {policy_version}")
            verify_chunk(stored.manifest, index, data)
            stored.chunks[index] = data
            self._changed.notify_all()

    def put_version(self, manifest: Manifest, chunks: list[bytes]) -> None:
        self.add_manifest(manifest)
        for index, chunk in enumerate(chunks):
            self.put_chunk(manifest.policy_version, index, chunk)

    def manifest(self, policy_version: int) -> Manifest | None:
        with self._changed:
            stored = self._versions.get(policy_version)
            return stored.manifest if stored else None

    def get_chunk(self, policy_version: int, index: int, wait_s: float = 0.0) -> bytes | None:
        """The chunk, waiting up to `wait_s` for it to arrive. Raises KeyError for an unknown version."""
        deadline = time.monotonic() + wait_s
        with self._changed:
            while True:
                stored = self._versions.get(policy_version)
                if stored is None:
                    raise KeyError(f"version {policy_version} is not held here")
                if not 0 <= index < stored.manifest.num_chunks:
                    raise KeyError(f"version {policy_version} has no chunk {index}")
                chunk = stored.chunks.get(index)
                remaining_s = deadline - time.monotonic()
                if chunk is not None or remaining_s <= 0:
                    return chunk
                self._changed.wait(remaining_s)

    def is_complete(self, policy_version: int) -> bool:
        with self._changed:
            stored = self._versions.get(policy_version)
            return bool(stored and stored.complete)

    def latest_complete_version(self) -> int | None:
        with self._changed:
            complete = [version for version, stored in self._versions.items() if stored.complete]
            return max(complete) if complete else None

    def versions(self) -> list[int]:
        with self._changed:
            return list(self._versions)


_CHUNK_ROUTE = re.compile(r"^/v1/weights/(\d+)/chunks/(\d+)$")
_MANIFEST_ROUTE = re.compile(r"^/v1/weights/(\d+)/manifest$")


class ChunkServer:
    """Serves a ChunkStore over HTTP from a background thread."""

    def __init__(self, store: ChunkStore, host: str = "127.0.0.1", port: int = 0, wait_s: float = 10.0) -> None:
        self.store = store
        self.wait_s = wait_s
        handler = _make_handler(store, wait_s)
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="chunk-server", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def host(self) -> str:
        return self._httpd.server_address[0]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ChunkServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _make_handler(store: ChunkStore, wait_s: float) -> type[BaseHTTPRequestHandler]:
    class ChunkHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                return self._send(200, b"ok", "text/plain")
            if path == "/v1/weights/latest":
                version = store.latest_complete_version()
                manifest = store.manifest(version) if version is not None else None
                return self._send_manifest(manifest, "no complete version held")
            if match := _MANIFEST_ROUTE.match(path):
                return self._send_manifest(store.manifest(int(match[1])), f"version {match[1]} not held")
            if match := _CHUNK_ROUTE.match(path):
                return self._send_chunk(int(match[1]), int(match[2]))
            return self._send(404, f"no route {path}".encode(), "text/plain")

        def _send_manifest(self, manifest: Manifest | None, missing: str) -> None:
            if manifest is None:
                return self._send(404, missing.encode(), "text/plain")
            return self._send(200, manifest.to_json(), "application/json")

        def _send_chunk(self, version: int, index: int) -> None:
            try:
                chunk = store.get_chunk(version, index, wait_s=wait_s)
            except KeyError as exc:
                return self._send(404, str(exc).encode(), "text/plain")
            if chunk is None:
                return self._send(504, f"chunk {index} of version {version} still missing after {wait_s}s".encode(), "text/plain")
            return self._send(200, chunk, "application/octet-stream")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
            log.debug("chunk-server: " + format, *args)

    return ChunkHandler
