"""The learner's whole loop against real Redis and real HTTP, fed by a stand-in worker that fetches
each announced version from the learner's chunk server and samples groups with it (true behaviour
log-probs, the task's verifier as reward). In-process for exact counts; as a subprocess for kill -9,
restart and SIGTERM."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
import torch

from cluster.redis_server import RedisServer
from engines.interface import Sampling
from services.learner.batch import LEARNER_CONSUMER
from services.learner.checkpoint import checkpoint_path, load_checkpoint
from services.learner.learner import Learner
from services.learner.publish import load_weights_blob
from services.learner.settings import LearnerSettings
from services.learner.trainer import load_policy
from shared.bus import StreamBus, connect
from shared.config import BroadcastConfig, GRPOConfig, LearnerConfig, RunConfig, ScheduleConfig
from shared.keys import RunKeys
from shared.messages import ScoredGroup, WeightsPublished, pack_int32
from shared.retry import call_with_retry
from shared.run_records import LearnerSummary
from shared.streams import LEARNER_STATE, SCORED, WEIGHTS
from shared.tasks import make_task
from shared.weight_channel import WeightsError
from shared.weight_channel.client import fetch_manifest, fetch_version
from tests.gated_task import GatedTask
from tests.polling import wait_for
from tests.selfplay import sample_scored_groups
from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY_HEX

pytestmark = pytest.mark.integration
torch.set_num_threads(1)


def small_run(run_id: str, *, num_steps: int) -> RunConfig:
    return RunConfig(
        run_id=run_id,
        grpo=GRPOConfig(group_size=4, groups_per_step=4),
        schedule=ScheduleConfig(
            staleness_bound=1, num_steps=num_steps, checkpoint_every=2, eval_every=3, max_wall_s=120
        ),
        broadcast=BroadcastConfig(chunk_size_bytes=65536, delta=False),  # the stand-in loads full payloads only
    )


class StandInWorker(threading.Thread):
    """Rollout worker + reward service in one thread. It takes the announcements on `weights` in order;
    for each it fetches that version over HTTP, verifies and loads it, and publishes groups_per_step
    groups sampled with it. With `inject_bad`, one of them is sampled by the previous version (lag 1,
    admissible), and groups the learner must refuse go first: one tagged two versions old (stale),
    and at version 1 a future version, another run's group and one with out-of-vocabulary tokens.
    Announcements of `produce_below_version` or later wait until the test raises it."""

    def __init__(self, bus: StreamBus, run: RunConfig, policy_dir: Path, *, inject_bad: bool = False) -> None:
        super().__init__(daemon=True)
        self.bus, self.run_config, self.keys, self.inject_bad = bus, run, RunKeys(run.run_id), inject_bad
        self.model, self.tokenizer = load_policy(policy_dir)
        self.previous_model = copy.deepcopy(self.model)
        self.task = make_task(run.task.name, num_eval_prompts=run.task.num_eval_prompts, seed=run.task.seed)
        self.rng, self.generator = random.Random(0), torch.Generator().manual_seed(0)
        self.produce_below_version = 1_000_000
        self.stop_event = threading.Event()
        self.versions_seen: list[int] = []
        self.num_handled = 0  # announcements handled, in order (the next one to take is at this index)
        self.num_published = 0  # groups written to `scored` (the learner trims what it consumed: count here)

    def run(self) -> None:
        with httpx.Client(timeout=5.0) as client:
            while not self.stop_event.wait(0.02):
                unhandled = call_with_retry(lambda: self.bus.entries(WEIGHTS), "entries")[self.num_handled :]
                if not unhandled:
                    continue
                announcement = unhandled[0]
                if announcement.policy_version >= self.produce_below_version:
                    continue
                try:
                    self.load(client, announcement)
                except WeightsError:
                    if len(unhandled) > 1:  # announced by a learner that has died since: skip it
                        self.num_handled += 1
                    continue
                self.num_handled += 1
                self.versions_seen.append(announcement.policy_version)
                for group in self.groups_for(announcement.policy_version):
                    call_with_retry(lambda group=group: self.bus.publish(SCORED, group), "publish")
                    self.num_published += 1

    def load(self, client: httpx.Client, announcement: WeightsPublished) -> None:
        base_url = announcement.manifest_url.split("/v1/weights/")[0]
        manifest = fetch_manifest(client, base_url, announcement.policy_version, PUBLIC_KEY)
        if manifest.sha256() != announcement.manifest_sha256:
            raise WeightsError(f"version {announcement.policy_version} at {base_url} is not the one announced")
        blob = fetch_version(client, base_url, manifest)
        self.previous_model.load_state_dict(self.model.state_dict())
        load_weights_blob(self.model, blob)

    def sample(
        self, model: torch.nn.Module, version: int, num_groups: int, run_id: str | None = None
    ) -> list[ScoredGroup]:
        grpo = self.run_config.grpo
        prompts = [self.rng.choice(self.task.train_set) for _ in range(num_groups)]
        return sample_scored_groups(
            model,
            self.tokenizer,
            self.task,
            prompts,
            run_id=run_id or self.run_config.run_id,
            policy_version=version,
            sampling=Sampling(grpo.group_size, grpo.max_new_tokens, grpo.temperature),
            worker_id="stand-in",
            generator=self.generator,
        )

    def groups_for(self, version: int) -> list[ScoredGroup]:
        num_fresh = self.run_config.grpo.groups_per_step
        if not self.inject_bad:
            return self.sample(self.model, version, num_fresh)
        refused: list[ScoredGroup] = []
        if version >= 2:
            refused += self.sample(self.model, version - 2, 1)
        if version == 1:
            (good,) = self.sample(self.model, version, 1)
            broken = good.rollout.model_copy(
                update={
                    "completion_token_ids": pack_int32([999] * good.rollout.num_samples),
                    "completion_lengths": pack_int32([1] * good.rollout.num_samples),
                    "behaviour_logprobs": good.rollout.behaviour_logprobs[: 4 * good.rollout.num_samples],
                }
            )
            refused += self.sample(self.model, version + 5, 1) + self.sample(
                self.model, version, 1, run_id="another-run"
            )
            refused.append(ScoredGroup(run_id=self.run_config.run_id, rollout=broken, rewards=good.rewards))
        lagging = self.sample(self.previous_model, version - 1, 1) if version >= 1 else []
        return refused + lagging + self.sample(self.model, version, num_fresh - len(lagging))


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if "step" in line], [line for line in lines if "eval_step" in line]


def metric_steps(run_dir: Path) -> tuple[list[int], list[int]]:
    """(steps, eval steps) of metrics.jsonl so far."""
    steps, evals = read_metrics(run_dir)
    return [s["step"] for s in steps], [e["eval_step"] for e in evals]


def pending_count(bus: StreamBus, keys: RunKeys) -> int:
    return len(
        bus.redis.xpending_range(keys.name_of(SCORED), SCORED.group, "-", "+", 1000, consumername=LEARNER_CONSUMER)
    )


def learner_settings(redis_url: str, run_dir: Path, model_dir: Path) -> LearnerSettings:
    """A learner on `redis_url` with its chunk server on a free port and a short read block."""
    return LearnerSettings(
        redis_url=redis_url,
        run_dir=run_dir,
        model_dir=model_dir,
        signing_key=SIGNING_KEY_HEX,
        learner_port=0,
        scored_block_ms=50,
    )


def test_the_loop_trains_publishes_and_never_trains_on_what_the_bound_forbids(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    run = small_run(keys.run_id, num_steps=6)
    settings = learner_settings(redis_server.url, tmp_path, tiny_policy_dir)
    worker = StandInWorker(bus, run, tiny_policy_dir, inject_bad=True)
    worker.start()
    try:
        with Learner(run, settings, bus) as learner:
            summary = learner.run()
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)

    steps, evals = read_metrics(tmp_path)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s["policy_version"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert steps[0]["staleness_histogram"] == {"0": 4}
    assert all(s["staleness_histogram"] == {"0": 3, "1": 1} for s in steps[1:])  # the lag-1 group is admitted (S = 1)
    assert max(s["max_staleness"] for s in steps) <= run.schedule.staleness_bound
    assert all(s["num_samples"] == 16 and s["train_s"] > 0 for s in steps)
    assert steps[-1]["num_dropped"] == {"stale": 4, "future_version": 1, "run_mismatch": 1}  # stale: v0..v3 at t=2..5
    assert steps[-1]["num_dead_lettered"] == 1
    assert "outside" in bus.dead_letters()[0].error
    assert [e["eval_step"] for e in evals] == [0, 3, 6]
    assert worker.versions_seen == [0, 1, 2, 3, 4, 5, 6]

    assert summary.finished and summary.stop_reason == "num_steps" and summary.policy_version == 6
    assert summary.max_trained_staleness == 1
    assert LearnerSummary.model_validate_json((tmp_path / "learner_summary.json").read_text()) == summary
    assert load_checkpoint(checkpoint_path(tmp_path)).policy_version == 6
    assert pending_count(bus, keys) == 0  # every admitted group acked after its checkpoint
    state = bus.get_state(LEARNER_STATE)
    assert (state.status, state.learner_version, state.published_version) == ("done", 6, 6)
    assert state.num_dropped == summary.num_dropped
    final, _ = load_policy(tmp_path / "model_final")
    assert torch.equal(final.get_input_embeddings().weight, learner.policy.weights().get_input_embeddings().weight)
    # The stand-in samples its lag-0 groups with the learner's own weights and code: no engine mismatch.
    assert all(set(s["mismatch_by_worker"]) == {"stand-in"} for s in steps)
    assert all(m["logprob_abs_diff_mean"] < 1e-3 for s in steps for m in s["mismatch_by_worker"].values())
    assert set(state.mismatch_by_worker) == {"stand-in"}


def test_a_slow_evaluation_stalls_training_at_most_the_budget_and_the_final_eval_waits(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path
) -> None:
    """Step 0's evaluation hangs in scoring until the test opens the gate: the learner trains every step
    anyway, skipping each eval due meanwhile after eval_max_stall_s; at the end it waits for the hung
    eval and then evaluates the final weights, so "after" is the final policy's accuracy."""
    run = small_run(keys.run_id, num_steps=6).model_copy(
        update={
            "schedule": ScheduleConfig(staleness_bound=1, num_steps=6, checkpoint_every=2, eval_every=1),
            "learner": LearnerConfig(eval_max_stall_s=0.3),
        }
    )
    settings = learner_settings(redis_server.url, tmp_path, tiny_policy_dir)
    gated = GatedTask(num_eval_prompts=run.task.num_eval_prompts, seed=run.task.seed)
    worker = StandInWorker(bus, run, tiny_policy_dir)
    worker.start()
    summaries: list[LearnerSummary] = []
    try:
        with Learner(run, settings, bus) as learner:
            learner.evaluator.task = gated  # the learner's own task, with scoring that waits for the gate,
            assert learner.evaluator.verifier is not None  # run on the eval thread rather than in the verifier's
            learner.evaluator.verifier.close()  # process (a threading gate does not cross processes)
            learner.evaluator.verifier = None
            loop = threading.Thread(target=lambda: summaries.append(learner.run()), daemon=True)
            loop.start()
            try:
                wait_for(
                    lambda: (
                        metric_steps(tmp_path) == ([1, 2, 3, 4, 5, 6], []) and learner.totals.num_evals_skipped == 6
                    ),
                    "six steps and six skipped evals while eval 0 hangs",
                )
            finally:
                gated.gate.set()  # (also on failure: leaving the block waits for the eval thread)
            loop.join(timeout=60)
            assert not loop.is_alive()
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)

    (summary,) = summaries
    steps, evals = read_metrics(tmp_path)
    assert [e["eval_step"] for e in evals] == [0, 6]
    assert summary.totals.num_evals_skipped == 6  # due at steps 1-6, each while eval 0 still ran
    assert summary.totals.eval_stall_s < 6 * 0.3 + 2.0  # six budgets, plus two snapshots and slack
    assert all(e["eval_stall_s"] < 0.3 for e in evals[:1])  # eval 0 started on an idle thread
    assert summary.eval_accuracy_after == evals[-1]["eval_accuracy"] and summary.totals.eval_step_last == 6


