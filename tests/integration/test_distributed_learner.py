"""The learner sharded over 2 ranks (FSDP2, gloo on CPU, torchrun) against one process: the same steps on
the same batches give the same losses and the same published weights; its checkpoint resumes on one
process; and the learner service under torchrun survives kill -9 and SIGTERM and resumes at its
checkpoint, on 2 ranks and then on 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cluster.local import learner_launcher
from cluster.redis_server import RedisServer
from services.learner.checkpoint import checkpoint_path, load_checkpoint
from services.learner.distributed import RankGroup
from services.learner.policy import Policy
from services.learner.publish import publication_state
from shared.bus import StreamBus
from shared.keys import RunKeys
from shared.run_records import LearnerSummary
from shared.streams import LEARNER_STATE
from tests import sharded_step
from tests.integration.test_learner_loop import (
    RESUME_RUN_TOML,
    StandInWorker,
    metric_steps,
    pending_count,
    read_metrics,
    small_run,
    start_learner_process,
    wait_for_learner,
)
from tests.polling import wait_for

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

MAX_WEIGHT_DIFF = 1e-5  # fp32 after 2 steps of 2 AdamW updates at lr 1e-3: the sums differ in rounding only


def test_two_ranks_take_the_same_steps_as_one_process_and_their_checkpoint_resumes_on_one(
    tiny_policy_dir: Path, tmp_path: Path, repo_root: Path
) -> None:
    sharded_dir, single_dir = tmp_path / "two_ranks", tmp_path / "one_process"
    command = [sys.executable, *learner_launcher(2), "-m", "tests.sharded_step", str(tiny_policy_dir), str(sharded_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sharded_step.run_steps(tiny_policy_dir, single_dir, RankGroup())

    sharded = json.loads((sharded_dir / "result.json").read_text())
    single = json.loads((single_dir / "result.json").read_text())
    assert (sharded["world_size"], single["world_size"]) == (2, 1)
    for two, one in zip(sharded["steps"], single["steps"], strict=True):
        for name in ("loss", "grad_norm", "proximal_sum"):
            assert two[name] == pytest.approx(one[name], rel=1e-5), name
        assert two["clip_fraction"] == one["clip_fraction"]
    assert single["steps"][0]["loss"] != single["steps"][1]["loss"]  # two different batches, two different steps

    published_two = load_file(sharded_dir / "weights.safetensors")
    published_one = load_file(single_dir / "weights.safetensors")
    assert published_two.keys() == published_one.keys() and "lm_head.weight" not in published_one  # tied: left out
    initial = publication_state(Policy(tiny_policy_dir, sharded_step.RUN).weights())
    diffs = {name: float((published_two[name] - published_one[name]).abs().max()) for name in published_one}
    moved = {name: float((published_one[name] - initial[name]).abs().max()) for name in published_one}
    loss_rel_diffs = [
        abs(two["loss"] / one["loss"] - 1) for two, one in zip(sharded["steps"], single["steps"], strict=True)
    ]
    print(
        f"2 ranks vs 1: loss rel diff per step {loss_rel_diffs}, published weights max abs diff {max(diffs.values()):.2e}"
    )
    assert max(diffs.values()) < MAX_WEIGHT_DIFF, diffs
    assert min(moved.values()) > 100 * MAX_WEIGHT_DIFF  # every tensor trained: the comparison means something

    # The 2-rank checkpoint (full tensors by name) resumes on one process: same weights, same optimizer state.
    model_state, optimizer_state = torch.load(sharded_dir / "checkpoint.pt", weights_only=True)
    resumed = Policy(tiny_policy_dir, sharded_step.RUN)
    resumed.restore(model_state, optimizer_state)
    assert all(torch.equal(resumed.weights().state_dict()[name], published_two[name]) for name in published_two)
    steps_taken = {int(state["step"]) for state in resumed.optimizer.state.values()}
    assert steps_taken == {sharded_step.NUM_STEPS * sharded_step.RUN.grpo.num_minibatches}


def test_two_ranks_in_mixed_precision_keep_float32_masters_and_step_like_one_process(
    tiny_policy_dir: Path, tmp_path: Path, repo_root: Path
) -> None:
    """FSDP2's MixedPrecisionPolicy (bf16 parameters for compute, float32 reduction) on the float32 shards
    against one process autocasting to bf16 on float32 masters: the same steps up to bf16 rounding."""
    sharded_dir, single_dir = tmp_path / "two_ranks", tmp_path / "one_process"
    command = [
        *[sys.executable, *learner_launcher(2), "-m", "tests.sharded_step"],
        *[str(tiny_policy_dir), str(sharded_dir), "--precision", "mixed"],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(command, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sharded_step.run_steps(tiny_policy_dir, single_dir, RankGroup(), precision="mixed")

    sharded = json.loads((sharded_dir / "result.json").read_text())
    single = json.loads((single_dir / "result.json").read_text())
    assert sharded["master_dtypes"] == single["master_dtypes"] == ["torch.float32"]
    for two, one in zip(sharded["steps"], single["steps"], strict=True):
        # bf16 compute: the two layouts round differently (FSDP casts the norm gains too, autocast does not).
        # Measured: pi_prox sums 4e-4 apart, grad norms 2.5%, losses (sums of signed terms, ~0.1) 0.005.
        assert two["proximal_sum"] == pytest.approx(one["proximal_sum"], rel=2e-3)
        assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=0.1)
        assert two["loss"] == pytest.approx(one["loss"], abs=0.02)
    published_two = load_file(sharded_dir / "weights.safetensors")
    published_one = load_file(single_dir / "weights.safetensors")
    diffs = {name: float((published_two[name] - published_one[name]).abs().max()) for name in published_one}
    assert max(diffs.values()) < 1e-2, diffs  # 4 AdamW updates of <= lr 1e-3 each: same direction, both ways


def kill_group(process: subprocess.Popen) -> None:
    """kill -9 of the launcher's process group; the ranks (torchrun gives each a session of its own) exit
    when they see their launcher gone (distributed.exit_with_launcher): waited for here."""
    ranks = child_pids(process.pid)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), "the ranks to exit", timeout_s=10)


def child_pids(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


@pytest.mark.slow  # about 60 s on 2 cores: four learner starts, two of them torchrun jobs
def test_a_sharded_learner_killed_resumes_at_its_checkpoint_stops_on_sigterm_and_finishes_on_one_rank(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path, repo_root: Path
) -> None:
    run = small_run(keys.run_id, num_steps=6)
    run_config = tmp_path / "run.toml"
    run_config.write_text(RESUME_RUN_TOML)
    worker = StandInWorker(bus, run, tiny_policy_dir)
    worker.produce_below_version = 3  # the learner can take steps 1-3, then starves at version 3
    worker.start()

    def start(num_procs: int) -> subprocess.Popen:
        """The learner service under torchrun (num_procs > 1) or alone, in a process group of its own."""
        args = (run_config, tmp_path, tiny_policy_dir, redis_server.url, keys.run_id, repo_root)
        return start_learner_process(*args, launcher=learner_launcher(num_procs), start_new_session=True)

    learner = start(2)
    try:
        # 1. kill -9 of torchrun and both ranks after step 3: the checkpoint is at 2, step 3's groups pending.
        wait_for_learner(lambda: metric_steps(tmp_path) == ([1, 2, 3], [0, 3]), "step 3", learner, tmp_path, 120)
        kill_group(learner)
        assert load_checkpoint(checkpoint_path(tmp_path)).policy_version == 2
        assert pending_count(bus, keys) == 4

        # 2. 2 ranks again: resume at 2, retrain step 3 on the re-read groups, go on to step 5; then SIGTERM
        # to torchrun, which passes it to both ranks: rank 0 checkpoints (with rank 1) and everything exits.
        worker.produce_below_version = 4
        learner = start(2)
        wait_for_learner(lambda: metric_steps(tmp_path)[0] == [1, 2, 3, 4, 5], "step 5", learner, tmp_path, 120)
        assert read_metrics(tmp_path)[0][2]["num_replayed_groups"] == 4
        learner.send_signal(signal.SIGTERM)
        learner.wait(timeout=60)
        assert load_checkpoint(checkpoint_path(tmp_path)).policy_version == 5
        stopped = LearnerSummary.model_validate_json((tmp_path / "learner_summary.json").read_text())
        assert (stopped.finished, stopped.stop_reason, stopped.policy_version) == (False, "signal", 5)

        # 3. One process resumes the 2-rank checkpoint and finishes the run.
        worker.produce_below_version = 1_000_000
        learner = start(1)
        assert learner.wait(timeout=120) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)
        kill_group(learner)

    steps, evals = read_metrics(tmp_path)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [e["eval_step"] for e in evals] == [0, 3, 6]
    summary = LearnerSummary.model_validate_json((tmp_path / "learner_summary.json").read_text())
    assert (summary.finished, summary.policy_version, summary.totals.num_restarts) == (True, 6, 2)
    assert pending_count(bus, keys) == 0
    assert bus.get_state(LEARNER_STATE).status == "done"
