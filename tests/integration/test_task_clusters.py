"""Each task adapter of shared/tasks/ (math_gym, math_file, knights_knaves, mini_sudoku) in a local cluster
end to end: Redis, coordinator, reward service, learner and one rollout worker as real processes
(cluster/local.py) on the tiny-random model, for 3 learner steps.

The tiny model does not learn these tasks (it rarely writes a \\boxed{} or an <answer> tag); the test checks
the pipeline: every prompt reaches the worker and back, the reward service scores each group with the
task's verifier in its child process (recomputed here from the decoded ids and the stored reference), the
learner trains its steps and evaluates on the held-out set with its own verifier process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.redis_acl import OPERATOR
from services.reward.decode import CompletionDecoder
from shared.bus import StreamBus, connect
from shared.keys import RunKeys
from shared.messages import ScoredGroup
from shared.run_records import EvalRecord, LearnerSummary, StepRecord
from shared.streams import SCORED
from shared.tasks import build_task

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN_FILE = """
run_id = "tasks-{name}"

[model]
init = "tiny-random"
max_position_embeddings = 1024  # knights_knaves prompts are up to ~620 characters: one token each here

[task]
name = "{name}"
num_eval_prompts = 4
seed = 3
{task_fields}

[grpo]
group_size = 2
groups_per_step = 4
max_new_tokens = 12

[schedule]
staleness_bound = 2
num_steps = 3
checkpoint_every = 3
eval_every = 3
max_wall_s = 240

[rollout]
engine = "torch"

[broadcast]
chunk_size_bytes = 65536

[reward]
verifier_timeout_s = 30.0
"""


def math_file_rows(path: Path) -> Path:
    rows = [{"problem": f"What is {a} + {b}?", "solution": str(a + b)} for a in range(6) for b in range(5)]
    rows.append({"problem": "Write one half as a fraction.", "solution": "\\frac{1}{2}"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("name", ["math_gym", "math_file", "knights_knaves", "mini_sudoku"])
def test_each_task_runs_a_local_cluster_end_to_end(name: str, tmp_path: Path) -> None:
    task_fields = "size = 60"
    if name == "math_file":
        data = math_file_rows(tmp_path / "problems.jsonl")
        task_fields = f'path = "{data}"\nquestion_column = "problem"\nanswer_column = "solution"'
    run_file = tmp_path / f"{name}.toml"
    run_file.write_text(RUN_FILE.format(name=name, task_fields=task_fields))
    cluster = LocalCluster(
        ClusterOptions(config_path=run_file, num_workers=1, runs_dir=tmp_path, progress_interval_s=0.5)
    )
    try:
        cluster.start()
        cluster.wait_until_done()
        cluster.check_services_alive()
        scored = read_scored(cluster)
        verify_rewards(cluster, scored)
    finally:
        cluster.stop()
    for process in cluster.services.values():
        with pytest.raises(ProcessLookupError):
            os.kill(process.pid, 0)  # every service is gone

    summary = LearnerSummary.model_validate_json((cluster.run_dir / "learner_summary.json").read_text())
    assert summary.finished
    lines = [json.loads(line) for line in (cluster.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [StepRecord.model_validate(line) for line in lines if "eval_step" not in line]
    evals = [EvalRecord.model_validate(line) for line in lines if "eval_step" in line]
    assert [step.step for step in steps] == [1, 2, 3]
    assert sum(step.num_groups for step in steps) == 3 * 4  # groups_per_step groups trained at each step
    # held-out evaluations before training and at the last step, scored by the learner's verifier process
    assert [(e.eval_step, e.num_eval_prompts, e.num_verifier_failures) for e in evals] == [(0, 4, 0), (3, 4, 0)]
    reward_log = (cluster.run_dir / "logs" / "reward.log").read_text()
    assert f"serving {name}" in reward_log  # the verifier child built this task


def read_scored(cluster: LocalCluster) -> list[ScoredGroup]:
    bus = StreamBus(connect(cluster.redis_url_for(OPERATOR)), RunKeys(cluster.run.run_id), service="test")
    return bus.entries(SCORED)


def verify_rewards(cluster: LocalCluster, scored: list[ScoredGroup]) -> None:
    """Every scored group is of this task and its rewards are the task's verifier on the decoded ids."""
    assert len(scored) >= 12
    task = build_task(cluster.run.task)
    decoder = CompletionDecoder(cluster.model_dir, cluster.run.grpo.max_new_tokens)
    bus_redis = connect(cluster.redis_url_for(OPERATOR))
    keys = RunKeys(cluster.run.run_id)
    for group in scored:
        assert group.rollout.task_name == task.name
        reference = bus_redis.get(keys.task_reference(group.rollout.task_id))
        assert reference is not None
        texts = decoder.decode(group.rollout)
        assert group.rewards == [task.score(text, reference.decode()) for text in texts]