# the kill-and-resume tests' run file: checkpoints every 2 steps, 6 steps in all
RESUME_RUN_TOML = (
    "[grpo]\ngroup_size = 4\ngroups_per_step = 4\n"
    "[schedule]\nstaleness_bound = 1\nnum_steps = 6\ncheckpoint_every = 2\neval_every = 3\nmax_wall_s = 120\n"
    "[broadcast]\nchunk_size_bytes = 65536\ndelta = false\n"  # the stand-in loads full payloads only
)


def start_learner_process(
    run_config: Path,
    run_dir: Path,
    policy_dir: Path,
    redis_url: str,
    run_id: str,
    repo_root: Path,
    launcher: Sequence[str] = (),
    start_new_session: bool = False,
) -> subprocess.Popen:
    """`python [launcher...] -m services.learner` (cluster.local.learner_launcher: torchrun), output to
    <run_dir>/learner.log; `start_new_session`: in a process group of its own, for a kill -9 of all of it."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "RL_REDIS_URL": redis_url,
        "RL_RUN_CONFIG": str(run_config),
        "RL_RUN_ID": run_id,
        "RL_RUN_DIR": str(run_dir),
        "RL_MODEL_DIR": str(policy_dir),
        "RL_SIGNING_KEY": SIGNING_KEY_HEX,
        "RL_LEARNER_PORT": "0",
        "RL_SCORED_BLOCK_MS": "50",
    }
    log_file = open(run_dir / "learner.log", "ab")  # noqa: SIM115 (closed with the test's tmp dir)
    return subprocess.Popen(
        [sys.executable, *launcher, "-m", "services.learner"],
        env=env,
        cwd=repo_root,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=start_new_session,
    )


def wait_for_learner(condition, what: str, process: subprocess.Popen, run_dir: Path, timeout_s: float = 60.0) -> None:
    """wait_for, failing at once (with the learner's log) if the learner process exits first."""

    def log_tail() -> str:
        return (run_dir / "learner.log").read_text()[-3000:]

    def reached() -> bool:
        if condition():
            return True
        if process.poll() is not None and not condition():
            raise AssertionError(f"learner exited with {process.returncode} before {what}:\n{log_tail()}")
        return False

    wait_for(reached, what, timeout_s=timeout_s, interval_s=0.05, explain=log_tail)


def test_killed_learner_resumes_at_its_checkpoint_and_retrains_the_unacked_groups_then_stops_cleanly_on_sigterm(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tiny_policy_dir: Path, tmp_path: Path, repo_root: Path
) -> None:
    run = small_run(keys.run_id, num_steps=6)
    run_config = tmp_path / "run.toml"
    run_config.write_text(RESUME_RUN_TOML)
    worker = StandInWorker(bus, run, tiny_policy_dir)
    worker.produce_below_version = 3  # the learner can take steps 1-3, then starves at version 3
    worker.start()

    def start() -> subprocess.Popen:
        return start_learner_process(run_config, tmp_path, tiny_policy_dir, redis_server.url, keys.run_id, repo_root)

    try:
        # 1. Crash after step 3: the checkpoint is at 2, step 3's four groups are pending, unacked.
        learner = start()
        wait_for_learner(  # step 3's eval is the last thing it does before it waits for version-3 groups
            lambda: metric_steps(tmp_path) == ([1, 2, 3], [0, 3]), "step 3 and its eval", learner, tmp_path
        )
        learner.kill()
        learner.wait(timeout=10)
        assert load_checkpoint(checkpoint_path(tmp_path)).policy_version == 2
        assert pending_count(bus, keys) == 4

        # 2. Restart: it resumes at 2, republishes 2, retrains step 3 on the re-read groups, then
        # trains on the groups made for the new versions 2 and 3 (lag 1); stop it with SIGTERM while
        # it starves at version 5.
        worker.produce_below_version = 4
        learner = start()
        wait_for_learner(lambda: metric_steps(tmp_path)[0] == [1, 2, 3, 4, 5], "step 5", learner, tmp_path)
        steps, _ = read_metrics(tmp_path)
        assert steps[2]["num_replayed_groups"] == 4  # step 3 again, on the groups left pending by the crash
        assert worker.versions_seen == [0, 1, 2, 2, 3]  # version 2 announced again after the restart
        assert [s["staleness_histogram"] for s in steps[3:]] == [{"1": 4}, {"1": 4}]
        # step 5 due no eval and no checkpoint: it is waiting for version-5 groups (or about to); the
        # signal only sets a flag that ends that wait, so it stops the same way from either place
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 0
        assert load_checkpoint(checkpoint_path(tmp_path)).policy_version == 5
        stopped = LearnerSummary.model_validate_json((tmp_path / "learner_summary.json").read_text())
        assert (stopped.finished, stopped.stop_reason, stopped.policy_version) == (False, "signal", 5)
        assert not (tmp_path / "model_final").exists()

        # 3. Restart once more: it finishes the run.
        worker.produce_below_version = 1_000_000
        learner = start()
        assert learner.wait(timeout=60) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)
        if learner.poll() is None:
            learner.kill()

    steps, evals = read_metrics(tmp_path)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]  # one history: lines past a checkpoint were redone
    assert [e["eval_step"] for e in evals] == [0, 3, 6]
    assert max(s["max_staleness"] for s in steps) <= run.schedule.staleness_bound
    summary = LearnerSummary.model_validate_json((tmp_path / "learner_summary.json").read_text())
    assert (summary.finished, summary.policy_version, summary.totals.num_restarts) == (True, 6, 2)
    assert summary.totals.num_replayed_groups >= 4
    assert pending_count(bus, keys) == 0
    assert bus.get_state(LEARNER_STATE).status == "done"
    assert (tmp_path / "model_final" / "config.json").exists()


