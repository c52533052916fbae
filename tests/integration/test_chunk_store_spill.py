"""The learner's chunk store keeps the versions it serves in files (issue 9: "4 full versions are kept in
memory"): served bytes are identical over real HTTP, evicted and replaced versions leave no file, a
request that holds a chunk while its version is evicted still sends the right bytes, and keeping four
versions does not grow the process's own (anonymous) memory by four versions."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.weight_channel import ChunkServer, ChunkStore
from shared.weight_channel.buffers import SPARE_SUFFIX
from shared.weight_channel.client import fetch_manifest, fetch_version
from shared.weight_channel.manifest import build_manifest
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration
MIB = 1 << 20


def version(policy_version: int, size_bytes: int, chunk_size_bytes: int = 4 * MIB):  # type: ignore[no-untyped-def]
    blob = os.urandom(size_bytes)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=policy_version, chunk_size_bytes=chunk_size_bytes, signing_key=SIGNING_KEY
    )
    return blob, manifest, chunks


@pytest.fixture
def spilled_server(tmp_path: Path) -> Iterator[ChunkServer]:
    server = ChunkServer(ChunkStore(keep_versions=2, spill_dir=tmp_path / "published")).start()
    yield server
    server.stop()


def test_a_spilled_version_is_served_byte_identical(spilled_server: ChunkServer, tmp_path: Path) -> None:
    blob, manifest, chunks = version(3, 3 * MIB + 17, chunk_size_bytes=MIB)
    spilled_server.store.put_version(manifest, chunks)
    assert len(list((tmp_path / "published").glob("3-full-*.safetensors"))) == 1
    with httpx.Client() as client:
        fetched = fetch_manifest(client, spilled_server.url, None, PUBLIC_KEY)
        assert fetch_version(client, spilled_server.url, fetched, store=ChunkStore()) == blob
    assert spilled_server.store.chunks(manifest) == chunks


def test_evicted_and_replaced_versions_leave_no_file(tmp_path: Path) -> None:
    spill_dir = tmp_path / "published"
    spill_dir.mkdir()
    (spill_dir / "9-full-1.chunks").write_bytes(b"a previous process's")
    store = ChunkStore(keep_versions=2, spill_dir=spill_dir)
    assert list(spill_dir.iterdir()) == []  # never served again
    for policy_version in (1, 2, 3):
        store.put_version(*version(policy_version, MIB)[1:])
    assert store.versions() == [2, 3]
    store.spares.wait()  # plus one spare file, faulted in for the next version (shared/weight_channel/buffers.py)
    versions = sorted(path.name.split("-")[0] for path in spill_dir.iterdir() if path.suffix != SPARE_SUFFIX)
    assert versions == ["2", "3"]
    _, replacement, chunks = version(3, MIB)  # a restarted learner re-uses the number
    store.put_version(replacement, chunks)
    assert store.manifest(3) == replacement and store.chunks(replacement) == chunks
    assert len(list(spill_dir.glob("3-full-*.safetensors"))) == 1


def test_a_chunk_being_sent_survives_the_eviction_of_its_version(tmp_path: Path) -> None:
    store = ChunkStore(keep_versions=1, spill_dir=tmp_path)
    _, manifest, chunks = version(1, 2 * MIB, chunk_size_bytes=MIB)
    store.put_version(manifest, chunks)
    held = store._artifact(1, "full").chunks[1]  # what a request in flight holds  # type: ignore[union-attr]
    store.put_version(*version(2, MIB)[1:])
    assert store.versions() == [2] and not list(tmp_path.glob("1-full-*"))
    assert bytes(held) == chunks[1]


def test_keeping_four_versions_does_not_keep_them_in_the_process_memory(tmp_path: Path) -> None:
    store = ChunkStore(keep_versions=4, spill_dir=tmp_path)
    size_bytes = 32 * MIB
    gc.collect()
    before = anonymous_rss_bytes()
    for policy_version in range(4):
        store.put_version(*version(policy_version, size_bytes)[1:])  # the blob and chunks die here
    gc.collect()
    growth = anonymous_rss_bytes() - before
    assert store.versions() == [0, 1, 2, 3]
    assert growth < size_bytes, f"anonymous memory grew {growth / MIB:.0f} MiB for 4 x 32 MiB versions"
    in_memory = ChunkStore(keep_versions=4)  # the same versions held the old way, for contrast
    for policy_version in range(4):
        in_memory.put_version(*version(policy_version, size_bytes)[1:])
    gc.collect()
    assert anonymous_rss_bytes() - before > 3 * size_bytes


def anonymous_rss_bytes() -> int:
    """RssAnon: the process's own pages (file-backed mappings are page cache, not counted here)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")
