"""Chunk server + client over real HTTP: verified transfer, waiting for in-flight chunks, refusals."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from shared.weight_channel import ChunkServer, ChunkStore, ManifestError
from shared.weight_channel.client import FetchError, fetch_manifest, fetch_version
from shared.weight_channel.manifest import ChunkVerificationError, build_manifest
from tests.weights_keys import FORGER_KEY, PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration


def test_a_version_arrives_byte_identical_and_lands_in_the_local_store(chunk_server: ChunkServer) -> None:
    blob = os.urandom(300_000)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=5, chunk_size_bytes=65536, signing_key=SIGNING_KEY
    )
    chunk_server.store.put_version(manifest, chunks)
    local = ChunkStore()
    with httpx.Client() as client:
        fetched = fetch_manifest(client, chunk_server.url, None, PUBLIC_KEY)
        assert fetched == manifest
        assert fetch_version(client, chunk_server.url, fetched, store=local) == blob
    assert local.is_complete(5)


def test_a_chunk_still_in_flight_is_waited_for(chunk_server: ChunkServer) -> None:
    manifest, chunks = build_manifest(
        os.urandom(200_000), run_id="r", policy_version=1, chunk_size_bytes=65536, signing_key=SIGNING_KEY
    )
    chunk_server.store.add_manifest(manifest)

    def arrive_later() -> None:  # chunks still being published: the pauses are the scenario, not a wait
        for index, chunk in enumerate(chunks):
            time.sleep(0.1)
            chunk_server.store.put_chunk(1, index, chunk)

    threading.Thread(target=arrive_later).start()
    with httpx.Client() as client:
        assert fetch_version(client, chunk_server.url, manifest) == b"".join(chunks)


def test_missing_chunks_time_out_with_a_reason_and_unknown_versions_are_404(chunk_server: ChunkServer) -> None:
    manifest, _ = build_manifest(
        b"x" * 1000, run_id="r", policy_version=2, chunk_size_bytes=512, signing_key=SIGNING_KEY
    )
    chunk_server.store.add_manifest(manifest)
    with httpx.Client() as client:
        with pytest.raises(FetchError, match="504.*still missing"):
            fetch_version(client, chunk_server.url, manifest)
        with pytest.raises(FetchError, match="404"):
            fetch_manifest(client, chunk_server.url, 9, PUBLIC_KEY)


def test_the_store_refuses_corrupt_chunks_and_clients_refuse_forged_manifests(chunk_server: ChunkServer) -> None:
    manifest, chunks = build_manifest(
        b"y" * 1000, run_id="r", policy_version=3, chunk_size_bytes=512, signing_key=SIGNING_KEY
    )
    chunk_server.store.add_manifest(manifest)
    with pytest.raises(ChunkVerificationError):
        chunk_server.store.put_chunk(3, 0, b"z" * 512)
    chunk_server.store.put_chunk(3, 0, chunks[0])
    chunk_server.store.put_chunk(3, 1, chunks[1])
    with httpx.Client() as client, pytest.raises(ManifestError, match="this receiver trusts key"):
        fetch_manifest(client, chunk_server.url, 3, FORGER_KEY.public_key())


def test_the_store_keeps_only_the_newest_versions() -> None:
    store = ChunkStore(keep_versions=2)
    for version in range(4):
        manifest, chunks = build_manifest(
            b"v" * 10, run_id="r", policy_version=version, chunk_size_bytes=1024, signing_key=SIGNING_KEY
        )
        store.put_version(manifest, chunks)
    assert store.versions() == [2, 3] and store.latest_complete_version() == 3