def test_the_learner_rides_out_a_redis_restart_without_losing_admitted_groups(
    tiny_policy_dir: Path, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path / "redis").start()  # private: this test takes it down
    keys = RunKeys("redis-restart")
    bus = StreamBus(connect(server.url), keys, service="test")
    run = small_run(keys.run_id, num_steps=6)
    settings = learner_settings(server.url, tmp_path / "run", tiny_policy_dir)
    worker = StandInWorker(bus, run, tiny_policy_dir)

    def restart_redis_after_step_2() -> None:
        wait_for(lambda: max(metric_steps(settings.run_dir)[0], default=0) >= 2, "step 2", timeout_s=60)
        server.stop()  # SIGTERM: Redis writes its AOF and exits; every client call now fails
        time.sleep(1.0)  # the outage itself (the fault under test), not a wait for anything
        server.start()  # same port, same data directory: the streams and the consumer group are back

    outage = threading.Thread(target=restart_redis_after_step_2, daemon=True)
    try:
        worker.start()
        outage.start()
        with Learner(run, settings, bus) as learner:
            summary = learner.run()
        outage.join(timeout=10)
        assert (summary.finished, summary.policy_version) == (True, 6)
        steps, _ = read_metrics(settings.run_dir)
        assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
        assert pending_count(bus, keys) == 0
    finally:
        worker.stop_event.set()
        worker.join(timeout=10)
        server.stop()


