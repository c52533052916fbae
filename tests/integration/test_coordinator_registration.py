"""Registration under hostile input and after outages (issue 10, items 6 and 8): the join token (401),
the credential's rate limit (429 + Retry-After, honoured by the worker's membership loop; the budgets
themselves: test_credential_budgets.py), and a worker whose lease
ran out rejoining as itself (same id, same totals; 403 for another worker's token). A real uvicorn, a
real redis-server, hand-driven lease clocks."""

from __future__ import annotations

import threading

import httpx
import pytest
import redis

from cluster.ports import free_port
from services.rollout.coordinator_client import CoordinatorClient, RegistrationThrottledError
from services.rollout.membership import Membership
from shared.api import JOIN_TOKEN_HEADER, HeartbeatRequest, RegisterWorkerRequest, WorkerInfo
from shared.bus import StreamBus
from shared.config import CoordinatorConfig, CredentialConfig, RolloutConfig, RunConfig
from shared.keys import RunKeys
from shared.messages import QuarantinedWorkers
from shared.streams import QUARANTINE
from tests.coordinator_rest import JOIN_TOKEN, ServeCoordinator, bearer, register, served_coordinator
from tests.manual_clock import ManualClock
from tests.polling import wait_for

pytestmark = pytest.mark.integration

LEASE_S = 5.0


@pytest.fixture
def lease_run(run_id: str) -> RunConfig:
    return RunConfig(
        run_id=run_id, rollout=RolloutConfig(heartbeat_interval_s=0.05), coordinator=CoordinatorConfig(lease_s=LEASE_S)
    )


def workers(api: httpx.Client) -> list[WorkerInfo]:
    return [WorkerInfo.model_validate(item) for item in api.get("/v1/workers").json()]


def test_registration_needs_the_join_token(serve_coordinator: ServeCoordinator, run_id: str) -> None:
    url = serve_coordinator(RunConfig(run_id=run_id)).url
    missing = httpx.post(f"{url}/v1/workers", json={"name": "w"})
    wrong = httpx.post(f"{url}/v1/workers", json={"name": "w"}, headers={JOIN_TOKEN_HEADER: "not-the-join-token"})
    right = httpx.post(f"{url}/v1/workers", json={"name": "w"}, headers={JOIN_TOKEN_HEADER: JOIN_TOKEN})

    assert missing.status_code == 401 and JOIN_TOKEN_HEADER in missing.json()["detail"]
    assert wrong.status_code == 401 and "wrong" in wrong.json()["detail"]
    assert right.status_code == 201
    assert len(httpx.get(f"{url}/v1/workers").json()) == 1  # the refused ones left nothing behind


