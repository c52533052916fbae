"""What one join credential may hold (services/coordinator/credential_budget.py) and how fast it may register
(services/coordinator/registration_limit.py): a cap on live identities, a bucket per credential (one's flood
never delays another's), a bucket per address on the unauthenticated path, an admin's budget per credential;
and thousands of dead identities cost status and listings nothing (a page, counts). A real uvicorn, a real
redis-server, hand-driven lease clocks."""

from __future__ import annotations

import httpx
import pytest
import redis

from services.coordinator.app import create_app
from shared.api import JOIN_TOKEN_HEADER, STATUS_MAX_WORKERS, OperatorInfo, RegisterWorkerRequest, StatusResponse
from shared.config import CoordinatorConfig, CredentialConfig, RunConfig
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, bearer, issue_credential, register
from tests.manual_clock import ManualClock
from tests.uvicorn_thread import serve

pytestmark = pytest.mark.integration

LEASE_S = 5.0


def post_worker(api: httpx.Client, name: str, join_token: str | None = None) -> httpx.Response:
    headers = {} if join_token is None else {JOIN_TOKEN_HEADER: join_token}
    return api.post("/v1/workers", json={"name": name}, headers=headers)


def test_a_credential_holds_at_most_its_cap_of_live_identities(
    serve_coordinator: ServeCoordinator, run_id: str, clock: ManualClock
) -> None:
    run = RunConfig(
        run_id=run_id,
        coordinator=CoordinatorConfig(lease_s=LEASE_S),
        credentials=CredentialConfig(max_workers=2, registrations_per_min=1e7),
    )
    api = serve_coordinator(run, lease_clock=clock).client
    token = issue_credential(api, "operator")
    first, second = register(api, "a", join_token=token), register(api, "b", join_token=token)

    third = post_worker(api, "c", token)
    assert third.status_code == 429 and "holds 2 live workers, its cap" in third.json()["detail"]
    assert int(third.headers["Retry-After"]) >= 1
    assert post_worker(api, "shared").status_code == 201  # another credential (the shared token) is not held back

    api.delete(f"/v1/workers/{first.worker_id}", headers=bearer(first.token))  # one leaves: room for one
    assert post_worker(api, "d", token).status_code == 201
    clock.advance(LEASE_S + 1)  # every lease runs out: the dead hold no place
    assert post_worker(api, "e", token).status_code == 201
    rejoin = api.post(
        "/v1/workers",
        json={"name": "b", "previous_worker_id": second.worker_id},
        headers={JOIN_TOKEN_HEADER: token} | bearer(second.token),
    )
    assert rejoin.status_code == 201 and rejoin.json()["rejoined"]  # a returning one takes the second place
    assert post_worker(api, "f", token).status_code == 429


