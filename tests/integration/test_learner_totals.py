"""Run totals survive a kill -9 of the learner: drops and dead letters (acked when decided, so never
seen again) continue from Redis, the staleness histogram and the trained-group count from the
checkpoint plus the retaken steps, the run's clock from the last state; and at the end every group on
`scored` is accounted for (trained + dropped + dead-lettered + still queued == written)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from cluster.redis_server import RedisServer
from shared.bus import StreamBus
from shared.keys import DEAD_LETTERED, RunKeys
from shared.messages import LearnerState
from shared.run_records import LearnerSummary
from shared.streams import LEARNER_STATE, SCORED
from tests.integration.test_learner_loop import (
    StandInWorker,
    metric_steps,
    small_run,
    start_learner_process,
    wait_for_learner,
)

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

RUN_FILE = (
    "[grpo]\ngroup_size = 4\ngroups_per_step = 4\n"
    "[schedule]\nstaleness_bound = 1\nnum_steps = 5\ncheckpoint_every = 2\neval_every = 3\nmax_wall_s = 120\n"
    "[broadcast]\nchunk_size_bytes = 65536\ndelta = false\n"  # the stand-in loads full payloads only
)


def test_a_killed_learner_keeps_its_counters_and_every_scored_group_is_accounted_for(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path, repo_root: Path
) -> None:
    run = small_run(keys.run_id, num_steps=5)
    run_config = tmp_path / "run.toml"
    run_config.write_text(RUN_FILE)
    # refused groups: at version 1 a future-version, another run's and an out-of-vocabulary one (dead
    # letter); from version 2 on, one stale group per version
    worker = StandInWorker(bus, run, tiny_policy_dir, inject_bad=True)
    worker.produce_below_version = 3  # steps 1-3, then the learner starves at version 3
    worker.start()

    def start() -> subprocess.Popen:
        return start_learner_process(run_config, tmp_path, tiny_policy_dir, redis_server.url, keys.run_id, repo_root)

    def state() -> LearnerState:
        value = bus.get_state(LEARNER_STATE)
        assert value is not None
        return value

    learner = start()
    try:
        # 1. Kill after step 3. The checkpoint is at 2: the stale group decided (and acked) while
        # collecting step 3 is in no checkpoint.
        wait_for_learner(lambda: metric_steps(tmp_path) == ([1, 2, 3], [0, 3]), "step 3", learner, tmp_path)
        before = state()
        assert before.num_dropped == {"future_version": 1, "run_mismatch": 1, "stale": 1}
        assert (before.num_dead_lettered, before.num_steps_done, before.num_groups_trained) == (1, 3, 12)
        learner.kill()
        learner.wait(timeout=10)

        # 2. Restart with no new groups: it retakes step 3 on the pending groups and starves at 3.
        # Nothing new was decided, so every total is what it was before the kill.
        worker.produce_below_version = 2  # the re-announced version 2 waits
        learner = start()
        wait_for_learner(
            lambda: (s := bus.get_state(LEARNER_STATE)) is not None and s.num_restarts == 1 and s.learner_version == 3,
            "step 3 retaken",
            learner,
            tmp_path,
        )
        after = state()
        assert after.num_dropped == before.num_dropped
        assert after.num_dead_lettered == before.num_dead_lettered == 1
        assert after.staleness_histogram == before.staleness_histogram
        assert (after.num_steps_done, after.num_groups_trained) == (before.num_steps_done, before.num_groups_trained)
        assert after.wall_s >= before.wall_s  # the run's clock does not go back to the checkpoint's

        # 3. Let it finish; the totals grow by what was decided after the restart.
        worker.produce_below_version = 1_000_000
        assert learner.wait(timeout=90) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)
        if learner.poll() is None:
            learner.kill()
            learner.wait(timeout=10)

    final = state()
    summary = LearnerSummary.model_validate_json((tmp_path / "learner_summary.json").read_text())
    assert (summary.finished, summary.totals.num_restarts, final.num_restarts) == (True, 1, 1)
    assert final.num_dropped == summary.num_dropped
    assert final.num_dropped["stale"] >= before.num_dropped["stale"] + 1  # the re-announced 2 brought one more
    stored = bus.counts(keys.learner_decisions)
    assert stored == {**final.num_dropped, DEAD_LETTERED: final.num_dead_lettered}
    assert sum(final.staleness_histogram.values()) == final.num_groups_trained == summary.totals.num_groups == 20
    # every group written to `scored` is trained, dropped with a reason, dead-lettered or still queued (counted
    # where it was written: the learner trims `scored` below what it consumed)
    num_decided = final.num_groups_trained + sum(final.num_dropped.values()) + final.num_dead_lettered
    assert num_decided + bus.backlog(SCORED) == worker.num_published
