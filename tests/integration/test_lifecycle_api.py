"""Worker lifecycle, cost-aware activation, the ledger and /v1/capacity over the real coordinator app
(uvicorn in a thread, real redis-server). The control loop's passes are also driven by hand with
`run_once(now_s=...)` where a test needs exact times."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import redis

from services.coordinator.app import create_app
from services.coordinator.control import ControlPlane, pass_interval_s
from shared.api import RegisterWorkerResponse
from shared.config import ActivationConfig, CoordinatorConfig, GRPOConfig, RunConfig, ScheduleConfig
from shared.keys import RunKeys
from shared.messages import LearnerState
from shared.streams import LEARNER_STATE
from tests.coordinator_rest import ADMIN_TOKEN, ServeCoordinator, bearer, register, score_groups
from tests.polling import wait_for

pytestmark = pytest.mark.integration


def run_config(run_id: str, **activation: object) -> RunConfig:
    # R = 2 * 4 = 8 samples per step
    return RunConfig(
        run_id=run_id,
        grpo=GRPOConfig(group_size=2, groups_per_step=4),
        schedule=ScheduleConfig(staleness_bound=2),
        coordinator=CoordinatorConfig(lease_s=5.0),
        activation=ActivationConfig(
            **{"min_dwell_s": 0.0, "replan_interval_s": 0.2, "max_billing_gap_s": 1e6, **activation}
        ),
    )


Start = Callable[..., tuple[httpx.Client, ControlPlane]]


@pytest.fixture
def start(serve_coordinator: ServeCoordinator, keys: RunKeys) -> Start:
    def start_app(clock: Callable[[], float] | None = None, **activation: object) -> tuple[httpx.Client, ControlPlane]:
        # the clock is the control loop's (billing, dwell), set before its first pass
        coordinator = serve_coordinator(run_config(keys.run_id, **activation), control_clock=clock)
        return coordinator.client, coordinator.app.state.control

    return start_app


def heartbeat(api: httpx.Client, worker: RegisterWorkerResponse, **fields: object) -> httpx.Response:
    return api.post(f"/v1/workers/{worker.worker_id}/heartbeat", headers=bearer(worker.token), json=fields)


def set_learner(
    client: redis.Redis, keys: RunKeys, *, num_steps: int, train_s: float, status: str = "training"
) -> None:
    """A learner that took `num_steps` steps of `train_s` each and never waited."""
    state = LearnerState(
        run_id=keys.run_id,
        status=status,
        learner_version=num_steps,
        published_version=num_steps,
        staleness_bound=2,
        num_steps_target=100,
        num_steps_done=num_steps,
        train_s_total=num_steps * train_s,
        idle_s_total=0.0,
        wall_s=num_steps * train_s,
        last_reward_mean=0.5,
        busy_fraction=1.0,
        staleness_histogram={"1": 30, "2": 10},
    )
    client.set(keys.name_of(LEARNER_STATE), state.encode())


# drain


def test_a_worker_drains_itself_the_admin_drains_anyone_and_no_worker_drains_another(start: Start) -> None:
    api, _ = start()
    a, b = register(api, "a"), register(api, "b")

    no_token = api.post(f"/v1/workers/{a.worker_id}/drain")
    assert no_token.status_code == 401
    other = api.post(f"/v1/workers/{a.worker_id}/drain", headers=bearer(b.token))
    assert other.status_code == 403 and "another worker" in other.json()["detail"]
    assert api.get(f"/v1/workers/{a.worker_id}").json()["state"] == "active"

    own = api.post(f"/v1/workers/{a.worker_id}/drain", headers=bearer(a.token))
    assert own.status_code == 200 and own.json()["state"] == "draining"
    assert heartbeat(api, a).json()["state"] == "draining"  # how the worker learns it
    again = api.post(f"/v1/workers/{a.worker_id}/drain", headers=bearer(a.token))
    assert again.status_code == 200 and again.json()["state"] == "draining"  # idempotent

    by_admin = api.post(f"/v1/workers/{b.worker_id}/drain", headers=bearer(ADMIN_TOKEN))
    assert by_admin.status_code == 200 and by_admin.json()["state"] == "draining"
    assert api.delete(f"/v1/workers/{a.worker_id}", headers=bearer(a.token)).status_code == 204
    assert api.post(f"/v1/workers/{a.worker_id}/drain", headers=bearer(ADMIN_TOKEN)).status_code == 404


def test_a_dead_worker_cannot_be_drained_and_the_planner_never_undoes_a_drain(
    start: Start, redis_client: redis.Redis, keys: RunKeys
) -> None:
    api, control = start()
    worker = register(api, "w")
    assert api.post(f"/v1/workers/{worker.worker_id}/drain", headers=bearer(ADMIN_TOKEN)).status_code == 200
    for _ in range(3):
        control.run_once()
    assert api.get(f"/v1/workers/{worker.worker_id}").json()["state"] == "draining"
    redis_client.zadd(keys.worker_leases, {worker.worker_id: 0})  # the lease ran out
    response = api.post(f"/v1/workers/{worker.worker_id}/drain", headers=bearer(ADMIN_TOKEN))
    assert response.status_code == 410 and "dead" in response.json()["detail"]


def test_the_drain_endpoint_is_documented() -> None:
    app = create_app(run_config("doc"), redis.Redis(), ADMIN_TOKEN)
    operation = app.openapi()["paths"]["/v1/workers/{worker_id}/drain"]["post"]
    assert {"401", "403", "404", "410"} <= set(operation["responses"])
    assert "finishes the batch" in operation["description"]
    assert {"/v1/capacity", "/v1/cost", "/v1/activation", "/dashboard", "/metrics"} <= set(app.openapi()["paths"])


# activation


def test_priced_worker_waits_on_standby_while_free_capacity_covers_the_requirement(
    start: Start, redis_client: redis.Redis, keys: RunKeys
) -> None:
    api, control = start()
    set_learner(redis_client, keys, num_steps=20, train_s=1.0)  # R / T_train = 8 samples/s, target 9.6
    free = register(api, "free")
    heartbeat(api, free, samples_per_s=20.0)
    control.run_once()
    priced = register(api, "priced", price_per_hour=1.5)
    assert priced.state == "standby"  # it costs money: nothing is spent before the planner picks it
    control.run_once()
    assert heartbeat(api, priced).json()["state"] == "standby"
    activation = api.get("/v1/activation").json()
    assert activation["standby_worker_ids"] == [priced.worker_id] and activation[
        "target_samples_per_s"
    ] == pytest.approx(9.6)

    # the free worker leaves: the priced one is needed now
    assert api.delete(f"/v1/workers/{free.worker_id}", headers=bearer(free.token)).status_code == 204
    control.run_once()
    assert heartbeat(api, priced).json()["state"] == "active"


def test_cheapest_per_throughput_is_activated_first(start: Start, redis_client: redis.Redis, keys: RunKeys) -> None:
    api, control = start()
    set_learner(redis_client, keys, num_steps=20, train_s=1.0)  # target 9.6 samples/s
    control.run_once()
    pricey = register(api, "pricey", price_per_hour=4.0)
    cheap = register(api, "cheap", price_per_hour=1.0)
    heartbeat(api, pricey, samples_per_s=12.0)  # measured while it was briefly active: 0.33 $/h per sample/s
    heartbeat(api, cheap, samples_per_s=10.0)  # 0.10
    control.run_once()
    states = {w["name"]: w["state"] for w in api.get("/v1/workers").json()}
    assert states == {"pricey": "standby", "cheap": "active"}


# ledger


def test_the_ledger_bills_the_learner_and_active_workers_only_while_they_run(
    start: Start, redis_client: redis.Redis, keys: RunKeys
) -> None:
    now = [1000.0]  # the control loop's clock: passes (its own and ours) bill up to now[0]
    api, control = start(clock=lambda: now[0], learner_price_per_hour=3.6)
    set_learner(redis_client, keys, num_steps=20, train_s=1.0)
    active = register(api, "active", price_per_hour=0.0)  # free: billed at $0
    heartbeat(api, active, samples_per_s=20.0)
    control.run_once()
    standby = register(api, "standby", price_per_hour=7.2)
    control.run_once()
    assert api.get(f"/v1/workers/{standby.worker_id}").json()["state"] == "standby"

    now[0] = 1100.0
    control.run_once()  # 100 s: learner $0.10, the standby worker nothing
    cost = api.get("/v1/cost").json()
    assert cost["learner_usd"] == pytest.approx(0.1) and cost["workers_usd"] == 0.0
    assert cost["usd_per_hour_now"] == pytest.approx(3.6)

    api.delete(f"/v1/workers/{active.worker_id}", headers=bearer(active.token))
    control.run_once()  # the priced worker is activated ...
    now[0] = 1150.0  # the clock moves first: a background pass between the two then bills exactly what run_once would
    score_groups(redis_client, keys, standby.worker_id, 1)
    control.run_once()  # ... and billed for 50 s, backed by a scored group: $0.10
    cost = api.get("/v1/cost").json()
    assert cost["usd_by_worker"][standby.worker_id] == pytest.approx(0.1)
    assert cost["total_usd"] == pytest.approx(0.15 + 0.1)
    assert api.get("/v1/status").json()["cost_usd"] == pytest.approx(0.25)

    set_learner(redis_client, keys, num_steps=100, train_s=1.0, status="done")
    api.post(f"/v1/workers/{standby.worker_id}/drain", headers=bearer(standby.token))
    api.delete(f"/v1/workers/{standby.worker_id}", headers=bearer(standby.token))
    now[0] = 1200.0
    control.run_once()  # nothing runs any more: the ledger stands still
    assert api.get("/v1/cost").json()["total_usd"] == pytest.approx(0.25)


def test_a_worker_is_billed_only_for_active_time_backed_by_verified_work(
    start: Start, redis_client: redis.Redis, keys: RunKeys
) -> None:
    now = [1000.0]
    api, control = start(clock=lambda: now[0], activate_free_workers=False, enabled=False, verified_work_window_s=60.0)
    honest, idle = register(api, "honest", price_per_hour=36.0), register(api, "idle", price_per_hour=36.0)
    control.run_once()  # both active ($0.01 a second each), their stretches open

    for second in range(1, 101):  # honest: a group scored every 10 s; idle: none
        now[0] = 1000.0 + second  # first: a background pass in between then bills exactly what run_once would
        if second % 10 == 0:
            score_groups(redis_client, keys, honest.worker_id, 1)
        control.run_once()

    cost = api.get("/v1/cost").json()
    assert cost["usd_by_worker"][honest.worker_id] == pytest.approx(1.0)  # 100 s, each backed by a group
    assert cost["usd_by_worker"].get(idle.worker_id, 0.0) == 0.0  # 100 s, none verified
    assert cost["unverified_usd"] == pytest.approx(0.6)  # its first 60 s window dropped, 40 s still open
    assert cost["workers_usd"] == pytest.approx(1.0) and cost["total_usd"] == pytest.approx(1.0)

    score_groups(redis_client, keys, idle.worker_id, 1)  # its first group: the open 40 s are billed
    control.run_once()
    assert api.get("/v1/cost").json()["usd_by_worker"][idle.worker_id] == pytest.approx(0.4)


def test_a_flagged_worker_is_not_billed_even_for_scored_groups(
    start: Start, redis_client: redis.Redis, keys: RunKeys
) -> None:
    now = [1000.0]
    api, control = start(clock=lambda: now[0], activate_free_workers=False, enabled=False)
    worker = register(api, "flagged", price_per_hour=36.0)
    control.run_once()
    for peer in (register(api, "honest-a"), register(api, "honest-b")):  # answered all their 20 leases, all scored
        redis_client.hset(keys.work_counts(peer.worker_id), mapping={"leased": 20, "returned": 20, "accepted": 20})
        score_groups(redis_client, keys, peer.worker_id, 20)
    # what the work API counted for it: 18 of its 20 leases expired (fewer ended leases than [work]
    # quarantine_min_ended_leases: flagged, not quarantined)
    redis_client.hset(keys.work_counts(worker.worker_id), mapping={"leased": 20, "accepted": 2, "expired": 18})

    now[0] = 1010.0
    score_groups(redis_client, keys, worker.worker_id, 2)
    control.run_once()

    cost = api.get("/v1/cost").json()
    assert api.get(f"/v1/workers/{worker.worker_id}").json()["state"] == "active"
    assert cost["usd_by_worker"].get(worker.worker_id, 0.0) == 0.0
    assert cost["unverified_usd"] == pytest.approx(0.1)


# capacity


def test_capacity_reports_the_model_on_measured_inputs(start: Start, redis_client: redis.Redis, keys: RunKeys) -> None:
    api, control = start()
    unknown = api.get("/v1/capacity").json()
    assert unknown["known"] is False and unknown["inputs"] is None
    set_learner(redis_client, keys, num_steps=20, train_s=0.5)  # R / T_train = 16 samples/s
    redis_client.hset(keys.broadcast_times, mapping={"1": "0.2", "2": "0.4"})
    worker = register(api, "w")
    heartbeat(api, worker, samples_per_s=40.0, group_latency_s=0.1)
    control.run_once()
    capacity = api.get("/v1/capacity").json()
    assert capacity["known"] is True
    assert capacity["required_samples_per_s"] == pytest.approx(16.0)
    assert capacity["current_samples_per_s"] == pytest.approx(40.0)
    inputs = capacity["inputs"]
    assert inputs["train_s"] == pytest.approx(0.5) and inputs["broadcast_s"] == pytest.approx(0.3)
    assert inputs["group_latency_s"] == pytest.approx(0.1) and inputs["worker_samples_per_s"] == {
        worker.worker_id: 40.0
    }
    # k + ceil((T_bcast + L_gen + D) / C) = 1 + ceil(0.4 / 0.5) = 2 <= S = 2
    assert capacity["min_feasible_staleness"] == 2 and capacity["staleness_feasible"] is True
    assert capacity["predicted_utilization"] == pytest.approx(1.0) and capacity["starved"] is False


def test_slow_passes_are_spaced_out_so_they_take_at_most_a_twentieth_of_the_time() -> None:
    assert pass_interval_s(1.0, 0.005) == 1.0
    assert pass_interval_s(1.0, 0.15) == pytest.approx(3.0)  # a pass over a large fleet on a starved host


def test_the_control_loop_reports_its_pass_time_and_interval(start: Start) -> None:
    api, control = start()  # replan_interval_s = 0.2
    wait_for(lambda: control.last_pass_s > 0.0, "a pass of the control loop", timeout_s=10)
    metrics = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in api.get("/metrics").text.splitlines()
        if line.startswith("relayrl_control_pass")
    }
    assert metrics["relayrl_control_pass_seconds"] > 0
    assert metrics["relayrl_control_pass_interval_seconds"] >= 0.2