def test_a_learner_without_a_model_folder_fails_at_start_instead_of_building_one(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tmp_path: Path
) -> None:
    from shared.tokenization import ModelFolderError

    (tmp_path / "model").mkdir()  # a folder without config.json used to become a random char model
    settings = LearnerSettings(
        redis_url=redis_server.url, run_dir=tmp_path, signing_key=SIGNING_KEY_HEX, learner_port=0
    )
    with pytest.raises(ModelFolderError, match="no config.json"):
        Learner(small_run(keys.run_id, num_steps=1), settings, bus)
    assert not (tmp_path / "model" / "config.json").exists()


def test_a_learner_on_a_user_folder_pads_stops_and_signs_like_its_workers(
    bus: StreamBus, keys: RunKeys, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A Llama-style folder (no pad token, a BOS, generation_config EOS list): the learner takes the
    workers' pad id and EOS set, evaluates, and signs the folder's fingerprint into its manifests."""
    from shared.tokenization import model_fingerprint
    from tests.hf_folders import CHAT_TEMPLATE, ENDOFTEXT, IM_END, build_folder

    folder = build_folder(
        tmp_path / "user_model",
        with_pad=False,
        with_bos=True,
        chat_template=CHAT_TEMPLATE,
        generation_eos_tokens=(ENDOFTEXT, IM_END),
    )
    settings = LearnerSettings(
        redis_url=redis_server.url, run_dir=tmp_path, model_dir=folder, signing_key=SIGNING_KEY_HEX, learner_port=0
    )
    learner = Learner(small_run(keys.run_id, num_steps=1), settings, bus)
    tokenizer = learner.tokenizer
    assert tokenizer.pad_token_id is None and learner.pad_token_id == tokenizer.eos_token_id
    engine = learner.evaluator.engine  # evaluation decodes with the workers' engine, so it stops where they do
    assert set(engine.eos_token_ids.tolist()) == {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)}
    assert learner.publisher.model_fingerprint == model_fingerprint(folder)
    learner.evaluate(wait=True)
    assert learner.totals.eval_accuracy_before is not None
    learner.evaluator.close()
