"""The reward service against a real redis-server: task feed with backpressure, scoring from the token
ids (never the worker's text), verifiers that hang or raise, dead letters."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from tokenizers import Tokenizer

from services.reward.service import RewardService
from services.reward.settings import RewardSettings
from services.reward.task_feed import KEPT_SHARE_STEPS, TaskFeed, groups_in_flight
from shared import worker_rewards
from shared.bus import Delivery, StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import RolloutGroup, TaskGroup, pack_int32
from shared.rollout_mac import sign_rollout
from shared.streams import ROLLOUTS, SCORED, TASKS
from shared.tasks import build_task
from tests.polling import CallCounter, wait_for
from tests.rollouts import unsigned_rollout_for

pytestmark = pytest.mark.integration

TEST_WORKER_ROLLOUT_KEY = bytes(range(32))  # what the coordinator would have issued worker "w-test"


def issue_test_rollout_key(client: redis.Redis, keys: RunKeys) -> None:
    client.set(keys.rollout_key("w-test"), TEST_WORKER_ROLLOUT_KEY)


@pytest.fixture
def run(run_id: str) -> RunConfig:
    return RunConfig.model_validate(
        {"run_id": run_id, "grpo": {"group_size": 4, "groups_per_step": 3}, "schedule": {"staleness_bound": 3}}
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_policy_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_policy_dir / "tokenizer.json"))


@pytest.fixture
def service(run: RunConfig, bus: StreamBus, keys: RunKeys, redis_server, model_dir: Path) -> Iterator[RewardService]:
    issue_test_rollout_key(bus.redis, keys)
    settings = RewardSettings(redis_url=redis_server.url, model_dir=model_dir)
    reward = RewardService(run, settings, bus)
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    yield reward
    reward.stop_event.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


def rollout_for(task: TaskGroup, texts: list[str], tokenizer: Tokenizer, **fields: object) -> RolloutGroup:
    """A group worker "w-test" sampled for `task`, signed with its rollout key (`fields`: replaced before signing)."""
    return sign_rollout(unsigned_rollout_for(task, texts, tokenizer, **fields), TEST_WORKER_ROLLOUT_KEY)


def wait_until_on_disk(client: redis.Redis) -> None:
    """Every write so far survives a kill -9 of Redis: an AOF rewrite writes the whole dataset as the
    AOF's new base file and fsyncs it; wait for that rewrite to finish."""
    num_rewrites = client.info("persistence")["aof_rewrites"]
    client.bgrewriteaof()

    def rewritten() -> bool:
        info = client.info("persistence")
        return info["aof_rewrites"] > num_rewrites and not info["aof_rewrite_in_progress"]

    wait_for(rewritten, "the AOF rewrite")
    assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"


def right_answer(task: TaskGroup) -> str:
    a, b = (int(c) for c in task.prompt.rstrip("=").split("+"))
    return str((a + b) % 10)


def wrong_answer(task: TaskGroup) -> str:
    return str((int(right_answer(task)) + 1) % 10)


def lease_tasks(bus: StreamBus, count: int) -> list[Delivery[TaskGroup]]:
    """Read `count` tasks, leaving them pending (in flight) until `answer` publishes their rollouts."""
    return bus.read(TASKS, "w-test", count=count, block_ms=100)


def take_tasks(bus: StreamBus, count: int) -> list[TaskGroup]:
    """Read and ack `count` tasks at once: for tests that do not count the groups in flight (until the
    rollouts are published the acked tasks are in flight nowhere, and the feed tops up)."""
    deliveries = lease_tasks(bus, count)
    bus.ack(TASKS, [d.message_id for d in deliveries])
    return [d.message for d in deliveries]


def answer(bus: StreamBus, leased: Delivery[TaskGroup], rollout: RolloutGroup) -> None:
    """As the work API's submit script: the rollout is in `rollouts` before its task is acked, so the group
    never leaves the count of groups in flight (the feed would top up in between)."""
    bus.publish(ROLLOUTS, rollout)
    bus.ack(TASKS, [leased.message_id])


