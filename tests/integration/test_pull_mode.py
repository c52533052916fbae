"""Pull mode (`[schedule] mode = "pull"`): the learner asks for each batch and the reward service's task
feed answers it, against a real redis-server; then a whole local cluster in pull mode."""

from __future__ import annotations

import pytest

from services.reward.task_feed import TaskFeed
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import BatchRequest
from shared.streams import BATCH_REQUEST, TASKS
from shared.tasks import make_task

pytestmark = pytest.mark.integration


@pytest.fixture
def run(run_id: str) -> RunConfig:
    return RunConfig.model_validate(
        {"run_id": run_id, "grpo": {"group_size": 4, "groups_per_step": 5}, "schedule": {"mode": "pull"}}
    )


@pytest.fixture
def feed(run: RunConfig, bus: StreamBus, keys: RunKeys) -> TaskFeed:
    bus.ensure_group(TASKS)
    task = make_task(run.task.name, num_eval_prompts=run.task.num_eval_prompts, seed=run.task.seed)
    return TaskFeed(bus, keys, task, run, reference_ttl_s=60)


def ask(bus: StreamBus, run: RunConfig, version: int, wanted: int, skipped: int = 0) -> None:
    request = BatchRequest(
        run_id=run.run_id, policy_version=version, num_groups_wanted=wanted, num_groups_skipped=skipped
    )
    bus.put_state(BATCH_REQUEST, request)


def take_all(bus: StreamBus) -> list:
    deliveries = bus.read(TASKS, "w-test", count=100, block_ms=10)
    bus.ack(TASKS, [d.message_id for d in deliveries])
    return [d.message for d in deliveries]


def test_nothing_is_issued_until_the_learner_asks_then_exactly_what_it_asks_for_at_its_version(feed, bus, run) -> None:
    assert feed.top_up() == 0 and bus.length(TASKS) == 0
    ask(bus, run, version=3, wanted=5)
    assert feed.top_up() == 5
    assert feed.top_up() == 0  # the five are in flight
    tasks = take_all(bus)
    assert [task.min_policy_version for task in tasks] == [3] * 5


def test_never_more_than_one_batch_per_version_even_when_the_request_lags(feed, bus, run) -> None:
    ask(bus, run, version=1, wanted=5)
    assert feed.top_up() == 5
    take_all(bus)  # finished by workers and read by the learner, which has not rewritten its request yet
    assert feed.top_up() == 0  # the stale request would ask for five more: one batch per version only
    ask(bus, run, version=2, wanted=5)  # the next step asks: a new batch
    assert feed.top_up() == 5


def test_groups_skipped_by_dynamic_sampling_are_replaced_beyond_the_one_batch(feed, bus, run) -> None:
    ask(bus, run, version=1, wanted=5)
    assert feed.top_up() == 5
    take_all(bus)  # sampled and read: the learner skipped three as flat (zero reward variance)
    ask(bus, run, version=1, wanted=3, skipped=3)
    assert feed.top_up() == 3  # without the skipped count the one-batch cap would starve the learner
    take_all(bus)
    ask(bus, run, version=1, wanted=1, skipped=5)  # two more of those were flat; one admitted
    assert feed.top_up() == 1
    assert feed.top_up() == 0  # in flight


def test_groups_lost_on_the_way_are_issued_again_once_the_request_stays_unmet(feed, bus, run) -> None:
    feed.reissue_after_s = 0.0
    ask(bus, run, version=1, wanted=5)
    assert feed.top_up() == 5
    take_all(bus)  # acked by a worker that then lost them: nothing in flight, the learner still wants 2
    ask(bus, run, version=1, wanted=2)
    assert feed.top_up() == 0  # first sight of the unmet request: it may be a moment before the rewrite
    assert feed.top_up() == 2  # the same request, still nothing in flight: lost, issued again
    assert [task.min_policy_version for task in take_all(bus)] == [1, 1]


def test_a_request_of_another_run_or_for_nothing_issues_nothing(feed, bus, run) -> None:
    bus.put_state(BATCH_REQUEST, BatchRequest(run_id="other-run", policy_version=0, num_groups_wanted=5))
    assert feed.top_up() == 0
    ask(bus, run, version=0, wanted=0)
    assert feed.top_up() == 0
