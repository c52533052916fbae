"""Held-out evaluation off the training loop: one eval thread with its own inference engine.

    learner loop (main thread)                       eval thread
    submit(model, t, max_wait_s)
        wait until the thread is idle, at most max_wait_s; else skip this eval (Handoff.accepted False)
        snapshot = detached clones of the weights     (the only stall when the thread is idle)
        hand it over ------------------------------->  engine.load_state_dict(snapshot, t)
    ... keeps training ...                              greedy decode of the held-out prompts (KV cache)
                                                        score with the task's verifier (its own process)
                                                        on_record(EvalRecord): metrics.jsonl line
    take_finished() <------------------------------- the record, for the learner's totals

The engine is the rollout workers' TorchEngine (engines/torch_engine.py) on the learner's device and
dtype, built from the same model folder: evaluation encodes, decodes and stops exactly as sampling does.
Only the eval thread touches it after construction; the snapshot is the handoff, so training can change
its own weights while an evaluation runs. At most one evaluation is in flight.

The verifier runs in a child process under a hard timeout (shared/verifier_pool.py, one child started with
the Evaluator and stopped by close): math-verify and user verifiers can hang on a model's output, and a
thread cannot be stopped. A prompt whose verifier times out counts as wrong (services/learner/evaluate.py).

Error policy: an exception in the eval thread is kept and re-raised on the learner's thread as
EvalFailedError (chained to the original) at the next submit, wait_idle or take_finished: the learner
exits non-zero and restarts from its checkpoint. Evaluation failing is a bug or an out-of-memory, never
something to train past silently.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.torch_engine import TorchEngine
from services.learner.evaluate import describe_eval, evaluate_greedy
from services.learner.lora import merged_state
from shared.config import TaskConfig
from shared.run_records import EvalRecord
from shared.tasks import TaskAdapter
from shared.verifier_pool import VerifierPool

log = logging.getLogger(__name__)


class EvalFailedError(RuntimeError):
    """The eval thread raised; its exception is the __cause__."""


@dataclass(frozen=True)
class Handoff:
    accepted: bool  # False: the previous evaluation was still running after max_wait_s; this one is skipped
    stall_s: float  # how long submit blocked the caller (waiting for the thread + snapshot)


@dataclass(frozen=True)
class EvalJob:
    policy_version: int
    weights: dict[str, torch.Tensor]  # detached clones, owned by the eval thread from the handoff on
    stall_s: float


class Evaluator:
    """Evaluates snapshots of the policy on a background thread; one at a time, in submission order."""

    def __init__(
        self,
        engine: TorchEngine,
        task: TaskAdapter,
        *,
        max_new_tokens: int,
        on_record: Callable[[EvalRecord], None],
        wall_s: Callable[[], float],
        verifier: VerifierPool | None = None,
    ) -> None:
        """`verifier`: started here, used by the eval thread only, closed by close(). None: the task's
        score runs on the eval thread itself (tests whose verifier is a threading gate)."""
        self.engine = engine
        self.task = task
        self.verifier = verifier.start() if verifier is not None else None
        self.max_new_tokens = max_new_tokens
        self.on_record = on_record  # called on the eval thread: must be thread-safe (MetricsLog.append is)
        self.wall_s = wall_s
        self._jobs: queue.Queue[EvalJob | None] = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._finished: list[EvalRecord] = []  # done since the last take_finished
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="evaluator", daemon=True)
        self._thread.start()

    @classmethod
    def for_model_folder(
        cls,
        model_dir: Path,
        device: torch.device,
        dtype: torch.dtype,
        task: TaskAdapter,
        *,
        task_config: TaskConfig,
        verifier_timeout_s: float,
        max_new_tokens: int,
        on_record: Callable[[EvalRecord], None],
        wall_s: Callable[[], float],
    ) -> Evaluator:
        """The learner's evaluator: the workers' engine, and a verifier child built from `task_config`."""
        engine = TorchEngine(model_dir, device=device, dtype=dtype)
        verifier = VerifierPool(task_config, verifier_timeout_s)
        return cls(engine, task, max_new_tokens=max_new_tokens, on_record=on_record, wall_s=wall_s, verifier=verifier)

    # the learner's thread
    def submit(self, model: torch.nn.Module, policy_version: int, *, max_wait_s: float | None) -> Handoff:
        """Evaluate `model`'s current weights as `policy_version`. Waits at most `max_wait_s` (None: as
        long as it takes) for the previous evaluation; if it is still running then, skips this one."""
        started_s = time.perf_counter()
        self.raise_if_failed()
        if not self._idle.wait(max_wait_s):
            return Handoff(accepted=False, stall_s=time.perf_counter() - started_s)
        self.raise_if_failed()
        with torch.no_grad():
            # a LoRA model's adapters merged in: the engine holds plain weights (services/learner/lora.py)
            weights = {name: tensor.detach().clone() for name, tensor in merged_state(model).items()}
        stall_s = time.perf_counter() - started_s
        self._idle.clear()
        self._jobs.put(EvalJob(policy_version, weights, stall_s))
        return Handoff(accepted=True, stall_s=stall_s)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no evaluation is in flight (True) or `timeout_s` passed (False); raises EvalFailedError."""
        idle = self._idle.wait(timeout_s)
        self.raise_if_failed()
        return idle

    def take_finished(self) -> list[EvalRecord]:
        """The records of evaluations finished since the last call, in order; raises EvalFailedError."""
        self.raise_if_failed()
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise EvalFailedError(f"held-out evaluation failed: {self._error!r}") from self._error

    def close(self) -> None:
        """Stop the thread after the evaluation in flight (if any), then the verifier's process."""
        self._jobs.put(None)
        self._thread.join()
        if self.verifier is not None:
            self.verifier.close()

    # the eval thread
    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                record = self._evaluate(job)
                self.on_record(record)
                with self._lock:
                    self._finished.append(record)
            except BaseException as exc:  # kept for the learner's thread: see the module's error policy
                log.exception("evaluation of version %d failed", job.policy_version)
                self._error = exc
            finally:
                del job  # free the snapshot before signalling idle
                self._idle.set()

    def _evaluate(self, job: EvalJob) -> EvalRecord:
        started_s = time.perf_counter()
        self.engine.load_state_dict(job.weights, job.policy_version)
        result = evaluate_greedy(self.engine, self.task, max_new_tokens=self.max_new_tokens, verifier=self.verifier)
        record = result.record(
            self.task,
            eval_step=job.policy_version,
            eval_s=time.perf_counter() - started_s,
            eval_stall_s=job.stall_s,
            wall_s=self.wall_s(),
            evaluated_by="learner",
        )
        log.info(
            "eval at version %d: %s (%.2fs in the eval thread, stalled training %.3fs)",
            job.policy_version,
            describe_eval(record),
            record.eval_s,
            job.stall_s,
        )
        return record