def test_task_feed_holds_the_pipeline_at_groups_per_step_times_s_plus_one(service, bus, run) -> None:
    turns = CallCounter(service, "serve_once")  # every turn of its loop tops the feed up first
    wait_for(lambda: bus.length(TASKS) >= 6, "the first tasks")
    turns.wait_for_more(2, "two more turns of the service's loop")
    assert bus.length(TASKS) == run.max_groups_in_flight == 6  # 3 groups/step * (S=3 - 1)
    task = bus.read(TASKS, "w-test", count=1, block_ms=100)[0].message
    assert task.num_samples == 4 and task.run_id == run.run_id
    turns.wait_for_more(2, "two more turns of the service's loop after a task was taken")
    assert bus.length(TASKS) == 6  # taken but not finished: still in flight, nothing added


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_under_dynamic_sampling_the_feed_keeps_the_groups_the_learner_will_train_in_flight(
    bus, keys, redis_server, model_dir: Path, tokenizer, run_id: str, dynamic_sampling: bool
) -> None:
    run = RunConfig.model_validate(
        {
            "run_id": run_id,
            "grpo": {"group_size": 4, "groups_per_step": 3, "dynamic_sampling": dynamic_sampling},
            "schedule": {"staleness_bound": 3},
        }
    )
    issue_test_rollout_key(bus.redis, keys)
    reward = RewardService(run, RewardSettings(redis_url=redis_server.url, model_dir=model_dir), bus)
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bus.length(TASKS) >= 6, "the first window of tasks")
        for n, leased in enumerate(lease_tasks(bus, 6)):  # half flat (every sample wrong), half with a spread
            task = leased.message
            texts = [wrong_answer(task)] * 4 if n % 2 else [right_answer(task)] + [wrong_answer(task)] * 3
            answer(bus, leased, rollout_for(task, texts, tokenizer))
        wait_for(lambda: bus.group_progress(SCORED)[0] == 6, "the six groups scored, none read by a learner")

        expected_window = 12 if dynamic_sampling else 6  # 6 over the kept share 1/2, or the run's window
        wait_for(lambda: groups_in_flight(bus) == expected_window, f"{expected_window} groups in flight")
        assert int(bus.redis.get(keys.feed_window)) == expected_window
        turns = CallCounter(reward, "serve_once")
        turns.wait_for_more(2, "two more turns of the service's loop")
        assert groups_in_flight(bus) == expected_window  # held there, not more
    finally:
        reward.stop_event.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_feed_window_grows_at_most_by_the_floor_of_the_kept_share(bus, keys, run_id: str) -> None:
    run = RunConfig.model_validate(
        {"run_id": run_id, "grpo": {"groups_per_step": 3, "dynamic_sampling": True}, "schedule": {"staleness_bound": 3}}
    )
    feed = TaskFeed(bus, keys, build_task(run.task), run, reference_ttl_s=60)
    assert feed.window() == 6  # nothing scored yet: the run's window
    for _ in range(20):
        feed.kept.observe([0.0, 0.0])
    assert feed.window() == 48  # every group flat: 6 x 8, not unbounded
    assert int(bus.redis.get(keys.feed_window)) == 48
    for _ in range(KEPT_SHARE_STEPS * run.grpo.groups_per_step):  # the share follows the latest 12 groups only
        feed.kept.observe([0.0, 1.0])
    assert feed.window() == 6


def test_rollouts_are_scored_by_the_verifier_and_acked(service, bus, tokenizer) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, 1)[0]
    a, b = (int(c) for c in task.prompt.rstrip("=").split("+"))
    right = str((a + b) % 10)
    wrong = str((a + b + 1) % 10)
    bus.publish(ROLLOUTS, rollout_for(task, [right, wrong, right + right, ""], tokenizer))

    scored = wait_for(
        lambda: bus.read(SCORED, "learner-test", count=1, block_ms=50),
        "the scored group",
    )
    assert scored[0].message.rewards == [1.0, 0.0, 0.5, 0.0]
    wait_for(lambda: bus.backlog(ROLLOUTS) == 0, "the rollout acked")
    assert bus.dead_letters() == []
    assert service.scorer.text_mismatches_by_worker == {}  # an honest worker's text is the decoded text