def test_one_credentials_registration_flood_never_delays_another(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    run = RunConfig(run_id=run_id, credentials=CredentialConfig(registrations_per_min=6, max_workers=3))
    api = serve_coordinator(run).client
    flooder, other = issue_credential(api, "flooder"), issue_credential(api, "other")

    flood = [post_worker(api, f"sybil-{i}", flooder) for i in range(10)]

    assert [r.status_code for r in flood[:3]] == [201] * 3 and {r.status_code for r in flood[3:]} == {429}
    assert all("its cap" in r.json()["detail"] for r in flood[3:6])  # its cap of 3 live, then its bucket of 6
    assert all("too many registrations" in r.json()["detail"] for r in flood[6:])
    assert post_worker(api, "honest", other).status_code == 201
    assert post_worker(api, "local", None).status_code == 201  # the shared token has a bucket of its own too
    throttled = api.get("/metrics").text
    # its token verified and its bucket empty, the rest were refused before FastAPI read them
    assert 'relayrl_coordinator_registrations_throttled_total{bucket="early"} 4.0' in throttled


def test_guessed_join_tokens_are_limited_per_address_and_the_right_one_still_registers(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    run = RunConfig(run_id=run_id, credentials=CredentialConfig(registrations_per_min_per_address=6, max_workers=3))
    api = serve_coordinator(run).client

    guesses = [post_worker(api, "guess", f"op-000000000000.guess-{i}").status_code for i in range(9)]

    assert guesses[:6] == [401] * 6 and set(guesses[6:]) == {429}  # bursts of twice max_workers
    assert post_worker(api, "right").status_code == 201  # a valid credential draws from its own bucket


def test_an_admin_sets_a_credentials_budget_and_reads_its_record(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    api = serve_coordinator(
        RunConfig(run_id=run_id, credentials=CredentialConfig(max_workers=1, registrations_per_min=1e7))
    ).client
    token = issue_credential(api, "big operator", max_leases=64)
    operator_id = token.partition(".")[0]
    worker = register(api, "first", join_token=token)
    assert post_worker(api, "second", token).status_code == 429

    raised = api.patch(f"/v1/operators/{operator_id}", json={"max_workers": 4}, headers=bearer(ADMIN_TOKEN))
    assert raised.status_code == 200, raised.text
    assert post_worker(api, "second", token).status_code == 201

    info = OperatorInfo.model_validate(api.get(f"/v1/operators/{operator_id}", headers=bearer(ADMIN_TOKEN)).json())
    assert info.budget is not None and (info.budget.max_workers, info.budget.max_leases) == (4, 64)
    assert info.budget.registrations_per_min == 1e7  # the run's default: not set for this credential
    assert worker.worker_id in info.worker_ids and len(info.worker_ids) == 2
    assert info.record is not None and info.record.leased == 0
    refused = api.patch(f"/v1/operators/{operator_id}", json={"max_workers": 0}, headers=bearer(ADMIN_TOKEN))
    assert refused.status_code == 422
    assert api.patch(f"/v1/operators/{operator_id}", json={"max_workers": 9}).status_code == 401  # the admin's only


def test_after_ten_thousand_registrations_of_one_credential_status_and_listings_stay_small(
    serve_coordinator: ServeCoordinator, run_id: str, clock: ManualClock
) -> None:
    run = RunConfig(
        run_id=run_id, coordinator=CoordinatorConfig(lease_s=LEASE_S), credentials=CredentialConfig(max_workers=20_000)
    )
    served = serve_coordinator(run, lease_clock=clock)
    api = served.client
    flooder = issue_credential(api, "flooder").partition(".")[0]
    registry = served.app.state.coordinator.registry
    for i in range(10_000):  # the registry directly (REST registration is timed by make bench-sybil)
        registry.register(f"w-{i:016x}", RegisterWorkerRequest(name=f"sybil-{i}"), f"digest-{i}", operator_id=flooder)
    clock.advance(LEASE_S + 1)  # hit and run: every one of them is dead
    honest = register(api, "honest")

    status = api.get("/v1/status")

    assert status.status_code == 200 and len(status.content) < 64 * 1024
    body = StatusResponse.model_validate_json(status.content)
    assert body.num_workers_by_state == {"active": 1, "dead": 10_000}
    assert body.workers[0].worker_id == honest.worker_id and len(body.workers) == STATUS_MAX_WORKERS
    page = api.get("/v1/workers", params={"state": "dead", "limit": 100, "offset": 200})
    assert page.status_code == 200 and len(page.json()) == 100 and page.headers["X-Total-Count"] == "10000"
    mine = api.get("/v1/workers", params={"operator_id": "", "limit": 10})
    assert [w["worker_id"] for w in mine.json()] == [honest.worker_id]
    assert post_worker(api, "another", None).status_code == 201  # another credential registers at once


def test_without_a_shared_token_only_issued_credentials_register(redis_client: redis.Redis, run_id: str) -> None:
    """Compose and Helm run the coordinator with credentials it provisions and no shared join token."""
    app = create_app(RunConfig(run_id=run_id), redis_client, ADMIN_TOKEN, None, open_registration=False)
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as api:
        token = issue_credential(api, "compose workers")
        assert post_worker(api, "anonymous").status_code == 401
        assert post_worker(api, "guess", "not-a-token-of-this-run").status_code == 401
        assert post_worker(api, "worker-0", token).status_code == 201
