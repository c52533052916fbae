"""The learner service: scored groups in, GRPO steps, policy versions out (docs/design.md: planes, versions and the admission rule, the weight path).

    resume_or_start          checkpoint -> model, optimizer, version t, counters; else the initial policy
    publish_weights          version t servable by the chunk server, then announced
    evaluate                 held-out greedy accuracy at step 0: by the rollout workers (worker_eval.py), else on the
                             eval thread (evaluator.py: no worker active, [learner] eval_on = "learner", multi-turn)
    until num_steps or max_wall_s (or SIGTERM):
        collect_batch        groups_per_step groups admitted at t (t - v <= S); drops counted, bad groups dead-lettered;
                             dynamic_sampling: flat groups (zero reward variance) skipped; each step's worth of
                             groups feeds the zero-variance alarm (zero_variance.py: a run that cannot learn says so);
                             pull mode: asks the data plane for them (BatchRequest), to be sampled with version t
        train_step           num_minibatches x ppo_epochs optimizer updates on the batch: t -> t + 1
        publish_if_due       every publish_every steps
        record_step          metrics.jsonl line, totals, LearnerState in Redis
        evaluate_if_due      every eval_every steps: request it from the workers (one step ahead), or hand a
                             weight snapshot to the eval thread (if the previous one still runs, wait at most
                             eval_max_stall_s, then skip); every step, take in the workers' finished evaluations
                             (never waiting) and, for one past its deadline, evaluate on the eval thread instead
        checkpoint_if_due    every checkpoint_every steps; then ack the groups it covers
    finish                   wait for the evals in flight (the workers' at most until their deadline), evaluate
                             the final weights (waiting for it),
                             checkpoint, model_final, learner_summary.json, status done

Ack discipline: a dropped or dead-lettered group is acked when decided; an admitted group stays
pending for the consumer "learner-0" until the checkpoint covering its step is on disk, so a crash
loses nothing: the restarted learner resumes at the checkpoint's version and re-reads those groups.

Totals across a restart: what the retaken steps redo (steps, groups trained, train/idle seconds, the
staleness histogram) continues from the checkpoint, so each trained group counts once; what is final
when decided (drops, dead letters: counted in Redis with their ack) and the run's clock (the last
LearnerState's wall_s) continue from where the killed process left them.

Under torchrun with G > 1 processes this object lives on rank 0 only; every operation on the weights
goes through `self.policy` (policy.py), which brings the other ranks along (distributed.py).
"""

from __future__ import annotations

import logging
import shutil
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from services.learner import lora, trainer
from services.learner.batch import CollectedBatch, TrainBatch, lag_counts, tensorize, token_lags
from services.learner.checkpoint import capture, checkpoint_path, load_checkpoint, restore_rng, save_checkpoint
from services.learner.distributed import RankGroup
from services.learner.metrics import MetricsLog, write_summary
from services.learner.mismatch import engine_mismatch
from services.learner.model_init import build_initial_policy
from services.learner.parts import build_collector, build_evaluator, build_weight_channel, load_policy
from services.learner.precision import set_config_dtype
from services.learner.publish import publication_state
from services.learner.settings import LearnerSettings
from services.learner.trust_monitor import TrustMonitor
from services.learner.worker_eval import WorkerEvals, add_to_totals
from services.learner.zero_variance import ZeroVarianceAlarm
from shared.bus import StreamBus
from shared.config import RunConfig
from shared.keys import RunKeys
from shared.messages import BatchRequest, FlatGroups, LearnerState, LearnerStatus, StepDiagnostics, WorkerMismatch
from shared.retry import call_with_retry
from shared.run_records import LearnerSummary, RunTotals, StepRecord, read_metrics
from shared.streams import BATCH_REQUEST, LEARNER_STATE, SCORED
from shared.tasks import build_task
from shared.tokenization import check_model_folder, model_fingerprint, pad_token_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedStep:
    """What one learner step used and produced; becomes its StepRecord once publishing is timed."""

    batch: CollectedBatch
    tensors: TrainBatch
    result: trainer.StepResult