def test_the_rewards_of_each_workers_scored_groups_are_recorded_with_them(service, bus, keys, tokenizer) -> None:
    wait_for(lambda: bus.length(TASKS) >= 3, "tasks")
    first, second, forged = take_tasks(bus, 3)
    right, wrong = right_answer(first), wrong_answer(first)
    bus.publish(ROLLOUTS, rollout_for(first, [right, wrong, right + right, ""], tokenizer))  # mean 0.375
    bus.publish(ROLLOUTS, rollout_for(second, [right_answer(second)] * 4, tokenizer))  # mean 1.0
    bus.publish(ROLLOUTS, unsigned_rollout_for(forged, [right_answer(forged)] * 4, tokenizer))  # dead-lettered

    wait_for(lambda: bus.length(SCORED) == 2 and bus.backlog(ROLLOUTS) == 0, "two groups scored, one refused")

    stats = worker_rewards.parse(bus.redis.hgetall(keys.worker_rewards("w-test")))
    assert stats.num_groups == 2  # only what was scored: the forged group is not w-test's work
    assert stats.reward_sum == pytest.approx(0.375 + 1.0)
    assert stats.reward_sum_sq == pytest.approx(0.375**2 + 1.0)


def test_bad_rollouts_are_dead_lettered_and_the_service_keeps_scoring(service, bus, tokenizer) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, 1)[0]
    bus.publish_raw(ROLLOUTS, b"garbage")
    bus.publish(ROLLOUTS, rollout_for(task, ["1"], tokenizer, task_id="forged-task"))
    bus.publish(ROLLOUTS, rollout_for(task, ["1", "2"], tokenizer))

    wait_for(lambda: bus.length(SCORED) == 1, "the good rollout scored")
    letters = wait_for(lambda: bus.dead_letters() if len(bus.dead_letters()) == 2 else None, "two dead letters")
    errors = sorted(letter.error for letter in letters)
    assert "not msgpack" in errors[0]
    assert "no reference for task forged-task" in errors[1]
    assert service.num_scored == 1


def test_the_service_waits_out_a_redis_restart_and_loses_nothing(
    run: RunConfig, tmp_path, model_dir, tokenizer
) -> None:
    from cluster.redis_server import RedisServer
    from shared.bus import connect

    server = RedisServer(tmp_path / "redis").start()
    keys = RunKeys(run.run_id)
    own_bus = StreamBus(connect(server.url, socket_timeout_s=2.0), keys, service="reward")
    reward = RewardService(run, RewardSettings(redis_url=server.url, model_dir=model_dir), own_bus)
    turns = CallCounter(reward, "serve_once")
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    try:
        test_bus = StreamBus(connect(server.url), keys, service="test")
        issue_test_rollout_key(test_bus.redis, keys)
        wait_for(lambda: test_bus.length(TASKS) >= 2, "tasks")
        task = take_tasks(test_bus, 1)[0]
        wait_until_on_disk(test_bus.redis)  # the tasks and their references survive the kill -9
        server.kill()
        num_failed = turns.num_raised
        wait_for(lambda: turns.num_raised > num_failed, "the service to hit connection errors")
        assert thread.is_alive()
        server.start()
        test_bus.publish(ROLLOUTS, rollout_for(task, ["0", "1"], tokenizer))
        scored = wait_for(lambda: test_bus.length(SCORED) == 1, "the rollout scored after the restart", timeout_s=20)
        assert scored and thread.is_alive()
        assert test_bus.dead_letters() == []
    finally:
        reward.stop_event.set()
        thread.join(timeout=10)
        server.stop()


