"""The coordinator under hostile input (issue 10, item 8; first part): non-finite, huge and malformed
numbers and strings in what workers send are refused with 422 naming the field, and never reach Redis:
after every one of them the control endpoints and /metrics still answer 200. A real uvicorn, a real
redis-server."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from shared.api import JOIN_TOKEN_HEADER
from shared.config import RunConfig
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, bearer, register

pytestmark = pytest.mark.integration

# JSON texts Python's parser turns into inf / nan / a huge float, and a lone surrogate escape.
HOSTILE_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "1e308"]
CONTROL_ROUTES = ["/v1/capacity", "/v1/activation", "/v1/cost", "/v1/status", "/dashboard", "/metrics"]


@pytest.fixture
def api(serve_coordinator: ServeCoordinator, run_id: str) -> httpx.Client:
    return serve_coordinator(RunConfig(run_id=run_id)).client


def assert_control_plane_answers(api: httpx.Client) -> None:
    for route in CONTROL_ROUTES:
        response = api.get(route, headers=bearer(ADMIN_TOKEN))
        assert response.status_code == 200, (route, response.status_code, response.text[:300])


@pytest.mark.parametrize("value", HOSTILE_NUMBERS)
@pytest.mark.parametrize(
    "field",
    ["samples_per_s", "tokens_per_s", "group_latency_s", "policy_version", "num_groups_done"],
)
def test_a_heartbeat_with_a_hostile_number_is_422_and_changes_nothing(
    api: httpx.Client, field: str, value: str
) -> None:
    worker = register(api)
    body = f'{{"{field}": {value}}}'
    response = api.post(
        f"/v1/workers/{worker.worker_id}/heartbeat",
        content=body,
        headers={**bearer(worker.token), "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert field in response.text
    assert_control_plane_answers(api)


@pytest.mark.parametrize("value", HOSTILE_NUMBERS)
@pytest.mark.parametrize("field", ["announced_at_s", "swapped_at_s", "num_bytes", "policy_version"])
def test_a_swap_report_with_a_hostile_number_is_422(api: httpx.Client, field: str, value: str) -> None:
    worker = register(api)
    swap = {"policy_version": 0, "announced_at_s": 1.0, "swapped_at_s": 2.0, "num_bytes": 10}
    text = ", ".join(f'"{k}": {value if k == field else v}' for k, v in swap.items())
    response = api.post(
        f"/v1/workers/{worker.worker_id}/heartbeat",
        content=f'{{"last_swap": {{{text}}}}}',
        headers={**bearer(worker.token), "content-type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert_control_plane_answers(api)


@pytest.mark.parametrize("value", HOSTILE_NUMBERS)
@pytest.mark.parametrize("field", ["price_per_hour", "bandwidth_mbps"])
def test_a_registration_with_a_hostile_number_is_422(api: httpx.Client, field: str, value: str) -> None:
    response = api.post("/v1/workers", content=f'{{"{field}": {value}}}', headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert_control_plane_answers(api)


def test_a_lone_surrogate_in_a_name_is_422_not_a_crash(api: httpx.Client) -> None:
    response = api.post("/v1/workers", content='{"name": "w\\ud800"}', headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "name" in response.text
    assert_control_plane_answers(api)


def test_a_422_does_not_echo_the_input_back(api: httpx.Client) -> None:
    response = api.post("/v1/workers", json={"name": "x" * 30_000})  # under the body limit, over max_length
    assert response.status_code == 422
    assert len(response.content) < 2_000, len(response.content)


def test_an_oversized_body_is_413_before_it_is_parsed(api: httpx.Client) -> None:
    response = api.post("/v1/workers", content=b"[" * (2 << 20), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text[:200]
    assert_control_plane_answers(api)


def test_a_streamed_body_without_a_length_is_cut_off_at_the_limit(api: httpx.Client) -> None:
    def megabytes() -> Iterator[bytes]:
        for _ in range(32):
            yield b" " * 65536

    response = api.post("/v1/workers", content=megabytes(), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text[:200]
    assert_control_plane_answers(api)


@pytest.mark.parametrize(
    "join_token",
    ["", "x" * 300, "test-join-token-012345678", "TEST-JOIN-TOKEN-0123456789"],
    ids=["empty", "huge", "one-short", "wrong-case"],
)
def test_a_registration_with_a_near_miss_join_token_is_refused(api: httpx.Client, join_token: str) -> None:
    response = api.post("/v1/workers", json={"name": "w"}, headers={JOIN_TOKEN_HEADER: join_token})
    assert response.status_code in (401, 422), response.text
    assert "x" * 300 not in response.text  # the token is never echoed
    assert api.get("/v1/workers").json() == []


@pytest.mark.parametrize(
    "previous_worker_id",
    ["", "w\ud800", "x" * 65, "w-0123.456"],
    ids=["empty", "surrogate", "too-long", "dotted"],
)
def test_a_rejoin_claim_with_a_hostile_id_is_refused_and_creates_nothing(
    api: httpx.Client, previous_worker_id: str
) -> None:
    body = json.dumps({"name": "w", "previous_worker_id": previous_worker_id})
    response = api.post(
        "/v1/workers", content=body, headers={**bearer("w-0123.456"), "content-type": "application/json"}
    )
    assert response.status_code in (201, 422), response.text
    if response.status_code == 201:  # an id it does not know: a new worker, never the claimed one
        assert response.json()["worker_id"] != previous_worker_id and response.json()["rejoined"] is False
    assert_control_plane_answers(api)
