"""Every operation of the coordinator's OpenAPI document, fed hostile input by hypothesis (issue 10,
item 8): non-finite and huge numbers, numbers where strings go and the reverse, lone surrogates, deep
nesting, odd path and query values, with the admin's or a worker's own token. Property: no answer is a
server error (5xx), and afterwards every control endpoint still answers 200. A real uvicorn, a real
redis-server; each example is one HTTP request."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.config import RunConfig
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, bearer, register

pytestmark = pytest.mark.integration

# JSON number texts Python's json module accepts and turns into non-finite or extreme values
HOSTILE_NUMBER_TEXTS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e308", "-1e308", "1" + "0" * 400, "-0.0"]
CONTROL_ROUTES = ["/v1/capacity", "/v1/activation", "/v1/cost", "/v1/status", "/dashboard", "/metrics"]

json_scalars = st.one_of(
    st.sampled_from(HOSTILE_NUMBER_TEXTS),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=40).map(lambda text: json.dumps(text)),
    st.sampled_from(['"\\ud800"', '"\\udfff x"', "null", "true", "false", '""', '"' + "x" * 5000 + '"']),
)


def json_object_text(fields: dict[str, str]) -> str:
    return "{" + ", ".join(f"{json.dumps(name)}: {value}" for name, value in fields.items()) + "}"


json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ", ".join(items) + "]"),
        st.dictionaries(st.text(max_size=12), inner, max_size=4).map(json_object_text),
    ),
    max_leaves=12,
)

# the fields the request bodies name (shared/api.py), so hostile values land on real fields too
BODY_FIELDS = [
    "name", "endpoint_url", "gpu_type", "price_per_hour", "bandwidth_mbps", "region", "policy_version",
    "num_groups_done", "num_samples_done", "samples_per_s", "generating", "tokens_per_s", "group_latency_s",
    "last_swap", "announced_at_s", "swapped_at_s", "num_bytes", "source_url",
]  # fmt: skip
bodies = st.one_of(
    st.dictionaries(st.sampled_from(BODY_FIELDS), json_values, max_size=6).map(json_object_text),
    st.fixed_dictionaries(
        {"last_swap": st.dictionaries(st.sampled_from(BODY_FIELDS[12:]), json_values, max_size=5).map(json_object_text)}
    ).map(json_object_text),
    json_values,
    st.sampled_from(["", "{", "[" * 2000 + "]" * 2000, "\x00", '{"name": "a", "name": 1}']),
)
path_values = st.one_of(
    st.just("OWN"),
    st.text(min_size=1, max_size=80).filter(lambda text: "/" not in text and text not in {".", ".."}),
    st.sampled_from(["1e999", "NaN", "-1", "%ff", "a" * 300]),
)
query_values = st.one_of(st.sampled_from(HOSTILE_NUMBER_TEXTS + ["", "abc", "%00"]), st.integers().map(str))


@pytest.fixture
def served(serve_coordinator: ServeCoordinator, run_id: str):  # type: ignore[no-untyped-def]
    # every example registers a worker: 400 of them in seconds, past the default registration rate limit
    # and its worker cap (tests/integration/test_credential_budgets.py tests them)
    unlimited = {"registrations_per_min": 1e7, "max_workers": 1_000_000}
    coordinator = serve_coordinator(RunConfig.model_validate({"run_id": run_id, "credentials": unlimited}))
    operations = [
        (method.upper(), path) for path, methods in coordinator.app.openapi()["paths"].items() for method in methods
    ]
    return coordinator.client, operations


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_hostile_request_gets_a_server_error(served, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    api, operations = served
    method, template = data.draw(st.sampled_from(operations), label="operation")
    worker = register(api, name="fuzzed")
    path_value = data.draw(path_values, label="path value")
    segment = worker.worker_id if path_value == "OWN" else quote(path_value, safe="")  # the server sees it decoded
    path = template.replace("{worker_id}", segment)
    token = data.draw(st.sampled_from([ADMIN_TOKEN, worker.token, "garbage"]), label="token")
    kwargs: dict = {"headers": bearer(token)}
    if method in ("POST", "PUT", "PATCH"):
        kwargs["content"] = data.draw(bodies, label="body").encode("utf-8", "surrogatepass")
        kwargs["headers"]["content-type"] = "application/json"
    if "staleness" in template:
        kwargs["params"] = {"policy_version": data.draw(query_values, label="policy_version")}
    response = api.request(method, httpx.URL(path), **kwargs)
    assert response.status_code < 500, (method, path, response.status_code, response.text[:300])


def test_after_the_fuzzing_the_control_plane_still_answers(served) -> None:  # type: ignore[no-untyped-def]
    api, operations = served
    worker = register(api)
    for value in HOSTILE_NUMBER_TEXTS:
        api.post(
            f"/v1/workers/{worker.worker_id}/heartbeat",
            content=f'{{"last_swap": {{"policy_version": 1, "announced_at_s": {value}, "swapped_at_s": {value}, "num_bytes": 1}}}}',
            headers={**bearer(worker.token), "content-type": "application/json"},
        )
    for route in CONTROL_ROUTES:
        assert api.get(route, headers=bearer(ADMIN_TOKEN)).status_code == 200, route