def test_forged_rollouts_are_dead_lettered_and_counted_against_the_claimed_worker(
    service, bus, keys, tokenizer
) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, 1)[0]
    bus.redis.hset(keys.worker("w-test"), mapping={"num_rollouts_forged": 0})  # the claimed worker's record
    bus.publish(ROLLOUTS, unsigned_rollout_for(task, ["1"], tokenizer))  # no mac at all
    bus.publish(ROLLOUTS, sign_rollout(unsigned_rollout_for(task, ["1"], tokenizer), bytes(32)))  # another key
    stranger = sign_rollout(
        unsigned_rollout_for(task, ["1"], tokenizer).model_copy(update={"worker_id": "w-nobody"}), bytes(32)
    )
    bus.publish(ROLLOUTS, stranger)  # a worker id nobody was issued a key for
    bus.publish(ROLLOUTS, rollout_for(task, ["1", "2"], tokenizer))  # the honest one

    wait_for(lambda: bus.length(SCORED) == 1, "the honest rollout scored")
    letters = wait_for(lambda: bus.dead_letters() if len(bus.dead_letters()) == 3 else None, "three dead letters")
    assert all(letter.error.startswith("forged rollout: ") for letter in letters)
    errors = " | ".join(letter.error for letter in letters)
    assert "carries no producer_mac" in errors and "does not match the key of worker w-test" in errors
    assert "w-nobody, which holds no rollout key" in errors
    assert bus.redis.hget(keys.worker("w-test"), "num_rollouts_forged") == b"2"
    assert not bus.redis.exists(keys.worker("w-nobody"))  # no record is made up for an unknown id
    assert service.num_scored == 1 and service.producers.num_forged == 3


def metrics_text(service: RewardService) -> str:
    from prometheus_client import generate_latest

    from services.reward.prometheus import reward_families
    from shared.metrics import CallbackCollector, new_registry

    scorer = service.scorer
    families = lambda: reward_families(  # noqa: E731
        service.num_scored,
        service.num_tasks_published,
        scorer.text_mismatches_by_worker,
        scorer.verifier_failures_by_kind,
        scorer.verifiers.num_replaced,
        scorer.rejected_by_worker,
    )
    return generate_latest(new_registry(CallbackCollector(families))).decode()


def test_a_worker_whose_ids_say_a_wrong_answer_gets_the_reward_of_its_ids_and_is_counted(
    service, bus, keys, tokenizer
) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    # one task each: a task is answered once (the work API accepts one group per lease), and the reward
    # service forgets a task's reference once its group is scored
    task, twin_task = take_tasks(bus, 2)
    liar_key = bytes(range(1, 33))
    bus.redis.set(keys.rollout_key("w-liar"), liar_key)  # a registered worker: its groups are its own
    right, wrong = right_answer(task), wrong_answer(task)
    liar = unsigned_rollout_for(task, [wrong, wrong, right], tokenizer, claimed_texts=[right] * 3, worker_id="w-liar")
    bus.publish(ROLLOUTS, sign_rollout(liar, liar_key))
    twin = [wrong_answer(twin_task), wrong_answer(twin_task), right_answer(twin_task)]
    bus.publish(ROLLOUTS, rollout_for(twin_task, twin, tokenizer))  # the honest twin

    wait_for(lambda: bus.length(SCORED) == 2, "the two groups scored")
    scored = bus.read(SCORED, "learner-test", count=2, block_ms=50)
    rewards = {delivery.message.rollout.worker_id: delivery.message.rewards for delivery in scored}
    assert rewards == {"w-liar": [0.0, 0.0, 1.0], "w-test": [0.0, 0.0, 1.0]}  # the ids decide, not the text
    assert service.scorer.text_mismatches_by_worker == {"w-liar": 2}
    assert 'relayrl_reward_text_mismatch_total{worker_id="w-liar"} 2.0' in metrics_text(service)
    assert bus.dead_letters() == []


