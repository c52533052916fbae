"""The reward service's side of held-out evaluation by the workers (services/reward/evaluation.py) against a real
redis-server: an EvalRequest becomes one eval task per held-out prompt on the version's own stream; the eval
groups that come back are scored from their token ids like rollouts (a forged one dead-lettered and its prompt
asked again), and once every prompt is scored the learner gets one EvalScores and the version's streams and keys
are gone. Nothing of it touches the training path or its counts; a version past its deadline is abandoned."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import GROUPS_SCORED, TASKS_ISSUED, RunKeys
from shared.messages import EvalRequest, RolloutGroup, TaskGroup
from shared.rollout_mac import sign_rollout
from shared.streams import DEAD, EVAL_REQUESTS, EVAL_ROLLOUTS, EVAL_SCORES, ROLLOUTS, SCORED, TASKS, eval_tasks
from tests.polling import wait_for
from tests.rollouts import unsigned_rollout_for

pytestmark = pytest.mark.integration

WORKER_KEY = bytes(range(32))  # the rollout key the coordinator issued worker "w-test"
VERSION = 7
NUM_PROMPTS = 4


@pytest.fixture
def run(run_id: str) -> RunConfig:
    return RunConfig.model_validate(
        {"run_id": run_id, "task": {"num_eval_prompts": NUM_PROMPTS}, "grpo": {"group_size": 2, "groups_per_step": 2}}
    )


@pytest.fixture
def service(run: RunConfig, bus: StreamBus, keys: RunKeys, redis_server, model_dir: Path) -> Iterator[RewardService]:
    bus.redis.set(keys.rollout_key("w-test"), WORKER_KEY)
    settings = RewardSettings(redis_url=redis_server.url, model_dir=model_dir)
    reward = RewardService(run, settings, bus)
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    # started once its groups exist: the verifier child's spawn comes first, and on a busy machine it can
    # take longer than a short deadline, which would then expire before the request is read
    wait_for(lambda: bus.redis.exists(keys.name_of(EVAL_REQUESTS)), "the reward service started")
    yield reward
    reward.stop_event.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


def request(bus: StreamBus, deadline_s: float = 60.0) -> None:
    """What the learner does at an eval point (services/learner/worker_eval.py)."""
    bus.publish(
        EVAL_REQUESTS,
        EvalRequest(run_id=bus.keys.run_id, request_id="r-1", policy_version=VERSION, deadline_s=deadline_s),
    )


def issued(bus: StreamBus, num_tasks: int) -> list[TaskGroup]:
    wait_for(lambda: bus.length(eval_tasks(VERSION)) >= num_tasks, f"{num_tasks} eval tasks")
    return bus.entries(eval_tasks(VERSION))


def test_an_evaluation_is_issued_scored_like_rollouts_and_published_once_complete(
    service: RewardService, bus: StreamBus, keys: RunKeys, model_dir: Path
) -> None:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    request(bus)
    tasks = issued(bus, NUM_PROMPTS)
    assert [task.eval_version for task in tasks] == [VERSION] * NUM_PROMPTS
    assert all(task.num_samples == 1 and task.min_policy_version == VERSION for task in tasks)
    references = [bus.redis.get(keys.task_reference(task.task_id)) for task in tasks]
    assert all(reference is not None for reference in references)  # kept by the service, never in the task

    def group_for(task: TaskGroup, text: str, key: bytes = WORKER_KEY) -> RolloutGroup:
        return sign_rollout(unsigned_rollout_for(task, [text], tokenizer, policy_version=VERSION), key)

    right = [reference.decode() for reference in references if reference is not None]
    texts = [text if i % 2 == 0 else str((int(text) + 1) % 10) for i, text in enumerate(right)]  # half right
    bus.publish(EVAL_ROLLOUTS, group_for(tasks[0], texts[0], key=bytes(32)))  # forged: dead-lettered, asked again
    (reissued,) = issued(bus, NUM_PROMPTS + 1)[NUM_PROMPTS:]
    assert reissued.prompt == tasks[0].prompt and reissued.task_id != tasks[0].task_id
    for task, text in zip([reissued, *tasks[1:]], texts, strict=True):
        bus.publish(EVAL_ROLLOUTS, group_for(task, text))

    (scores,) = wait_for(lambda: bus.entries(EVAL_SCORES), "the version's scores")
    assert scores.request_id == "r-1" and scores.policy_version == VERSION
    assert [score.prompt_index for score in scores.scores] == list(range(NUM_PROMPTS))
    assert [score.reward for score in scores.scores] == [1.0, 0.0, 1.0, 0.0]
    assert [score.completion_text for score in scores.scores] == texts
    assert {score.worker_id for score in scores.scores} == {"w-test"} and not any(
        s.verifier_failed for s in scores.scores
    )
    assert scores.finished_at_s >= scores.requested_at_s
    (dead,) = bus.entries(DEAD)
    assert "forged rollout" in dead.error
    # the version's evaluation is gone from Redis, and the training path never saw it
    wait_for(lambda: not bus.redis.exists(keys.name_of(eval_tasks(VERSION))), "the version's eval stream deleted")
    for key in (keys.eval_state(VERSION), keys.eval_prompts(VERSION), keys.eval_scores(VERSION), keys.evals_open):
        assert not bus.redis.exists(key), key
    assert not any(bus.redis.exists(keys.task_reference(task.task_id)) for task in [*tasks, reissued])
    assert bus.length(ROLLOUTS) == 0 and bus.length(SCORED) == 0
    counts = bus.counts(keys.reward_counts)
    assert counts.get(GROUPS_SCORED, 0) == 0 and counts[TASKS_ISSUED] == bus.length(TASKS)
    assert not bus.redis.exists(keys.worker_rewards("w-test"))
    assert service.evals.num_published == 1


def test_a_version_not_complete_by_its_deadline_is_abandoned_and_nothing_is_published(
    service: RewardService, bus: StreamBus, keys: RunKeys
) -> None:
    deadline_s = 2.0  # one turn of the service's loop must fit in it, on a machine busy with other tests
    started_s = time.time()
    request(bus, deadline_s=deadline_s)
    issued(bus, NUM_PROMPTS)
    wait_for(lambda: service.evals.num_abandoned == 1, "the evaluation abandoned")
    assert time.time() - started_s >= deadline_s
    assert not bus.redis.exists(keys.name_of(eval_tasks(VERSION))) and not bus.redis.exists(keys.evals_open)
    assert bus.entries(EVAL_SCORES) == []