def test_registrations_beyond_the_rate_limit_get_429_with_retry_after(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    run = RunConfig(run_id=run_id, credentials=CredentialConfig(registrations_per_min=30, max_workers=2))
    api = serve_coordinator(run).client
    answers = [api.post("/v1/workers", json={"name": f"w{i}"}) for i in range(5)]  # one credential: the shared token

    assert [a.status_code for a in answers] == [201, 201, 429, 429, 429]
    assert all("its cap" in a.json()["detail"] for a in answers[2:4])  # 2 live: its cap; bursts of 4 attempts
    assert 1 <= int(answers[4].headers["Retry-After"]) <= 2  # one token refills in 2 s
    assert "too many registrations" in answers[4].json()["detail"]
    assert len(workers(api)) == 2


def test_the_membership_loop_waits_out_a_429_and_then_registers(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    run = RunConfig(run_id=run_id, credentials=CredentialConfig(registrations_per_min=120, max_workers=1))
    served = serve_coordinator(run)
    first = register(served.client, "first")
    assert served.client.post("/v1/workers", json={"name": "full"}).status_code == 429  # its cap: the bucket is empty
    client = CoordinatorClient(served.url, join_token=JOIN_TOKEN)
    with pytest.raises(RegistrationThrottledError) as throttled:
        client.register(RegisterWorkerRequest(name="eager"))
    assert throttled.value.retry_after_s == 1.0
    served.client.delete(f"/v1/workers/{first.worker_id}", headers=bearer(first.token))  # room under the cap of 1

    membership = Membership(client, RegisterWorkerRequest(name="patient"), HeartbeatRequest, threading.Event())
    registration = membership.register()  # waits out Retry-After, then succeeds

    assert registration.worker_id in {w.worker_id for w in workers(served.client)}
    assert membership.num_registrations == 1


def test_an_expired_worker_rejoins_with_its_id_and_totals(
    serve_coordinator: ServeCoordinator, lease_run: RunConfig, clock: ManualClock
) -> None:
    served = serve_coordinator(lease_run, lease_clock=clock)
    api = served.client
    worker, other = register(api, "returning"), register(api, "bystander")
    beat = api.post(
        f"/v1/workers/{worker.worker_id}/heartbeat", json={"policy_version": 3}, headers=bearer(worker.token)
    )
    assert beat.status_code == 200
    # its totals, as the work API counts accepted groups on its record (services/coordinator/work_leases.py)
    coordinator = served.app.state.coordinator
    coordinator.redis.hset(
        coordinator.keys.worker(worker.worker_id), mapping={"num_groups_done": 7, "num_samples_done": 56}
    )
    clock.advance(LEASE_S + 1)  # an outage longer than the lease: both are dead
    assert (
        api.post(f"/v1/workers/{worker.worker_id}/heartbeat", json={}, headers=bearer(worker.token)).status_code == 410
    )

    again = api.post(
        "/v1/workers", json={"name": "returning", "previous_worker_id": worker.worker_id}, headers=bearer(worker.token)
    )

    assert again.status_code == 201, again.text
    body = again.json()
    assert body["worker_id"] == worker.worker_id and body["rejoined"] is True
    listed = {w.worker_id: w for w in workers(api)}
    assert set(listed) == {worker.worker_id, other.worker_id}  # one record per process, not a third
    revived = listed[worker.worker_id]
    assert (revived.state, revived.num_groups_done, revived.num_samples_done) == ("active", 7, 56)
    assert revived.lease_expires_at_s == clock() + LEASE_S
    new_token = body["token"]
    assert api.post(f"/v1/workers/{worker.worker_id}/heartbeat", json={}, headers=bearer(new_token)).status_code == 200
    # the old token was replaced: it no longer authenticates
    assert (
        api.post(f"/v1/workers/{worker.worker_id}/heartbeat", json={}, headers=bearer(worker.token)).status_code == 401
    )


def test_a_rejoin_with_another_workers_token_is_403_and_without_one_401(
    serve_coordinator: ServeCoordinator, lease_run: RunConfig, clock: ManualClock
) -> None:
    api = serve_coordinator(lease_run, lease_clock=clock).client
    victim, thief = register(api, "victim"), register(api, "thief")
    clock.advance(LEASE_S + 1)
    claim = {"name": "thief", "previous_worker_id": victim.worker_id}

    stolen = api.post("/v1/workers", json=claim, headers=bearer(thief.token))
    bare = api.post("/v1/workers", json=claim)
    forged = api.post("/v1/workers", json=claim, headers=bearer(victim.worker_id + ".forged"))

    assert stolen.status_code == 403 and victim.worker_id in stolen.json()["detail"]
    assert bare.status_code == 401
    assert forged.status_code == 403
    assert {w.worker_id: w.state for w in workers(api)} == {victim.worker_id: "dead", thief.worker_id: "dead"}


def test_a_rejoin_under_an_id_the_coordinator_no_longer_knows_gets_a_new_id(
    serve_coordinator: ServeCoordinator, lease_run: RunConfig
) -> None:
    api = serve_coordinator(lease_run).client
    answer = api.post(
        "/v1/workers", json={"name": "w", "previous_worker_id": "w-0000000000000000"}, headers=bearer("w-0.x")
    )
    assert answer.status_code == 201
    assert answer.json()["worker_id"] != "w-0000000000000000" and answer.json()["rejoined"] is False


def test_the_membership_loop_keeps_its_id_across_a_coordinator_restart_longer_than_the_lease(
    lease_run: RunConfig, redis_client: redis.Redis, clock: ManualClock
) -> None:
    port = free_port()
    with served_coordinator(lease_run, redis_client, lease_clock=clock, port=port) as first:
        client = CoordinatorClient(first.url, timeout_s=1.0, join_token=JOIN_TOKEN)
        membership = Membership(
            client, RegisterWorkerRequest(name="steady"), lambda: HeartbeatRequest(), threading.Event()
        )
        worker_id = membership.register().worker_id
        redis_client.hset(
            first.app.state.coordinator.keys.worker(worker_id), "num_groups_done", 5
        )  # as the work API counts
        membership.start_heartbeats()
        wait_for(lambda: membership.last_heartbeat is not None, "a first heartbeat")
    try:
        clock.advance(LEASE_S * 3)  # the coordinator stays down longer than the lease
        with served_coordinator(lease_run, redis_client, lease_clock=clock, port=port) as second:
            wait_for(lambda: membership.num_registrations >= 2, "the worker rejoins the restarted coordinator")
            listed = workers(second.client)
            assert [w.worker_id for w in listed] == [worker_id]
            wait_for(lambda: workers(second.client)[0].state == "active", "the rejoined worker is active")
            assert workers(second.client)[0].num_groups_done == 5
            membership.raise_if_failed()
            membership.leave()
    finally:
        membership.leave()


def test_a_draining_worker_cannot_rejoin_its_way_back_to_active(
    serve_coordinator: ServeCoordinator, lease_run: RunConfig
) -> None:
    api = serve_coordinator(lease_run).client
    worker = register(api, "leaving")
    assert api.post(f"/v1/workers/{worker.worker_id}/drain", headers=bearer(worker.token)).status_code == 200

    again = api.post(
        "/v1/workers", json={"name": "leaving", "previous_worker_id": worker.worker_id}, headers=bearer(worker.token)
    )

    assert again.status_code == 409 and "draining" in again.json()["detail"]
    assert [(w.worker_id, w.state) for w in workers(api)] == [(worker.worker_id, "draining")]


def test_a_quarantined_worker_whose_lease_ran_out_cannot_rejoin_its_way_out(
    serve_coordinator: ServeCoordinator, lease_run: RunConfig, clock: ManualClock, redis_client: redis.Redis
) -> None:
    api = serve_coordinator(lease_run, lease_clock=clock).client
    worker = register(api, "suspect")
    quarantined = QuarantinedWorkers(run_id=lease_run.run_id, worker_ids=[worker.worker_id])
    StreamBus(redis_client, RunKeys(lease_run.run_id), service="test").put_state(QUARANTINE, quarantined)
    clock.advance(LEASE_S + 1)

    again = api.post(
        "/v1/workers", json={"name": "suspect", "previous_worker_id": worker.worker_id}, headers=bearer(worker.token)
    )

    assert again.status_code == 409 and "quarantined" in again.json()["detail"]
    assert [(w.worker_id, w.state) for w in workers(api)] == [(worker.worker_id, "dead")]