def test_token_ids_no_engine_produces_are_dead_lettered_with_the_reason(service, bus, tokenizer) -> None:
    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    task = take_tasks(bus, 1)[0]
    honest = rollout_for(task, ["1", "2"], tokenizer)
    out_of_vocabulary = rollout_for(task, ["1", "2"], tokenizer, completion_token_ids=pack_int32([5, 1, 15, 1]))
    no_eos = rollout_for(task, ["1", "2"], tokenizer, completion_token_ids=pack_int32([5, 6, 6, 1]))
    # the task's right answer, sampled after another prompt: it would teach that prompt this answer
    other_prompt = "1+1=" if task.prompt != "1+1=" else "2+2="
    other = rollout_for(task, ["1", "2"], tokenizer, prompt_token_ids=pack_int32(tokenizer.encode(other_prompt).ids))
    for group in (out_of_vocabulary, no_eos, other, honest):
        bus.publish(ROLLOUTS, group)

    wait_for(lambda: bus.length(SCORED) == 1, "the honest group scored")
    letters = wait_for(lambda: bus.dead_letters() if len(bus.dead_letters()) == 3 else None, "three dead letters")
    errors = sorted(letter.error for letter in letters)
    assert "completion token id 15 is outside the vocabulary [0, 15)" in errors[0]
    assert f"prompt_token_ids are not the task's prompt {task.prompt!r}: they read {other_prompt!r}" in errors[1]
    assert "sample 0 says it stopped but does not end with an EOS id" in errors[2]
    assert service.scorer.rejected_by_worker == {("w-test", "invalid_tokens"): 3}  # counted against the worker


@pytest.fixture
def trap_service(run_id: str, bus: StreamBus, keys: RunKeys, redis_server, model_dir: Path) -> Iterator[RewardService]:
    """A reward service scoring tests/trap_task.py's task under a 1 s verifier timeout (by import path: the
    verifier's child process builds it too)."""
    issue_test_rollout_key(bus.redis, keys)
    run = RunConfig.model_validate(
        {
            "run_id": run_id,
            "task": {"name": "tests.trap_task:TrapTask"},
            "grpo": {"group_size": 2, "groups_per_step": 2},
            "reward": {"verifier_timeout_s": 1.0},
        }
    )
    reward = RewardService(run, RewardSettings(redis_url=redis_server.url, model_dir=model_dir), bus)
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    yield reward
    reward.stop_event.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert reward.scorer.verifiers.pid is None  # the verifier process was stopped with the service


def test_a_verifier_that_hangs_or_raises_fails_its_group_in_time_and_the_service_keeps_scoring(
    trap_service, bus, tokenizer
) -> None:
    from tests.trap_task import HANG_PREFIX, RAISE_PREFIX

    wait_for(lambda: bus.length(TASKS) >= 2, "tasks")
    wait_for(lambda: trap_service.scorer.verifiers.pid, "the verifier process")
    first_pid = trap_service.scorer.verifiers.pid
    hang_task, raise_task = take_tasks(bus, 2)  # a task is answered once: one task per group
    wait_for(lambda: bus.backlog(TASKS) >= 2, "the feed topped up")
    task, next_task = take_tasks(bus, 2)
    hangs = rollout_for(hang_task, [right_answer(hang_task), HANG_PREFIX], tokenizer)
    raises = rollout_for(raise_task, [RAISE_PREFIX, right_answer(raise_task)], tokenizer)
    bus.publish(ROLLOUTS, hangs)
    bus.publish(ROLLOUTS, raises)
    bus.publish(ROLLOUTS, rollout_for(task, [right_answer(task), wrong_answer(task)], tokenizer))

    scored = wait_for(lambda: bus.read(SCORED, "learner-test", count=1, block_ms=50), "the honest group scored")
    assert scored[0].message.rewards == [1.0, 0.0]
    letters = {letter.error: letter for letter in bus.dead_letters()}
    assert len(letters) == 2, letters.keys()
    timeout_error = next(error for error in letters if "verifier timeout" in error)
    raised_error = next(error for error in letters if "verifier raised: ValueError: cannot parse '='" in error)
    # the hung group failed after the 1 s timeout, not after the verifier's 2**40 steps
    assert letters[timeout_error].failed_at_s - hangs.created_at_s < 15.0
    assert letters[raised_error].failed_at_s - raises.created_at_s < 15.0
    verifiers = trap_service.scorer.verifiers
    assert verifiers.num_replaced == 1 and verifiers.pid not in (None, first_pid)  # the hung process was replaced
    assert trap_service.scorer.verifier_failures_by_kind == {"timeout": 1, "raised": 1}
    text = metrics_text(trap_service)
    assert 'relayrl_reward_verifier_failures_total{kind="timeout"} 1.0' in text
    assert "relayrl_reward_verifier_restarts_total 1.0" in text
    assert 'relayrl_reward_rejected_groups_total{reason="verifier_timeout",worker_id="w-test"} 1.0' in text

    # the service keeps running, and its new verifier process scores the next group
    right = right_answer(next_task)
    bus.publish(ROLLOUTS, rollout_for(next_task, [right, right], tokenizer))
    again = wait_for(lambda: bus.read(SCORED, "learner-test", count=1, block_ms=50), "a group after the failures")
    assert again[0].message.rewards == [1.0, 1.0]
    assert bus.backlog(ROLLOUTS) == 0  # every rollout accounted: scored or dead-lettered, all acked


