"""A registered worker that turns hostile with what it was issued (its token and rollout key; no Redis
credentials: workers reach the run only through the coordinator's work API, shared/work_api.py): it
answers a task it leased with a rollout under an honest worker's id, or tries Redis directly. The forged
answer is refused and dead-lettered by the work API, never reaching `rollouts`; Redis refuses a worker
outright (its default user is off); the run goes on and every group is accounted for."""

from __future__ import annotations

import hashlib
import uuid

import httpx
import pytest
import redis

from cluster.local import LocalCluster
from services.coordinator.work_leases import refusal_letters
from services.rollout.work_client import WorkClient
from shared.api import JOIN_TOKEN_HEADER, RegisterWorkerResponse, StatusResponse
from shared.keys import RunKeys
from shared.messages import RolloutGroup, pack_float32, pack_int32
from shared.rollout_mac import sign_rollout
from shared.streams import DEAD, LEARNER_STATE, ROLLOUTS, SCORED, TASKS
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


def test_a_rollout_answered_under_another_workers_id_is_refused_and_dead_lettered(fault_run: FaultRunner) -> None:
    forged: list[RolloutGroup] = []

    def answer_as_the_victim(cluster: LocalCluster, status: StatusResponse) -> None:
        (victim,) = [worker for worker in status.workers if worker.name == VICTIM]
        intruder = register_intruder(cluster)
        work = WorkClient(cluster.coordinator_url, lambda: intruder.token, cluster.run.run_id)
        try:
            (lease,) = wait_for(lambda: work.lease(1).tasks, "a task leased to the intruder")
            group = a_group(cluster.run.run_id, worker_id=victim.worker_id, task_id=lease.task.task_id)
            group = sign_rollout(group, bytes.fromhex(intruder.access.rollout_key_hex))
            answer = work.submit([(lease.lease_id, group)])
        finally:
            work.close()
        forged.append(group)
        assert answer.accepted == [] and "claims worker" in answer.refused[0].reason
        bus = operator_bus(cluster)
        try:  # in the intruder's credential's refusals (the shared token's), never in `dead`
            letter = wait_for(lambda: next(iter(refusal_letters(bus.redis, bus.keys, "")), None), "its dead letter")
            assert bus.length(DEAD) == 0
        finally:
            bus.redis.close()
        assert letter is not None and letter.source_stream == RunKeys(cluster.run.run_id).name_of(TASKS), letter
        assert hashlib.sha256(group.encode()).hexdigest() in letter.error  # what was sent, named by its sha256
        # the intruder never answers: its lease expires and the task goes to an honest worker

    run = fault_run(inject=answer_as_the_victim, at_version=20)

    assert forged
    assert_nothing_lost(run)  # the forged group never reached `rollouts`: nothing for the reward to refuse
    assert all(worker.num_rollouts_forged == 0 for worker in run.final_status.workers)
    run.row["forged_rollouts_refused_by_the_work_api"] = 1


def test_a_worker_cannot_reach_redis_at_all(fault_run: FaultRunner) -> None:
    refusals: dict[str, str] = {}

    def try_redis(cluster: LocalCluster, status: StatusResponse) -> None:
        keys = RunKeys(cluster.run.run_id)
        register_intruder(cluster)  # what it is issued holds no Redis credentials
        assert cluster.redis is not None
        client = redis.Redis.from_url(cluster.redis.url)  # the URL without credentials: the default user is off
        attempts = {
            "XADD scored": lambda: client.xadd(keys.name_of(SCORED), {"data": b"x"}),
            "XADD rollouts": lambda: client.xadd(keys.name_of(ROLLOUTS), {"data": b"x"}),
            "XTRIM rollouts": lambda: client.xtrim(keys.name_of(ROLLOUTS), maxlen=0),
            "SET learner state": lambda: client.set(keys.name_of(LEARNER_STATE), b"x"),
            "FLUSHALL": client.flushall,
        }
        try:
            for what, attempt in attempts.items():
                with pytest.raises(redis.exceptions.AuthenticationError) as refused:
                    attempt()
                refusals[what] = str(refused.value)
        finally:
            client.close()

    run = fault_run(inject=try_redis, at_version=20)

    assert set(refusals) == {"XADD scored", "XADD rollouts", "XTRIM rollouts", "SET learner state", "FLUSHALL"}
    assert_nothing_lost(run)  # the run is unaffected: every group trained, dropped or pending
    run.row["refused_without_credentials"] = sorted(refusals)


def a_group(run_id: str, worker_id: str, task_id: str) -> RolloutGroup:
    """A well-formed group of the run's task (its content does not matter: the work API's checks come first)."""
    return RolloutGroup(
        run_id=run_id,
        group_id=uuid.uuid4().hex,
        task_id=task_id,
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
