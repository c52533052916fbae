"""The learner's loop with PPO minibatches, against real Redis and HTTP and the stand-in worker of
test_learner_loop: several optimizer updates per batch, still one policy version per batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cluster.redis_server import RedisServer
from services.learner.learner import Learner
from shared.bus import StreamBus
from shared.config import GRPOConfig
from shared.keys import RunKeys
from shared.run_records import read_metrics
from shared.streams import LEARNER_STATE
from tests.integration.test_learner_loop import StandInWorker, learner_settings, small_run

pytestmark = pytest.mark.integration
torch.set_num_threads(1)


def test_the_version_advances_by_one_per_batch_whatever_the_number_of_updates(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    base = small_run(keys.run_id, num_steps=3)
    grpo = GRPOConfig(group_size=4, groups_per_step=4, num_minibatches=2, ppo_epochs=2)
    run = base.model_copy(update={"grpo": grpo})
    settings = learner_settings(redis_server.url, tmp_path, tiny_policy_dir)
    worker = StandInWorker(bus, run, tiny_policy_dir)
    worker.start()
    try:
        with Learner(run, settings, bus) as learner:
            summary = learner.run()
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)

    steps, _ = read_metrics(tmp_path / "metrics.jsonl")
    assert [(s.step, s.policy_version, s.num_updates) for s in steps] == [(1, 1, 4), (2, 2, 4), (3, 3, 4)]
    assert all(0.0 < s.ess_fraction <= 1.0 and s.is_weight_max >= s.is_weight_mean > 0.0 for s in steps)
    assert {int(state["step"]) for state in learner.policy.optimizer.state.values()} == {12}  # 3 batches x 4 updates
    assert worker.versions_seen == [0, 1, 2, 3]  # one published version per batch
    assert summary.policy_version == 3
    state = bus.get_state(LEARNER_STATE)
    assert (state.learner_version, state.published_version, state.num_steps_done) == (3, 3, 3)
    assert state.last_step == steps[-1].diagnostics  # the last step's, as metrics.jsonl has them
