"""Join credentials and the identity quarantine sticks to (issue 23, item 5; services/coordinator/operators.py),
against a real redis-server and the real coordinator under uvicorn: an admin issues a credential, a worker
registers with it and carries its id; revoking it refuses registration and drains its workers; a worker
quarantined through the learner's trust score holds its credential (registering again under it, as a new
worker or as itself, is refused) until an admin releases the worker; the cluster's shared token keeps
registering throughout."""

from __future__ import annotations

import httpx
import pytest

from cluster.cli import main as cli_main
from shared.api import (
    BOOTSTRAP_PATH,
    JOIN_TOKEN_HEADER,
    IssuedOperator,
    OperatorInfo,
    OperatorState,
    RegisterWorkerResponse,
    RevokedOperator,
    WorkerInfo,
    WorkerState,
)
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.streams import LEARNER_STATE, QUARANTINE
from tests.coordinator_rest import ADMIN_TOKEN, JOIN_TOKEN, ServeCoordinator, bearer, register
from tests.integration.test_quarantine import learner_state, trust
from tests.polling import wait_for

pytestmark = pytest.mark.integration

ADMIN = bearer(ADMIN_TOKEN)


def issue(api: httpx.Client, name: str) -> IssuedOperator:
    response = api.post("/v1/operators", json={"name": name}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return IssuedOperator.model_validate(response.json())


def join_with(api: httpx.Client, join_token: str, name: str = "w", **fields: object) -> httpx.Response:
    return api.post("/v1/workers", json={"name": name, **fields}, headers={JOIN_TOKEN_HEADER: join_token})


def joined(response: httpx.Response) -> RegisterWorkerResponse:
    assert response.status_code == 201, response.text
    return RegisterWorkerResponse.model_validate(response.json())


def worker(api: httpx.Client, worker_id: str) -> WorkerInfo:
    return WorkerInfo.model_validate(api.get(f"/v1/workers/{worker_id}").json())


def operator(api: httpx.Client, operator_id: str) -> OperatorInfo:
    response = api.get(f"/v1/operators/{operator_id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    return OperatorInfo.model_validate(response.json())


def test_an_issued_credential_registers_workers_under_its_id_until_an_admin_revokes_it(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    api = serve_coordinator(RunConfig(run_id=run_id)).client
    shared = register(api, "fleet")
    assert api.post("/v1/operators", json={"name": "x"}).status_code == 401
    assert api.post("/v1/operators", json={"name": "x"}, headers=bearer(shared.token)).status_code == 403
    assert api.get("/v1/operators", headers=bearer(shared.token)).status_code == 403

    alice = issue(api, "alice")
    assert alice.operator.state == OperatorState.ACTIVE and alice.join_token.startswith(alice.operator.operator_id)
    gpu = joined(join_with(api, alice.join_token, "alice-gpu"))
    assert worker(api, gpu.worker_id).operator_id == alice.operator.operator_id
    assert worker(api, shared.worker_id).operator_id == ""  # the shared token: no credential
    listed = [OperatorInfo.model_validate(o) for o in api.get("/v1/operators", headers=ADMIN).json()]
    assert [(o.operator_id, o.worker_ids) for o in listed] == [(alice.operator.operator_id, [gpu.worker_id])]
    # the credential passes the bootstrap's join check (this coordinator has no bootstrap to give: 404, not 401)
    assert api.get(BOOTSTRAP_PATH, headers={JOIN_TOKEN_HEADER: alice.join_token}).status_code == 404
    forged = alice.operator.operator_id + ".not-its-secret"
    assert join_with(api, forged).status_code == 401

    response = api.delete(f"/v1/operators/{alice.operator.operator_id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    revoked = RevokedOperator.model_validate(response.json())
    assert revoked.operator.state == OperatorState.REVOKED and revoked.drained_worker_ids == [gpu.worker_id]
    assert worker(api, gpu.worker_id).state == WorkerState.DRAINING
    refused = join_with(api, alice.join_token, "alice-again")
    assert refused.status_code == 403 and "revoked" in refused.json()["detail"]
    assert api.get(BOOTSTRAP_PATH, headers={JOIN_TOKEN_HEADER: alice.join_token}).status_code == 403
    assert api.delete("/v1/operators/op-unknown", headers=ADMIN).status_code == 404
    joined(join_with(api, JOIN_TOKEN, "fleet-2"))  # the shared token is untouched


def test_quarantine_sticks_to_the_credential_until_an_admin_releases_the_worker(
    serve_coordinator: ServeCoordinator, run_id: str, bus: StreamBus
) -> None:
    api = serve_coordinator(RunConfig(run_id=run_id)).client
    mallory, bob = issue(api, "mallory"), issue(api, "bob")
    liar = joined(join_with(api, mallory.join_token, "liar"))
    honest = joined(join_with(api, bob.join_token, "honest"))
    shared_liar = register(api, "shared-liar")
    suspects = {liar.worker_id: trust(suspect=True), shared_liar.worker_id: trust(suspect=True)}
    bus.put_state(LEARNER_STATE, learner_state(run_id, suspects | {honest.worker_id: trust(suspect=False)}))

    wait_for(lambda: operator(api, mallory.operator.operator_id).state == OperatorState.QUARANTINED, "held")
    assert worker(api, liar.worker_id).state == WorkerState.QUARANTINED
    assert operator(api, mallory.operator.operator_id).quarantined_worker_ids == [liar.worker_id]
    # attack 8: registering again under the credential, as a new worker or as itself, is refused
    again = join_with(api, mallory.join_token, "liar-reborn")
    assert again.status_code == 403 and liar.worker_id in again.json()["detail"]
    rejoin = api.post(
        "/v1/workers",
        json={"name": "liar", "previous_worker_id": liar.worker_id},
        headers={JOIN_TOKEN_HEADER: mallory.join_token} | bearer(liar.token),
    )
    assert rejoin.status_code == 403
    # another credential, and the shared token (whose quarantined worker cannot hold it), still register
    assert operator(api, bob.operator.operator_id).state == OperatorState.ACTIVE
    joined(join_with(api, bob.join_token, "honest-2"))
    wait_for(lambda: worker(api, shared_liar.worker_id).state == WorkerState.QUARANTINED, "the shared liar")
    joined(join_with(api, JOIN_TOKEN, "shared-liar-reborn"))

    assert api.post(f"/v1/workers/{liar.worker_id}/release", headers=ADMIN).status_code == 200
    released = operator(api, mallory.operator.operator_id)
    assert released.state == OperatorState.ACTIVE and released.quarantined_worker_ids == []
    assert worker(api, joined(join_with(api, mallory.join_token, "liar-2")).worker_id).operator_id == (
        mallory.operator.operator_id
    )


def test_a_worker_rejoins_only_under_the_credential_it_registered_with(
    serve_coordinator: ServeCoordinator, run_id: str
) -> None:
    api = serve_coordinator(RunConfig(run_id=run_id)).client
    carol = issue(api, "carol")
    first = joined(join_with(api, carol.join_token, "carol-gpu"))
    as_itself = {"name": "carol-gpu", "previous_worker_id": first.worker_id}

    moved = api.post("/v1/workers", json=as_itself, headers={JOIN_TOKEN_HEADER: JOIN_TOKEN} | bearer(first.token))
    assert moved.status_code == 403 and carol.operator.operator_id in moved.json()["detail"]
    back = joined(
        api.post("/v1/workers", json=as_itself, headers={JOIN_TOKEN_HEADER: carol.join_token} | bearer(first.token))
    )
    assert back.rejoined and back.worker_id == first.worker_id
    assert worker(api, first.worker_id).operator_id == carol.operator.operator_id


def test_relay_rl_operators_issues_lists_budgets_and_revokes(
    serve_coordinator: ServeCoordinator,
    run_id: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    served = serve_coordinator(RunConfig(run_id=run_id))
    monkeypatch.setenv("RL_ADMIN_TOKEN", ADMIN_TOKEN)
    at = ["--coordinator", served.url]

    cli_main(["operators", "issue", "dave", *at])
    issued = capsys.readouterr().out.splitlines()
    operator_id, join_token = issued[0].split()[1], issued[1]
    gpu = joined(join_with(served.client, join_token, "dave-gpu"))
    cli_main(["operators", "list", *at])
    listed = capsys.readouterr().out
    assert operator_id in listed and "active" in listed and gpu.worker_id in listed
    cli_main(["operators", "budget", operator_id, "--max-workers", "12", "--max-leases", "40", *at])
    assert "up to 12 workers, 40 leases" in capsys.readouterr().out
    cli_main(["operators", "issue", "erin", "--max-workers", "3", *at])
    assert "up to 3 workers" in capsys.readouterr().out
    with pytest.raises(SystemExit) as not_quarantined:
        cli_main(["operators", "release", operator_id, *at])
    assert "409" in str(not_quarantined.value.code)
    cli_main(["operators", "revoke", operator_id, *at])
    assert f"revoked {operator_id}" in capsys.readouterr().out
    assert join_with(served.client, join_token).status_code == 403
    with pytest.raises(SystemExit) as refused:
        cli_main(["operators", "revoke", "op-unknown", *at])
    assert "404" in str(refused.value.code)


def test_a_pass_that_read_the_workers_before_a_release_quarantines_nobody_again(
    serve_coordinator: ServeCoordinator, run_id: str, bus: StreamBus
) -> None:
    served = serve_coordinator(RunConfig(run_id=run_id))
    api, control = served.client, served.app.state.control
    mallory = issue(api, "mallory")
    liar = joined(join_with(api, mallory.join_token, "liar"))
    bus.put_state(LEARNER_STATE, learner_state(run_id, {liar.worker_id: trust(suspect=True)}))
    wait_for(lambda: operator(api, mallory.operator.operator_id).state == OperatorState.QUARANTINED, "held")

    read_before_the_release = control.coordinator.registry.list_workers()
    assert api.post(f"/v1/workers/{liar.worker_id}/release", headers=ADMIN).status_code == 200
    control.quarantine.apply(bus.get_state(LEARNER_STATE), read_before_the_release)

    quarantine = bus.get_state(QUARANTINE)
    assert quarantine is not None and quarantine.worker_ids == []
    assert worker(api, liar.worker_id).state == WorkerState.ACTIVE
    assert operator(api, mallory.operator.operator_id).state == OperatorState.ACTIVE