def test_a_verifier_process_that_dies_is_replaced_and_a_non_finite_reward_is_refused() -> None:
    from shared.config import TaskConfig
    from shared.verifier_pool import VerifierFailedError, VerifierPool
    from tests.trap_task import EXIT_TEXT, NAN_TEXT

    pool = VerifierPool(TaskConfig(name="tests.trap_task:TrapTask"), timeout_s=30.0).start()
    try:
        first_pid = pool.pid
        with pytest.raises(VerifierFailedError, match=r"verifier process died \(exit code 3\)") as died:
            pool.score(["1", EXIT_TEXT], "1")
        assert died.value.kind == "died" and pool.num_replaced == 1 and pool.pid != first_pid
        with pytest.raises(VerifierFailedError, match="verifier returned nan, not a number in") as nan:
            pool.score([NAN_TEXT], "1")
        assert nan.value.kind == "bad_reward"
        assert pool.score(["1", "11", "2"], "1") == [1.0, 0.5, 0.0]  # the replacement serves on
    finally:
        pool.close()
    assert pool.pid is None


def test_the_reward_service_and_its_scorer_import_neither_torch_nor_transformers(model_dir: Path) -> None:
    import subprocess
    import sys

    program = f"""
import sys
from pathlib import Path
import services.reward.__main__, services.reward.service
from services.reward.decode import CompletionDecoder
from services.reward.scoring import GroupScorer
from shared.config import TaskConfig
from shared.verifier_pool import VerifierPool

pool = VerifierPool(TaskConfig(name="arithmetic_mod10"), timeout_s=5.0).start()
scorer = GroupScorer("arithmetic_mod10", CompletionDecoder(Path({str(model_dir)!r}), 2), pool)
assert pool.score(["3", "4"], "3") == [1.0, 0.0]
pool.close()
print(sorted(name for name in ("torch", "transformers") if name in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def process_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_reward_service_killed_while_its_verifier_hangs_leaves_no_verifier_behind() -> None:
    import signal
    import subprocess
    import sys

    program = """
from shared.config import TaskConfig
from shared.verifier_pool import VerifierPool
from tests.trap_task import HANG_PREFIX

