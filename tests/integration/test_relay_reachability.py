"""Workers behind NAT (issue 36, item 3), against the real coordinator under uvicorn, real chunk servers and
real closed ports: the coordinator's connect-back probe (services/coordinator/reachability.py) finds a worker
nobody can connect to, the relay plan makes it a leaf, and a worker that opens its port (or rejoins at a
reachable address) relays after its next probe; a child's miss has its parent probed again at once."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from cluster.ports import free_port
from services.coordinator.reachability import PROBE_INTERVAL_S
from shared.api import ParentResponse, RegisterWorkerResponse, RelayPlanResponse, WorkerInfo
from shared.config import RunConfig
from shared.weight_channel import ChunkServer, ChunkStore, holder_answers
from tests.coordinator_rest import ServeCoordinator, ServedCoordinator, announce, bearer, register
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def chunk_servers() -> Iterator[list[ChunkServer]]:
    """Chunk servers a test starts (an empty store answers /healthz like any worker's), stopped at its end."""
    started: list[ChunkServer] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def served(run_id: str, serve_coordinator: ServeCoordinator) -> ServedCoordinator:
    """The coordinator with probing on (the default)."""
    return serve_coordinator(RunConfig(run_id=run_id))


def start_chunk_server(chunk_servers: list[ChunkServer], port: int = 0) -> ChunkServer:
    server = ChunkServer(ChunkStore(keep_versions=1), port=port, wait_s=1.0).start()
    chunk_servers.append(server)
    return server


def reachability(api: httpx.Client) -> dict[str, bool | None]:
    """name -> inbound_reachable, from GET /v1/workers."""
    return {w.name: w.inbound_reachable for w in map(WorkerInfo.model_validate, api.get("/v1/workers").json())}


def plan(api: httpx.Client) -> dict[str, str]:
    """name -> the name of its parent ("learner" for a seed)."""
    body = RelayPlanResponse.model_validate(api.get("/v1/broadcast/plan").json())
    name_of = {a.worker_id: a.name for a in body.assignments} | {"learner": "learner"}
    return {a.name: name_of[a.parent_id] for a in body.assignments}


def parent_of(api: httpx.Client, worker: RegisterWorkerResponse) -> ParentResponse:
    response = api.get(f"/v1/workers/{worker.worker_id}/parent")
    assert response.status_code == 200, response.text
    return ParentResponse.model_validate(response.json())


def unreachable_counted(api: httpx.Client) -> str | None:
    """GET /metrics once it counts one unreachable worker (the gauge follows the control loop's passes)."""
    text = api.get("/metrics").text
    return text if "relayrl_fleet_workers_unreachable 1.0" in text else None


def probed(api: httpx.Client, *names: str) -> dict[str, bool | None] | None:
    """The workers' reachability once every one of `names` has been probed, else None (for wait_for)."""
    seen = reachability(api)
    return seen if all(seen.get(name) is not None for name in names) else None


def test_a_worker_nobody_can_connect_to_is_a_leaf_and_the_reachable_ones_relay(
    served: ServedCoordinator, chunk_servers: list[ChunkServer]
) -> None:
    """Behind NAT: it advertises a port nothing listens on, and claims the fastest link of all, which would
    make it the seed. Probed at registration, it is a leaf at the tail: nobody's parent or fallback."""
    api = served.client
    fast = register(api, "fast", endpoint_url=start_chunk_server(chunk_servers).url, bandwidth_mbps=900)
    slow = register(api, "slow", endpoint_url=start_chunk_server(chunk_servers).url, bandwidth_mbps=100)
    nat_url = f"http://127.0.0.1:{free_port()}"
    nat = register(api, "nat", endpoint_url=nat_url, bandwidth_mbps=10_000)

    seen = wait_for(lambda: probed(api, "fast", "slow", "nat"), "the probes at registration", timeout_s=10)

    assert seen == {"fast": True, "slow": True, "nat": False}
    assert plan(api) == {"fast": "learner", "slow": "fast", "nat": "slow"}  # the claim ranks it first, still a leaf
    assert parent_of(api, nat).parent_url == chunk_servers[1].url  # slow's: it fetches, from a reachable parent
    for worker in (fast, slow, nat):
        assert nat_url not in parent_of(api, worker).fallback_urls
    status = api.get("/v1/status").json()
    assert {w["name"]: w["inbound_reachable"] for w in status["workers"]} == seen
    metrics = wait_for(lambda: unreachable_counted(api), "a control pass to count the unreachable worker", timeout_s=10)
    assert 'relayrl_coordinator_reachability_probes_total{outcome="unreachable"} 1.0' in metrics
    assert 'relayrl_coordinator_reachability_probes_total{outcome="reachable"} 2.0' in metrics


def test_a_worker_that_opens_its_port_relays_after_the_next_probe(
    served: ServedCoordinator, chunk_servers: list[ChunkServer]
) -> None:
    api = served.client
    clock = served.app.state.reachability.clock = ManualClock()  # the probe schedule's
    register(api, "fast", endpoint_url=start_chunk_server(chunk_servers).url, bandwidth_mbps=900)
    port = free_port()
    register(api, "opened", endpoint_url=f"http://127.0.0.1:{port}", bandwidth_mbps=5_000)
    wait_for(lambda: probed(api, "fast", "opened"), "the probes at registration", timeout_s=10)
    assert plan(api) == {"fast": "learner", "opened": "fast"}

    start_chunk_server(chunk_servers, port)  # the operator forwards the port; nothing tells the coordinator
    clock.advance(PROBE_INTERVAL_S)

    wait_for(lambda: reachability(api)["opened"], "the next periodic probe to reach it", timeout_s=10)
    assert plan(api) == {"opened": "learner", "fast": "opened"}  # ranked by its claim now that it may relay


def test_a_parent_its_child_reports_as_a_miss_is_probed_again_at_once(
    served: ServedCoordinator, chunk_servers: list[ChunkServer], redis_client: redis.Redis, run_id: str
) -> None:
    """It was reachable and loses its port forward; its child falls back to the learner and says so with its
    swap report. That miss has the coordinator probe it then, not a probe interval later."""
    api = served.client
    served.app.state.reachability.clock = ManualClock()  # no periodic probe comes due in this test
    flaky_server = start_chunk_server(chunk_servers)
    flaky = register(api, "flaky", endpoint_url=flaky_server.url, bandwidth_mbps=900)
    child = register(api, "child", endpoint_url=f"http://127.0.0.1:{free_port()}", bandwidth_mbps=100)
    wait_for(lambda: probed(api, "flaky", "child"), "the probes at registration", timeout_s=10)
    start_s = time.time() - 30
    announce(redis_client, run_id, 1, start_s, publish_started_at_s=start_s)
    assert parent_of(api, child).parent_id == flaky.worker_id  # served: its report may speak of flaky
    flaky_server.stop()
    chunk_servers.remove(flaky_server)

    swap = {
        "policy_version": 1,
        "announced_at_s": start_s,
        "swapped_at_s": start_s + 20,
        "num_bytes": 8 << 20,
        "parent_url": flaky_server.url,
        "parent_bytes": 0,
    }
    response = api.post(
        f"/v1/workers/{child.worker_id}/heartbeat",
        json={"policy_version": 1, "last_swap": swap},
        headers=bearer(child.token),
    )
    assert response.status_code == 200, response.text

    wait_for(lambda: reachability(api)["flaky"] is False, "the probe after the child's miss", timeout_s=10)
    assert plan(api) == {"child": "learner", "flaky": "learner"}  # two leaves: nobody relays


def test_a_worker_that_rejoins_at_another_address_is_probed_there_at_once(
    served: ServedCoordinator, chunk_servers: list[ChunkServer]
) -> None:
    """Its lease ran out behind NAT; it comes back as itself with a forwarded port: the old verdict is dropped
    with the rejoin and the new address probed then, not a probe interval later."""
    api = served.client
    register(api, "relay", endpoint_url=start_chunk_server(chunk_servers).url, bandwidth_mbps=900)
    worker = register(api, "mover", endpoint_url=f"http://127.0.0.1:{free_port()}", bandwidth_mbps=1_000)
    wait_for(lambda: probed(api, "relay", "mover"), "the probes at registration", timeout_s=10)
    assert reachability(api)["mover"] is False
    registry = served.app.state.coordinator.registry
    registry.redis.zadd(registry.keys.worker_leases, {worker.worker_id: 0.0})  # its lease ran out

    body = {
        "name": "mover",
        "endpoint_url": start_chunk_server(chunk_servers).url,
        "previous_worker_id": worker.worker_id,
    }
    response = api.post("/v1/workers", json=body, headers=bearer(worker.token))
    assert response.status_code == 201 and response.json()["rejoined"], response.text
    assert reachability(api)["mover"] is not False  # the old address's verdict went with the rejoin

    wait_for(lambda: reachability(api)["mover"], "the probe of the rejoin", timeout_s=10)
    assert plan(api) == {"mover": "learner", "relay": "mover"}  # its new link ranks it first, and it may relay


def test_the_probe_is_a_connection_and_a_health_answer_of_a_chunk_server(chunk_servers: list[ChunkServer]) -> None:
    """holder_answers: True only for a chunk server's 200 "ok"; refused, silent, another server or a bad URL
    are all False, each within the timeout."""
    server = start_chunk_server(chunk_servers)
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the backlog does) and never answers
    other = socket.create_server(("127.0.0.1", 0))  # answers every request with another server's 200
    try:

        async def probe_all() -> list[bool]:
            answer_other = asyncio.create_task(asyncio.to_thread(answer_once, other, b'{"ok": true}'))
            outcomes = await asyncio.gather(
                holder_answers(server.url, 1.0),
                holder_answers(server.url + "/", 1.0),
                holder_answers(f"http://127.0.0.1:{free_port()}", 1.0),
                holder_answers(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.2),
                holder_answers(f"http://127.0.0.1:{other.getsockname()[1]}", 1.0),
                holder_answers("https://127.0.0.1:1", 1.0),
                holder_answers("http://127.0.0.1:99999", 1.0),
                holder_answers("http://127.0.0.1:1/\x00x", 1.0),
                holder_answers("not a url", 1.0),
            )
            await answer_other
            return outcomes

        assert asyncio.run(probe_all()) == [True, True, False, False, False, False, False, False, False]
    finally:
        silent.close()
        other.close()


def answer_once(listener: socket.socket, body: bytes) -> None:
    """Accept one connection and answer it 200 with `body`, whatever it asked."""
    listener.settimeout(5.0)
    connection, _ = listener.accept()
    with connection:
        connection.recv(4096)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
