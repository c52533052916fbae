"""A run that cannot learn says so, and dynamic sampling keeps every group accounted for: the learner's whole
loop against real Redis and HTTP, fed by the stand-in worker of test_learner_loop.py with its rewards
rewritten, so which groups are flat (every sample scored the same) is fixed by the test."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from cluster.redis_server import RedisServer
from services.learner.learner import Learner
from services.learner.zero_variance import WARN_EVERY_STEPS, WARN_STEPS
from shared.bus import StreamBus
from shared.config import GRPOConfig, RunConfig
from shared.keys import RunKeys
from shared.messages import FlatGroups, ScoredGroup
from shared.run_records import read_metrics
from shared.streams import LEARNER_STATE, SCORED
from tests.integration.test_learner_loop import StandInWorker, learner_settings, small_run

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

GROUPS_PER_STEP = 4


class FixedRewardsWorker(StandInWorker):
    """Per announced version: `rewards_per_group` as the rewards of its groups, in order (one group each)."""

    def __init__(self, bus: StreamBus, run: RunConfig, policy_dir: Path, rewards_per_group: list[list[float]]) -> None:
        super().__init__(bus, run, policy_dir)
        self.rewards_per_group = rewards_per_group

    def groups_for(self, version: int) -> list[ScoredGroup]:
        groups = self.sample(self.model, version, len(self.rewards_per_group))
        return [
            group.model_copy(update={"rewards": rewards})
            for group, rewards in zip(groups, self.rewards_per_group, strict=True)
        ]


def run_learner(run: RunConfig, bus: StreamBus, redis_url: str, policy_dir: Path, run_dir: Path, rewards: list) -> None:
    worker = FixedRewardsWorker(bus, run, policy_dir, rewards)
    worker.start()
    try:
        with Learner(run, learner_settings(redis_url, run_dir, policy_dir), bus) as learner:
            learner.run()
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)


def test_a_run_whose_groups_never_score_warns_after_warn_steps_and_names_the_cause(
    bus: StreamBus,
    keys: RunKeys,
    redis_server: RedisServer,
    tiny_policy_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    num_steps = WARN_STEPS + 2
    base = small_run(keys.run_id, num_steps=num_steps)
    run = base.model_copy(update={"grpo": GRPOConfig(group_size=4, groups_per_step=GROUPS_PER_STEP)})
    with caplog.at_level(logging.WARNING, logger="services.learner.learner"):
        run_learner(run, bus, redis_server.url, tiny_policy_dir, tmp_path, [[0.0] * 4] * GROUPS_PER_STEP)

    steps, _ = read_metrics(tmp_path / "metrics.jsonl")
    assert [step.flat_groups.zero_variance_fraction for step in steps] == [1.0] * num_steps
    assert all(step.flat_groups.num_flat_at_zero == GROUPS_PER_STEP for step in steps)
    # warned once, at the WARN_STEPS-th step in a row (not before), and not again within WARN_EVERY_STEPS steps
    assert WARN_EVERY_STEPS > num_steps
    assert [step.step for step in steps if step.zero_variance_warning] == [WARN_STEPS]
    (warning,) = [record.getMessage() for record in caplog.records if "zero reward variance" in record.getMessage()]
    assert "The model never scores" in warning and "max_new_tokens = 2" in warning
    state = bus.get_state(LEARNER_STATE)
    assert state is not None and state.zero_variance_warning == warning  # still raised: the coordinator shows it
    assert state.last_flat_groups == steps[-1].flat_groups


def test_dynamic_sampling_drops_flat_groups_with_their_reason_and_every_group_is_accounted_for(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    base = small_run(keys.run_id, num_steps=3)
    run = base.model_copy(
        update={"grpo": GRPOConfig(group_size=4, groups_per_step=GROUPS_PER_STEP, dynamic_sampling=True)}
    )
    # per version: one group all 0, one all 1 (both skipped), then a batch's worth with a spread
    rewards = [[0.0] * 4, [1.0] * 4] + [[1.0, 0.0, 0.0, 0.0]] * GROUPS_PER_STEP
    run_learner(run, bus, redis_server.url, tiny_policy_dir, tmp_path, rewards)

    steps, _ = read_metrics(tmp_path / "metrics.jsonl")
    expected = FlatGroups(num_groups=6, num_flat_at_zero=1, num_flat_at_max=1, num_skipped=2, num_samples=24)
    cut = {"num_samples_cut"}  # samples of the random policy that hit max_new_tokens: its business
    assert [step.flat_groups.model_dump(exclude=cut) for step in steps] == [expected.model_dump(exclude=cut)] * 3
    assert all(step.num_groups == GROUPS_PER_STEP for step in steps)  # full batches, of groups with a spread
    assert steps[0].flat_groups.groups_per_trained_group == 1.5  # the cost: 6 generated per 4 trained
    assert steps[-1].num_dropped == {"zero_variance": 6}
    state = bus.get_state(LEARNER_STATE)
    assert state is not None and state.num_dropped == {"zero_variance": 6} and state.zero_variance_warning is None
    assert bus.counts(keys.learner_decisions) == {"zero_variance": 6, "dead_lettered": 0}
    # produced on `scored` = trained + dropped by reason + dead-lettered + not yet decided (the last version's)
    num_decided = state.num_groups_trained + sum(state.num_dropped.values()) + state.num_dead_lettered
    assert num_decided + bus.backlog(SCORED) == bus.length(SCORED)
    assert state.num_groups_trained == 3 * GROUPS_PER_STEP