pool = VerifierPool(TaskConfig(name="tests.trap_task:TrapTask"), timeout_s=600.0).start()
print(pool.pid, flush=True)
pool.score([HANG_PREFIX], "1")
"""
    service = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    verifier_pid = 0
    try:
        assert service.stdout is not None
        verifier_pid = int(service.stdout.readline())
        wait_for(lambda: cpu_seconds(verifier_pid) > 0.3, "the verifier to be stuck in its regex")
        service.send_signal(signal.SIGKILL)
        service.wait(timeout=10)
        wait_for(lambda: not process_running(verifier_pid), "the hung verifier to die with its service")
    finally:
        service.kill()
        service.wait(timeout=10)
        if verifier_pid and process_running(verifier_pid):
            os.kill(verifier_pid, signal.SIGKILL)


def test_a_task_named_by_import_path_is_served_and_scored_in_the_verifier_process(
    run_id: str, bus: StreamBus, keys: RunKeys, redis_server, tmp_path: Path
) -> None:
    # a user's own task (tests/custom_task.py), named in the run file by import path; its model folder
    # is built from the task's alphabet, as services.learner.model_init does for any task
    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from tests.custom_task import ShoutTask

    folder = build_initial_policy(ModelConfig(max_position_embeddings=32), ShoutTask.alphabet, tmp_path / "policy")
    issue_test_rollout_key(bus.redis, keys)
    run = RunConfig.model_validate(
        {
            "run_id": run_id,
            "task": {"name": "tests.custom_task:ShoutTask", "num_eval_prompts": 3},
            "grpo": {"group_size": 2, "groups_per_step": 2, "max_new_tokens": 4},
        }
    )
    reward = RewardService(run, RewardSettings(redis_url=redis_server.url, model_dir=folder), bus)
    thread = threading.Thread(target=reward.run_forever, daemon=True)
    thread.start()
    try:
        wait_for(lambda: bus.length(TASKS) >= 1, "a task of the custom task")
        task = take_tasks(bus, 1)[0]
        assert task.task_name == ShoutTask.name and task.prompt.endswith("!")
        word = task.prompt.rstrip("!")
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        bus.publish(ROLLOUTS, rollout_for(task, [word.upper(), word], tokenizer))
        scored = wait_for(lambda: bus.read(SCORED, "learner-test", count=1, block_ms=50), "the scored group")
        assert scored[0].message.rewards == [1.0, 0.5]  # ShoutTask.score ran in the verifier's own process
        assert reward.scorer.verifiers.pid not in (None, os.getpid())
    finally:
        reward.stop_event.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_service_counts_at_the_source_and_forgets_finished_tasks(
    run: RunConfig, bus: StreamBus, keys: RunKeys, redis_server, model_dir: Path, tokenizer: Tokenizer
) -> None:
    issue_test_rollout_key(bus.redis, keys)
    settings = RewardSettings(redis_url=redis_server.url, model_dir=model_dir, trim_interval_s=0.1)
    service = RewardService(run, settings, bus)
    thread = threading.Thread(target=service.run_forever, daemon=True)
    thread.start()
    try:
        for _ in range(3):  # three rounds of take all tasks, answer them: the feed issues more each time
            wait_for(lambda: bus.backlog(TASKS) == 6, "the feed topped up")
            for leased in lease_tasks(bus, 6):
                answer(bus, leased, rollout_for(leased.message, ["1", "2", "3", "4"], tokenizer))
            wait_for(lambda: bus.backlog(ROLLOUTS) == 0, "every rollout scored")
            learned = bus.read(SCORED, "learner-0", count=6, block_ms=100)  # as the learner: read, decide, ack
            bus.ack(SCORED, [delivery.message_id for delivery in learned])
        counts = wait_for(lambda: bus.counts(keys.reward_counts), "the counts")
        assert counts["scored"] == 18 == bus.length(SCORED)  # the reward service never trims `scored`
        wait_for(lambda: bus.counts(keys.reward_counts)["tasks_issued"] == 24, "the fourth round issued")
        # (what trimming keeps and removes: tests/integration/test_task_accounting.py; approximate XTRIM
        # frees whole nodes, which a few dozen small entries do not fill)
        turns = CallCounter(service, "serve_once")
        turns.wait_for_more(2, "two more turns, each trimming first")
        assert bus.backlog(TASKS) == 6 and bus.backlog(ROLLOUTS) == 0  # nothing unfinished was touched
        scored = [letter.rollout.task_id for letter in bus.entries(SCORED)]
        assert not any(bus.redis.exists(keys.task_reference(task_id)) for task_id in scored)  # forgotten
        open_tasks = [d.message.task_id for d in bus.read(TASKS, "w-test", count=6, block_ms=100)]
        assert all(bus.redis.exists(keys.task_reference(task_id)) for task_id in open_tasks)
    finally:
        service.stop_event.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