class Learner:
    """The learner (its rank 0 when sharded): owns the policy, the `scored` consumer and the chunk server."""

    def __init__(
        self, run: RunConfig, settings: LearnerSettings, bus: StreamBus, ranks: RankGroup | None = None
    ) -> None:
        self.config = run
        self.settings = settings
        self.bus = bus
        self.keys = RunKeys(run.run_id)
        self.run_dir = settings.run_dir
        self.task = build_task(run.task)

        # the policy: its folder checked (the demo's tiny model built there), loaded on every rank
        self.model_dir = self.ensure_initial_policy()
        self.policy = load_policy(self.model_dir, run, ranks or RankGroup())
        self.tokenizer = self.policy.tokenizer
        # One pad id with the workers (shared.tokenization): a tokenizer without a pad token pads with EOS.
        # (Evaluation stops where sampling does: it decodes with the workers' engine, see evaluator.py.)
        self.pad_token_id = pad_token_id(self.tokenizer)

        # the run's progress: version t, the totals, and what the last step left for LearnerState
        self.version = 0
        self.totals = RunTotals()
        self.uncheckpointed_ids: list[str] = []  # admitted groups trained on since the last checkpoint
        self.checkpointed_version = -1
        self.last_train_s = 0.0
        self.last_mismatch: dict[str, WorkerMismatch] = {}  # the last step's, by worker (into LearnerState)
        self.last_diagnostics: StepDiagnostics | None = None  # the last step's (into LearnerState)
        self.zero_variance = ZeroVarianceAlarm.from_config(run.grpo)  # warns when groups stay flat (no gradient)
        self.zero_variance_logged: str | None = None  # the warning logged while this step's batch was collected
        self.last_window = FlatGroups()  # the last step's worth of groups decided (into LearnerState)
        self.state: LearnerState | None = None  # the latest state written (read by /metrics)
        self.stop_requested = threading.Event()
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")

        # the parts (parts.py): groups in, versions out, evaluations
        self.collector = build_collector(run, settings, bus, self.keys, self.policy)
        channel = build_weight_channel(run, settings, bus, self.keys, self.model_dir, self.policy)
        self.store, self.server, self.publisher = channel.store, channel.server, channel.publisher
        self._started_s = time.monotonic()
        self._wall_offset_s = 0.0  # run time before this process (restored from the checkpoint)
        self.trust = TrustMonitor(
            run.trust, self.policy.weights(), bus, self.run_dir / "trust.jsonl", compute=self.policy.precision.compute
        )
        self.evaluator = build_evaluator(run, self.model_dir, self.policy, self.task, self.metrics, self.wall_s)
        # held-out evaluation as eval tasks for the rollout workers; the evaluator above is its fallback
        self.worker_evals = WorkerEvals(bus, run, self.task, deadline_s=run.broadcast.version_timeout_s)

    # lifecycle: the chunk server lives as long as the learner
    def __enter__(self) -> Learner:
        self.server.start()
        log.info("chunk server on %s, announced as %s", self.server.url, self.publisher.public_url)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:  # sharded: the other ranks return (after an error torchrun stops them: a stop
            self.policy.close()  # sent after a failed collective would wait forever)
        self.evaluator.close()
        self.server.stop()
        self.publisher.close()
        self.store.spares.discard()  # the next version's file, faulted in ahead: not needed any more

    def request_stop(self) -> None:
        """Finish the step in progress, checkpoint, and return from run() (signal handlers call this)."""
        self.stop_requested.set()

    # the table of contents
    def run(self) -> LearnerSummary:
        self.resume_or_start()
        self.publish_weights()
        if self.totals.eval_accuracy_before is None:
            self.evaluate()
        self.write_state("training")
        while self.stop_reason() is None:
            batch = self.collect_batch()
            if batch is None:
                break
            trained = self.train_step(batch)
            publish_s = self.publish_if_due()
            self.record_step(trained, publish_s)
            self.evaluate_if_due()
            self.checkpoint_if_due()
        return self.finish(self.stop_reason() or "signal")

    # steps
    def resume_or_start(self) -> None:
        self.collector.ensure_group()
        wall_s_before_restart = self.wall_s_before_restart()  # read before this process writes its state
        checkpoint = load_checkpoint(checkpoint_path(self.run_dir))
        if checkpoint is None:
            log.info("no checkpoint in %s: starting at version 0", self.run_dir)
            self.metrics.truncate_after(-1)  # lines of an attempt that never checkpointed describe nothing
        else:
            self.policy.restore(checkpoint.model_state, checkpoint.optimizer_state)
            restore_rng(checkpoint)
            self.version = self.checkpointed_version = checkpoint.policy_version
            self.totals = RunTotals.model_validate(checkpoint.counters)
            self.totals.num_restarts += 1
            self._wall_offset_s = max(self.totals.wall_s, wall_s_before_restart)
            # A crash between saving and acking: these are trained on already, never again.
            self.ack(checkpoint.covered_message_ids)
            num_lines = self.metrics.truncate_after(self.version)
            self.add_evals_finished_after_the_checkpoint()
            log.info("resumed at version %d (%d metrics lines past it dropped)", self.version, num_lines)
        # Drops and dead letters before a crash were acked for good: Redis has counted every one.
        self.collector.restore_decisions(self.totals.num_dropped, self.totals.num_dead_lettered)
        self.collector.stale_token_lags.update({int(lag): n for lag, n in self.totals.stale_token_lags.items()})
        self.write_state("starting")  # only now: the state it writes carries the restored totals
        num_pending = self.collector.load_own_pending()
        log.info("%d scored groups admitted before a restart and never acked: decided again first", num_pending)

    def publish_weights(self) -> float:
        started_s = time.perf_counter()
        weights = self.policy.weights()  # sharded: gathered to rank 0 here, a parameter at a time
        gather_s = time.perf_counter() - started_s
        publish_s = gather_s + self.publisher.publish(publication_state(weights), self.version).publish_s
        self.trust.on_publish(self.version, weights)
        return publish_s

    def collect_batch(self) -> CollectedBatch | None:
        started_s = time.monotonic()
        self.trust.refresh_quarantine(self.collector)
        batch = self.collector.collect(
            self.version,
            should_stop=lambda: self.stop_reason() is not None,
            on_wanted=self.request_groups if self.config.schedule.mode == "pull" else None,
            on_window=self.watch_zero_variance,
        )
        if batch is None:  # stopped while waiting: that wait was idle time too
            self.totals.idle_s += time.monotonic() - started_s
        return batch

    def request_groups(self, num_groups_wanted: int, num_groups_skipped: int) -> None:
        """Pull mode: ask the data plane for the groups this step still needs, sampled with this version
        (and say how many dynamic sampling skipped: the feed replaces those beyond its one batch)."""
        request = BatchRequest(
            run_id=self.config.run_id,
            policy_version=self.version,
            num_groups_wanted=num_groups_wanted,
            num_groups_skipped=num_groups_skipped,
        )
        call_with_retry(lambda: self.bus.put_state(BATCH_REQUEST, request), "write batch request")

    def watch_zero_variance(self, flat: FlatGroups) -> None:
        """A step's worth of groups decided (the collector's window): feed the zero-variance alarm, log its
        warning when one is due, and write the state (users see both there, also while dynamic sampling
        skips every group and no step comes)."""
        warning = self.zero_variance.observe(flat)
        if warning is not None:
            log.warning("%s", warning)
            self.zero_variance_logged = warning
        self.last_window = flat
        self.write_state("training")

    def train_step(self, batch: CollectedBatch) -> TrainedStep:
        groups = [admitted.group for admitted in batch.groups]
        oldest_trained_version = self.collector.oldest_trained_version(self.version)
        if oldest_trained_version is not None:
            self.collector.note_masked(batch.groups, self.version)
        tensors = tensorize(
            groups, self.pad_token_id, self.config.grpo.normalize_advantage_by_std, oldest_trained_version
        )
        result = self.policy.train_step(
            tensors,
            group_sizes=[group.rollout.num_samples for group in groups],
            shuffle_seed=self.version,  # a step retaken after a restart deals its minibatches the same way
        )
        self.trust.observe_step(self.version, batch.groups, tensors, result.logprobs)
        self.version += 1
        self.uncheckpointed_ids.extend(batch.message_ids)
        return TrainedStep(batch=batch, tensors=tensors, result=result)

    def publish_if_due(self) -> float:
        is_last = self.version >= self.config.schedule.num_steps
        if self.version % self.config.schedule.publish_every == 0 or is_last:
            return self.publish_weights()
        return 0.0

    def record_step(self, trained: TrainedStep, publish_s: float) -> None:
        batch, tensors, result = trained.batch, trained.tensors, trained.result
        lags = Counter(admitted.staleness for admitted in batch.groups)
        rewards = tensors.rewards.tolist()
        record = StepRecord(
            **result.diagnostics.model_dump(),  # loss, clip_fraction, ess_fraction, ...: StepRecord extends them
            step=self.version,
            policy_version=self.version,
            train_s=result.train_s,
            idle_s=batch.idle_s,
            publish_s=publish_s,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            staleness_histogram={str(lag): count for lag, count in sorted(lags.items())},
            token_staleness_histogram=token_lags(
                batch.groups, self.version - 1, max_lag=self.config.schedule.staleness_bound
            ),
            max_staleness=max(lags),
            num_dropped=dict(self.collector.num_dropped),
            stale_token_lags=lag_counts(self.collector.stale_token_lags),
            num_dead_lettered=self.collector.num_dead_lettered,
            num_groups=len(batch.groups),
            num_samples=tensors.num_samples,
            num_tokens=tensors.num_tokens,
            num_replayed_groups=sum(1 for admitted in batch.groups if admitted.replayed),
            wall_s=self.wall_s(),
            mismatch_by_worker=engine_mismatch(batch.groups, tensors, result.logprobs),
            flat_groups=batch.flat_groups,
            zero_variance_warning=self.zero_variance_logged,
        )
        self.zero_variance_logged = None
        self.totals.add_step(record)
        self.metrics.append(record)
        self.last_train_s = record.train_s
        self.last_mismatch = record.mismatch_by_worker
        self.last_diagnostics = result.diagnostics
        self.write_state("training")
        flat = record.flat_groups
        log.info(
            "step %d/%d reward %.3f flat %.2f (%d at 0, %d at 1) train %.3fs idle %.3fs publish %.3fs lag %s "
            "dropped %s clip %.3f ess %.3f",
            record.step,
            self.config.schedule.num_steps,
            record.reward_mean,
            flat.zero_variance_fraction,
            flat.num_flat_at_zero,
            flat.num_flat_at_max,
            record.train_s,
            record.idle_s,
            record.publish_s,
            record.staleness_histogram,
            record.num_dropped or "{}",
            record.clip_fraction,
            record.ess_fraction,
        )

    def evaluate_if_due(self) -> None:
        """Every eval_every steps, evaluate; a step before an eval point (or the last step), ask the workers
        ahead, so that its eval tasks wait for them before the version does (worker_eval.py); every step, take
        in the workers' finished evaluations, never waiting."""
        schedule = self.config.schedule
        if self.version % schedule.eval_every == 0:
            self.evaluate()
        ahead = self.version + 1
        if (ahead % schedule.eval_every == 0 or ahead == schedule.num_steps) and not self.worker_evals.is_open(ahead):
            published = ahead % schedule.publish_every == 0 or ahead >= schedule.num_steps  # publish_if_due's rule
            if self.worker_evals.route(published=published) is None:
                self.worker_evals.request(ahead, reached=False)
        self.worker_evals.reached(self.version)
        self.add_worker_evals()

    def evaluate(self, *, wait: bool = False) -> None:
        """Evaluate the current weights: by the workers (one request; the record when their scores come), else on
        the eval thread (evaluate_on_learner). With `wait`, this evaluation and those in flight are waited for
        (the final eval: "after" must be the final weights' accuracy)."""
        if not self.worker_evals.covers(self.version):
            reason = self.worker_evals.route(published=self.publisher.published_version == self.version)
            if reason is None:
                self.worker_evals.request(self.version, reached=True)
            else:
                log.info("eval at version %d on the learner: %s", self.version, reason)
                self.evaluate_on_learner(wait=wait)
        self.worker_evals.reached(self.version)
        if wait:
            self.wait_for_evals()

    def evaluate_on_learner(self, *, wait: bool = False) -> None:
        """Hand the current weights to the eval thread; its record reaches metrics.jsonl when it is done and
        the totals at the next sync_totals. With `wait`, the previous eval is waited for however long it takes."""
        max_wait_s = None if wait else self.config.learner.eval_max_stall_s
        handoff = self.evaluator.submit(self.policy.weights(), self.version, max_wait_s=max_wait_s)
        self.totals.eval_stall_s += handoff.stall_s
        if handoff.accepted:
            self.worker_evals.last_learner_version = self.version
        else:
            self.totals.num_evals_skipped += 1
            log.warning(
                "eval at version %d skipped: the previous one still runs after %.1fs (eval_max_stall_s)",
                self.version,
                handoff.stall_s,
            )

    def add_worker_evals(self) -> None:
        """The workers' finished evaluations: into metrics.jsonl now, into the totals once the eval thread is idle
        (its older record, synced later, would otherwise set the totals back); one past its deadline: the eval
        thread evaluates the current weights instead."""
        for record in self.worker_evals.take_finished(self.wall_s()):
            self.metrics.append(record)
        self.fall_back(self.worker_evals.take_overdue())
        if self.worker_evals.unsynced and self.evaluator.wait_idle(0):
            self.sync_totals()
            for record in self.worker_evals.take_unsynced():
                add_to_totals(self.totals, record)

    def fall_back(self, overdue: list[int], *, wait: bool = False) -> None:
        """The workers did not evaluate `overdue` in time: the eval thread evaluates the current weights (unless
        they are evaluated already, or requested)."""
        if not overdue:
            return
        covered = self.worker_evals.covers(self.version)
        log.warning(
            "the workers did not evaluate version(s) %s within %.0fs: %s",
            overdue,
            self.worker_evals.deadline_s,
            f"version {self.version} is evaluated anyway" if covered else f"evaluating version {self.version} here",
        )
        if not covered:
            self.evaluate_on_learner(wait=wait)

    def wait_for_evals(self, *, workers: bool = True) -> None:
        """Block until no evaluation is in flight and its record is in the totals: the eval thread's, and with
        `workers` the workers' of versions up to the current one, each at most until its deadline (past it, the
        eval thread evaluates the current weights, waited for too)."""
        if workers:
            self.worker_evals.reached(self.version)
            records, overdue = self.worker_evals.wait(self.version, self.wall_s)
            for record in records:
                self.metrics.append(record)
            self.fall_back(overdue, wait=True)
        self.evaluator.wait_idle()
        self.sync_totals()
        for record in self.worker_evals.take_unsynced():
            add_to_totals(self.totals, record)

    def checkpoint_if_due(self) -> None:
        if self.version % self.config.schedule.checkpoint_every == 0:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Save, then ack the groups the checkpoint covers (never before: they would be lost in a crash)."""
        started_s = time.perf_counter()
        self.sync_totals()
        model_state, optimizer_state = self.policy.checkpoint_state()
        snapshot = capture(
            model_state, optimizer_state, self.version, self.totals.model_dump(), self.uncheckpointed_ids
        )
        save_checkpoint(checkpoint_path(self.run_dir), snapshot)
        self.ack(self.uncheckpointed_ids)
        self.collector.release(self.uncheckpointed_ids)
        self.uncheckpointed_ids = []
        self.checkpointed_version = self.version
        self.totals.checkpoint_s += time.perf_counter() - started_s

    def finish(self, stop_reason: str) -> LearnerSummary:
        finished = stop_reason != "signal"
        # also on a signal: the eval thread's in flight lands in this checkpoint's totals (not the workers': no wait)
        self.wait_for_evals(workers=finished)
        if finished and self.totals.eval_step_last != self.version:
            self.evaluate(wait=True)
        if self.checkpointed_version != self.version or self.uncheckpointed_ids:
            self.checkpoint()
        model_final_dir = self.save_final_model() if finished else None
        summary = self.summarize(stop_reason, finished, model_final_dir)
        write_summary(self.run_dir / "learner_summary.json", summary)
        # On a signal the run is not over (a restart continues it): the status stays "training".
        self.write_state("done" if finished else "training")
        log.info(
            "stopped (%s) at version %d after %.1fs, busy %.0f%%",
            stop_reason,
            self.version,
            summary.wall_s,
            100 * summary.busy_fraction,
        )
        return summary

    # helpers
    def stop_reason(self) -> str | None:
        if self.stop_requested.is_set():
            return "signal"
        if self.version >= self.config.schedule.num_steps:
            return "num_steps"
        if self.wall_s() > self.config.schedule.max_wall_s:
            return "max_wall_s"
        return None

    def add_evals_finished_after_the_checkpoint(self) -> None:
        """An eval in flight when the checkpoint was written finished later: its line is in metrics.jsonl
        (kept if it evaluated a version up to the checkpoint's) but not in the checkpoint's totals."""
        _, evals = read_metrics(self.metrics.path)
        for record in evals:
            if self.totals.eval_step_last is None or record.eval_step > self.totals.eval_step_last:
                self.totals.add_eval(record)

    def wall_s(self) -> float:
        return self._wall_offset_s + time.monotonic() - self._started_s

    def wall_s_before_restart(self) -> float:
        """The run time the previous learner process last reported (0.0 if none): the clock of a run
        does not go back to its checkpoint's when the learner is killed."""
        state = call_with_retry(lambda: self.bus.get_state(LEARNER_STATE), "read learner state")
        return state.wall_s if state is not None and state.run_id == self.config.run_id else 0.0

    def sync_totals(self) -> None:
        """Bring the counters kept elsewhere (drops in the collector, finished evals, the clock) into the totals."""
        for record in self.evaluator.take_finished():
            self.totals.add_eval(record)
        self.totals.wall_s = self.wall_s()
        self.totals.num_dropped = dict(self.collector.num_dropped)
        self.totals.stale_token_lags = lag_counts(self.collector.stale_token_lags)
        self.totals.num_dead_lettered = self.collector.num_dead_lettered

    def ack(self, message_ids: list[str]) -> None:
        call_with_retry(lambda: self.bus.ack(SCORED, message_ids), "ack trained groups")

    def ensure_initial_policy(self) -> Path:
        """The policy folder, checked; the demo's tiny model is built only when the run file asks
        (`[model] init = "tiny-random"`): a wrong path is an error, never a silent random model."""
        model_dir = self.settings.resolved_model_dir(self.config.model)
        if self.config.model.init == "tiny-random" and not (model_dir / "model.safetensors").exists():
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # a progress bar per save is noise in a service log
            log.info("no initial policy in %s: building the tiny-random one", model_dir)
            build_initial_policy(self.config.model, self.task.alphabet, model_dir)
        check_model_folder(model_dir)
        log.info("policy folder %s, fingerprint %s", model_dir, model_fingerprint(model_dir)[:12])
        return model_dir

    def save_final_model(self) -> Path:
        out_dir = self.run_dir / "model_final"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        # a LoRA model is saved merged: model_final is a plain HF folder either way, in the dtype the
        # versions were published in (a mixed-precision learner's float32 masters, rounded)
        weights = self.policy.weights()
        dtype = self.policy.precision.publish_dtype
        state = {name: tensor.to(dtype) for name, tensor in lora.merged_state(weights).items()}
        weights.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
        set_config_dtype(out_dir, dtype)
        self.tokenizer.save_pretrained(out_dir)
        return out_dir

    def summarize(self, stop_reason: str, finished: bool, model_final_dir: Path | None) -> LearnerSummary:
        self.sync_totals()
        totals = self.totals
        return LearnerSummary(
            run_id=self.config.run_id,
            finished=finished,
            stop_reason=stop_reason,
            policy_version=self.version,
            num_steps=totals.num_steps,
            staleness_bound=self.config.schedule.staleness_bound,
            wall_s=totals.wall_s,
            s_per_step=totals.wall_s / max(totals.num_steps, 1),
            train_s_per_step=totals.train_s / max(totals.num_steps, 1),
            busy_fraction=totals.busy_fraction,
            totals=totals,
            eval_accuracy_before=totals.eval_accuracy_before,
            eval_accuracy_after=totals.eval_accuracy_last,
            reward_mean_first=totals.reward_mean_first,
            reward_mean_last=totals.reward_mean_last,
            max_trained_staleness=totals.max_trained_staleness,
            num_dropped=totals.num_dropped,
            model_final_dir=str(model_final_dir) if model_final_dir else None,
        )

    def write_state(self, status: LearnerStatus) -> None:
        state = LearnerState(
            run_id=self.config.run_id,
            status=status,
            learner_version=self.version,
            published_version=self.publisher.published_version,
            staleness_bound=self.config.schedule.staleness_bound,
            num_steps_target=self.config.schedule.num_steps,
            num_dropped=dict(self.collector.num_dropped),
            last_reward_mean=self.totals.reward_mean_last or 0.0,
            last_train_s=self.last_train_s,
            busy_fraction=self.totals.busy_fraction,
            num_steps_done=self.totals.num_steps,
            train_s_total=self.totals.train_s,
            idle_s_total=self.totals.idle_s,
            wall_s=self.wall_s(),
            staleness_histogram=dict(sorted(self.totals.staleness_histogram.items(), key=lambda item: int(item[0]))),
            token_staleness_histogram=dict(
                sorted(self.totals.token_staleness_histogram.items(), key=lambda item: int(item[0]))
            ),
            mismatch_by_worker=self.last_mismatch,
            last_step=self.last_diagnostics,
            num_groups_trained=self.totals.num_groups,
            num_dead_lettered=self.collector.num_dead_lettered,
            num_stale_tokens_dropped=sum(self.collector.stale_token_lags.values()),
            last_eval=self.totals.last_eval,
            num_restarts=self.totals.num_restarts,
            trust_by_worker=self.trust.trust_by_worker(),
            last_flat_groups=self.last_window,
            zero_variance_warning=self.zero_variance.warning,
        )
        self.state = state
        call_with_retry(lambda: self.bus.put_state(LEARNER_STATE, state), "write learner state")
