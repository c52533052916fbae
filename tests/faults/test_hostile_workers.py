"""A registered worker that turns hostile with the credentials it was issued (its own Redis ACL user and
rollout key, services/coordinator/redis_access.py): it posts a rollout under an honest worker's id, or
writes where a worker must not. The forged rollout is dead-lettered and counted against the id it claimed,
never trained; every forbidden command is refused with NOPERM; the run goes on and every group is
accounted for."""

from __future__ import annotations

import uuid

import httpx
import pytest
import redis

from cluster.local import LocalCluster
from shared.api import JOIN_TOKEN_HEADER, RegisterWorkerResponse, StatusResponse
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.messages import RolloutGroup, pack_float32, pack_int32
from shared.rollout_mac import sign_rollout
from shared.streams import DEAD, LEARNER_STATE, ROLLOUTS, SCORED
from tests.faults.cluster_run import assert_nothing_lost, operator_bus
from tests.faults.conftest import FaultRunner
from tests.polling import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

VICTIM = "worker-1"


def register_intruder(cluster: LocalCluster) -> RegisterWorkerResponse:
    """Register over the coordinator's REST API as any worker can (with the run's join token)."""
    headers = {JOIN_TOKEN_HEADER: cluster.join_token}
    response = httpx.post(f"{cluster.coordinator_url}/v1/workers", json={"name": "intruder"}, headers=headers)
    assert response.status_code == 201, response.text
    return RegisterWorkerResponse.model_validate_json(response.content)


def redis_as(registration: RegisterWorkerResponse) -> redis.Redis:
    access = registration.access
    assert access.redis_url is not None and access.redis_username and access.redis_password
    return redis.Redis.from_url(access.redis_url, username=access.redis_username, password=access.redis_password)


def test_a_rollout_posted_under_another_workers_id_is_dead_lettered(fault_run: FaultRunner) -> None:
    forged: list[RolloutGroup] = []

    def post_as_the_victim(cluster: LocalCluster, status: StatusResponse) -> None:
        (victim,) = [worker for worker in status.workers if worker.name == VICTIM]
        intruder = register_intruder(cluster)
        group = sign_rollout(
            a_group(cluster.run.run_id, worker_id=victim.worker_id), bytes.fromhex(intruder.access.rollout_key_hex)
        )
        client = redis_as(intruder)
        try:
            StreamBus(client, RunKeys(cluster.run.run_id), service="intruder").publish(ROLLOUTS, group)
        finally:
            client.close()
        forged.append(group)
        bus = operator_bus(cluster)
        try:
            letter = wait_for(lambda: next(iter(bus.entries(DEAD)), None), "the forged rollout's dead letter")
        finally:
            bus.redis.close()
        assert letter.error.startswith("forged rollout: "), letter.error
        assert RolloutGroup.decode(letter.payload).group_id == group.group_id

    run = fault_run(inject=post_as_the_victim, at_version=20)

    assert forged
    assert_nothing_lost(run, num_dead_lettered=1)
    assert run.accounting.num_dead_lettered_reward == 1
    (victim,) = run.workers_named(VICTIM)
    assert victim.num_rollouts_forged == 1  # counted against the id it claimed
    others = [worker for worker in run.final_status.workers if worker.name != VICTIM]
    assert all(worker.num_rollouts_forged == 0 for worker in others)
    run.row["forged_rollouts_dead_lettered"] = 1


def test_a_worker_writing_where_it_must_not_is_refused(fault_run: FaultRunner) -> None:
    refusals: dict[str, str] = {}

    def write_where_forbidden(cluster: LocalCluster, status: StatusResponse) -> None:
        keys = RunKeys(cluster.run.run_id)
        client = redis_as(register_intruder(cluster))
        attempts = {
            "XADD scored": lambda: client.xadd(keys.name_of(SCORED), {"data": b"x"}),
            "DEL rollouts": lambda: client.delete(keys.name_of(ROLLOUTS)),
            "XTRIM rollouts": lambda: client.xtrim(keys.name_of(ROLLOUTS), maxlen=0),
            "SET learner state": lambda: client.set(keys.name_of(LEARNER_STATE), b"x"),
            "FLUSHALL": client.flushall,
            "CONFIG SET": lambda: client.config_set("appendonly", "no"),
        }
        try:
            for what, attempt in attempts.items():
                with pytest.raises(redis.exceptions.NoPermissionError) as refused:
                    attempt()
                refusals[what] = str(refused.value)
        finally:
            client.close()

    run = fault_run(inject=write_where_forbidden, at_version=20)

    assert set(refusals) == {
        "XADD scored",
        "DEL rollouts",
        "XTRIM rollouts",
        "SET learner state",
        "FLUSHALL",
        "CONFIG SET",
    }
    assert_nothing_lost(run)  # the run is unaffected: every group trained, dropped or pending
    run.row["refused_with_noperm"] = sorted(refusals)


def a_group(run_id: str, worker_id: str) -> RolloutGroup:
    """A well-formed group of the run's task (its content does not matter: the producer check comes first)."""
    return RolloutGroup(
        run_id=run_id,
        group_id=uuid.uuid4().hex,
        task_id=uuid.uuid4().hex,
        task_name="arithmetic_mod10",
        prompt="1+2=",
        worker_id=worker_id,
        policy_version=0,
        temperature=1.0,
        prompt_token_ids=pack_int32([1, 2, 3, 4]),
        completion_token_ids=pack_int32([5, 6]),
        completion_lengths=pack_int32([1, 1]),
        behaviour_logprobs=pack_float32([-1.0, -1.0]),
        completion_texts=["3", "3"],
        finish_reasons=["length", "length"],
        generation_s=0.01,
    )
