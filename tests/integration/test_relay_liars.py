"""Relay parents that lie (issue 35, item 5; benchmarks/lying_parents.py), over real chunk servers and the
coordinator's real heartbeat script: one that serves another version's chunks (signed by the learner, for
that other version), one that sends its headers and then nothing, one that serves 60% of a version and
then nothing. Each time the child ends up with the announced version, verified, within the bound of
shared/weight_channel/relay_fetch.py, and its report makes the liar a miss: a leaf with no children in the
next plan (shared/weight_channel/relay_plan.py). Two more found on the way held a child past its version
timeout, for good: a parent that dribbles its response head, and one that disowns a chunk and dribbles
the repair."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import redis
from fastapi.testclient import TestClient

from benchmarks.lying_parents import (
    DISOWNED,
    HandWrittenParent,
    LyingParentStore,
    ParentLie,
    disowned_repair,
    dribbled_head,
)
from services.coordinator.app import create_app
from services.coordinator.broadcast_times import RelayKeys
from shared.api import ParentResponse, RelayPlanResponse
from shared.config import BroadcastConfig, RunConfig
from shared.keys import RunKeys
from shared.weight_channel import ChunkStore, Manifest
from shared.weight_channel.manifest import build_manifest
from shared.weight_channel.protocol import STREAM_REJECTED
from shared.weight_channel.relay_fetch import ArtifactFetch
from tests import relay_holders
from tests.coordinator_rest import ADMIN_TOKEN, announce, register
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY

pytestmark = pytest.mark.integration

CHUNK_SIZE_BYTES = 64 * 1024
NUM_CHUNKS = 10  # partial_then_stall serves 6 of them
STALL_TIMEOUT_S = 0.5  # the child's; [broadcast] stall_timeout_s
WAIT_S = 0.3  # every holder's chunk_wait_s (below the stall timeout, as the config requires)
SLACK_S = 3.0  # the learner's transfer and a busy machine, on top of each bound


class Holder(relay_holders.Holder):
    def __init__(self, store: ChunkStore | None = None) -> None:
        store = store if store is not None else ChunkStore(trusted_key=PUBLIC_KEY)
        super().__init__(store, wait_s=WAIT_S, stall_timeout_s=STALL_TIMEOUT_S)

    def close(self) -> None:
        if isinstance(self.store, LyingParentStore):
            self.store.release()  # its stalled streams end before its server stops
        super().close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    created: list[Holder] = []
    yield created
    for holder in created:
        holder.close()


@pytest.fixture
def api(redis_client: redis.Redis, keys: RunKeys) -> Iterator[httpx.Client]:
    # the child's and the other's chunk servers are names nobody serves (http://child:9000): taken as reachable,
    # not probed, so only misses decide the plan here (probing: tests/integration/test_relay_reachability.py)
    run = RunConfig(run_id=keys.run_id, broadcast=BroadcastConfig(probe_inbound=False))
    app = create_app(run, redis_client, ADMIN_TOKEN)
    with TestClient(app) as client:
        yield client


def new_version(policy_version: int) -> tuple[Manifest, list[memoryview], bytes]:
    blob = np.random.default_rng(policy_version).bytes(NUM_CHUNKS * CHUNK_SIZE_BYTES - 1000)
    manifest, chunks = build_manifest(
        blob, run_id="r", policy_version=policy_version, chunk_size_bytes=CHUNK_SIZE_BYTES, signing_key=SIGNING_KEY
    )
    return manifest, chunks, blob


def fetch_timed(child: Holder, manifest: Manifest, sources: list[str]) -> tuple[ArtifactFetch, float]:
    """The child's fetch of `manifest` (its plan: `sources`), and its lag: the learner holds the version
    whole before it starts."""
    started_s = time.monotonic()
    child.fetch_in_background(manifest, sources)
    fetched = child.done(timeout_s=20.0)
    return fetched, time.monotonic() - started_s


def plan_after_the_childs_report(
    api: httpx.Client, redis_client: redis.Redis, keys: RunKeys, liar_url: str, fetched: ArtifactFetch
) -> tuple[dict[str, str], dict[bytes | str, bytes | str]]:
    """Through the coordinator: the liar (claiming 10 Gbit/s) is the first plan's seed and the child its
    child; the child reports its swap of `fetched` with its heartbeat. Returns the next plan (name -> the
    parent's name) and the misses the heartbeat script counted."""
    start_s = time.time() - 30
    liar = register(api, "liar", endpoint_url=liar_url, bandwidth_mbps=10_000)
    child = register(api, "child", endpoint_url="http://child:9000", bandwidth_mbps=1_000)
    other = register(api, "other", endpoint_url="http://other:9000", bandwidth_mbps=100)
    for worker in (liar, child, other):
        redis_client.hset(keys.worker(worker.worker_id), "registered_at_s", repr(start_s - 1))
    version = fetched.manifest.policy_version
    announce(redis_client, keys.run_id, version, start_s, publish_started_at_s=start_s)
    assigned = ParentResponse.model_validate(api.get(f"/v1/workers/{child.worker_id}/parent").json())
    assert assigned.parent_url == liar_url  # served: the child's report may now speak of the liar
    swap = {
        "policy_version": version,
        "announced_at_s": start_s,
        "swapped_at_s": start_s + fetched.seconds + 0.1,
        "ready_at_s": start_s + fetched.seconds,
        "num_bytes": fetched.num_bytes,
        "parent_url": fetched.parent_url,
        "parent_bytes": fetched.parent_bytes,
    }
    response = api.post(
        f"/v1/workers/{child.worker_id}/heartbeat",
        json={"policy_version": version, "last_swap": swap},
        headers={"Authorization": f"Bearer {child.token}"},
    )
    assert response.status_code == 200, response.text
    body = RelayPlanResponse.model_validate(api.get("/v1/broadcast/plan").json())
    name_of = {a.worker_id: a.name for a in body.assignments} | {"learner": "learner"}
    plan = {a.name: name_of[a.parent_id] for a in body.assignments}
    return plan, redis_client.hgetall(RelayKeys.of(keys).misses)


def test_a_parent_serving_another_versions_chunks_is_refused_and_counted_a_miss(
    holders: list[Holder], api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    """Every chunk it serves of version 2 is the same chunk of version 1: bytes the learner did sign, for
    version 1. The child checks each against version 2's manifest, refetches the two it got from the
    learner, leaves the liar, and the liar delivered none of the version: a miss."""
    old, old_chunks, _ = new_version(1)
    manifest, chunks, blob = new_version(2)
    learner, liar, child = Holder(), Holder(LyingParentStore(ParentLie.OTHER_VERSION, trusted_key=PUBLIC_KEY)), Holder()
    holders += [learner, liar, child]
    learner.store.put_version(manifest, chunks)
    liar.store.put_version(old, old_chunks)
    liar.store.put_version(manifest, chunks)  # it holds the real version 2 (what it would load itself)
    served = httpx.get(f"{liar.url}/v1/weights/2/chunks/3").content
    assert served == old_chunks[3] and served != chunks[3]  # the lie: version 1's chunk 3, as signed

    fetched, lag_s = fetch_timed(child, manifest, [liar.url, learner.url])

    assert fetched.blob == blob and child.store.is_complete(2)
    assert fetched.corrupt_by_source == {liar.url: 2}
    assert fetched.failures == [f"{liar.url}: sent 2 corrupt chunks"]
    assert (fetched.parent_url, fetched.parent_bytes) == (liar.url, 2 * CHUNK_SIZE_BYTES)  # received, refused
    assert lag_s < STALL_TIMEOUT_S + SLACK_S  # caught at its first chunks: no timeout comes into it
    plan, misses = plan_after_the_childs_report(api, redis_client, keys, liar.url, fetched)
    assert misses == {liar.url.encode(): b"2 1"}
    assert "liar" not in plan.values()  # a leaf: nobody's parent


def test_a_parent_that_stalls_after_its_headers_is_left_after_the_stall_timeout_and_counted_a_miss(
    holders: list[Holder], api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    manifest, chunks, blob = new_version(1)
    liar_store = LyingParentStore(ParentLie.STALL_AFTER_HEADERS, trusted_key=PUBLIC_KEY)
    learner, liar, child = Holder(), Holder(liar_store), Holder()
    holders += [learner, liar, child]
    learner.store.put_version(manifest, chunks)
    liar.store.put_version(manifest, chunks)
    # the lie: a 200 and its headers at once, then not a byte of the body
    address = urlsplit(liar.url)
    probe = http.client.HTTPConnection(address.hostname or "", address.port, timeout=STALL_TIMEOUT_S)
    try:
        probe.request("GET", f"/v1/weights/1/full/stream?from=0&manifest={manifest.sha256()}")
        response = probe.getresponse()
        assert response.status == 200 and int(response.headers["Content-Length"]) > 0
        with pytest.raises(TimeoutError):
            response.read(1)
    finally:
        probe.close()

    fetched, lag_s = fetch_timed(child, manifest, [liar.url, learner.url])

    assert fetched.blob == blob and fetched.bytes_by_source == {learner.url: len(blob)}
    assert fetched.failures[0].startswith(liar.url) and "stalled" in fetched.failures[0]
    assert STALL_TIMEOUT_S <= lag_s < STALL_TIMEOUT_S + SLACK_S
    plan, misses = plan_after_the_childs_report(api, redis_client, keys, liar.url, fetched)
    assert misses == {liar.url.encode(): b"1 1"}
    assert "liar" not in plan.values()


def test_a_parent_that_serves_60_percent_and_stalls_is_a_miss_and_loses_its_children(
    holders: list[Holder], api: httpx.Client, redis_client: redis.Redis, keys: RunKeys
) -> None:
    """The hole of the half-a-version rule: a parent that delivered 60% of every version and then stalled
    was never a miss, so it kept its children, each late by the stall timeout, version after version. A
    parent that did not deliver the whole version is a miss now (relay_plan.py, the heartbeat script)."""
    manifest, chunks, blob = new_version(1)
    liar_store = LyingParentStore(ParentLie.PARTIAL_THEN_STALL, trusted_key=PUBLIC_KEY)
    learner, liar, child = Holder(), Holder(liar_store), Holder()
    holders += [learner, liar, child]
    learner.store.put_version(manifest, chunks)
    liar.store.put_version(manifest, chunks)
    assert liar_store.num_honest_chunks(NUM_CHUNKS) == 6

    fetched, lag_s = fetch_timed(child, manifest, [liar.url, learner.url])

    assert fetched.blob == blob
    assert fetched.bytes_by_source == {liar.url: 6 * CHUNK_SIZE_BYTES, learner.url: len(blob) - 6 * CHUNK_SIZE_BYTES}
    assert fetched.failures[0].startswith(liar.url) and "stalled" in fetched.failures[0]
    assert fetched.parent_bytes >= fetched.num_bytes / 2  # what the half-a-version rule let through
    assert STALL_TIMEOUT_S <= lag_s < STALL_TIMEOUT_S + SLACK_S
    plan, misses = plan_after_the_childs_report(api, redis_client, keys, liar.url, fetched)
    assert misses == {liar.url.encode(): b"1 1"}
    assert plan["child"] == "learner" and "liar" not in plan.values()


def test_a_parent_that_dribbles_its_headers_is_cut_off_like_one_that_dribbles_its_body(
    holders: list[Holder],
) -> None:
    """A status line, then a header a byte at a time, never ended. Each byte arrives within the opening's
    read timeout (stall_timeout_s + chunk_wait_s), so the socket never timed out and the child hung in the
    opening for good, past its version timeout. The stream guard watches the opening too now."""
    manifest, chunks, blob = new_version(1)
    learner, child = Holder(), Holder()
    holders += [learner, child]
    learner.store.put_version(manifest, chunks)

    dribbler = HandWrittenParent(dribbled_head)
    try:
        fetched, lag_s = fetch_timed(child, manifest, [dribbler.url, learner.url])
    finally:
        dribbler.close()

    assert fetched.blob == blob and fetched.bytes_by_source == {learner.url: len(blob)}
    assert fetched.failures[0].startswith(f"{dribbler.url}: stalled")
    assert lag_s < STALL_TIMEOUT_S + WAIT_S + SLACK_S


def test_a_parent_that_disowns_a_chunk_and_dribbles_its_repair_is_left_within_the_bound(
    holders: list[Holder],
) -> None:
    """It sends chunk 0 with the verdict "rejected" (its own upstream failed it, it says), so the child asks
    it first for the repair, which it answers a byte at a time. A repair was a GET with a timeout per read
    and none in all: the child hung past its version timeout. A repair is a guarded stream of one chunk."""
    manifest, chunks, blob = new_version(1)
    learner, child = Holder(), Holder()
    holders += [learner, child]
    learner.store.put_version(manifest, chunks)
    assert DISOWNED == STREAM_REJECTED  # the liar speaks the protocol by hand
    liar = HandWrittenParent(disowned_repair(manifest, chunks[0]))
    try:
        fetched, lag_s = fetch_timed(child, manifest, [liar.url, learner.url])
    finally:
        liar.close()

    assert fetched.blob == blob and fetched.rejected_by_source == {liar.url: 1}
    assert fetched.failures[0].startswith(f"{liar.url}: repair of chunk 0: too slow")
    assert lag_s < 2 * STALL_TIMEOUT_S + SLACK_S  # the bound on one bad worker: 2 x stall_timeout_s
