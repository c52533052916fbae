"""The whole cluster on the multi-turn poker task: workers play Kuhn poker episodes with the tiny model,
the reward service replays them, the learner trains on the masked groups."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import redis

from cluster.local import ClusterOptions, LocalCluster
from cluster.redis_acl import OPERATOR
from cluster.report import write_report
from services.reward.decode import CompletionDecoder
from shared.keys import RunKeys
from shared.messages import ScoredGroup
from shared.streams import SCORED
from shared.tasks.poker import KuhnPokerTask

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_poker_run_trains_masked_episodes_rewarded_by_the_replay(tmp_path: Path, repo_root: Path) -> None:
    cluster = LocalCluster(
        ClusterOptions(
            config_path=repo_root / "tests" / "e2e" / "poker_test.toml",
            num_workers=2,
            runs_dir=tmp_path,
            progress_interval_s=1.0,
        )
    )
    try:
        cluster.start()
        status = cluster.wait_until_done()
        scored, states = read_scored(cluster)
    finally:
        cluster.stop()
    report = write_report(cluster.run_dir, cluster.run, status, wall_s=0.0)

    assert report.num_steps == cluster.run.schedule.num_steps
    assert report.num_dead_letters == 0
    assert cluster.run.grpo.groups_per_step * cluster.run.schedule.num_steps <= len(scored)
    decoder = CompletionDecoder(cluster.model_dir, cluster.run.grpo.max_new_tokens)
    task = KuhnPokerTask(num_eval_prompts=cluster.run.task.num_eval_prompts, seed=cluster.run.task.seed)
    num_two_turn = 0
    for group in scored:
        rollout = group.rollout
        assert rollout.is_masked
        state = states[rollout.task_id]  # the deal's seed, as the reward service stored it for the task
        assert state in {p.reference for p in task.train_set}
        episodes = decoder.decode_episodes(rollout, KuhnPokerTask.max_turns)
        # the reward trained on is the replay of the model's decoded turns (an honest worker claims the same)
        replayed = [task.replay(state, episode.actions).reward for episode in episodes]
        assert group.rewards == replayed == rollout.env_rewards
        num_two_turn += sum(len(episode.actions) == 2 for episode in episodes)
    assert num_two_turn > 0  # some episodes had an observation between two model turns


def read_scored(cluster: LocalCluster) -> tuple[list[ScoredGroup], dict[str, str]]:
    """Every scored group still in the stream (the learner acks, nothing trims it in a run this short), and
    the state (deal seed) of each one's task."""
    keys = RunKeys(cluster.run.run_id)
    client = redis.Redis.from_url(cluster.redis_url_for(OPERATOR))
    try:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], client.xrange(keys.name_of(SCORED)))
        groups = [ScoredGroup.decode(fields[b"data"]) for _, fields in entries]
        task_ids = [group.rollout.task_id for group in groups]
        states = cast(list[bytes], client.mget([keys.task_reference(task_id) for task_id in task_ids]))
    finally:
        client.close()
    return groups, {task_id: state.decode() for task_id, state in zip(task_ids, states, strict=True)}
