"""The policy being trained and every operation the learner's loop runs on it, on one process or sharded
over the ranks of a torchrun job (distributed.py: rank 0 leads, the others follow).

    train_step(batch)    one learner step (trainer.py) in the run's precision (precision.py: by default
                         float32 masters and optimizer state, bf16 compute), handed the model's log-prob
                         forward and the ranks its rows are dealt to (data_parallel.DataParallel); sharded:
                         every rank on its rows of the same batch
    weights()            a model with the full weights of the current version, to publish, evaluate,
                         audit and save: the policy itself on one process; rank 0's plain CPU replica
                         when sharded, refreshed by one gather per version (a parameter at a time)
    checkpoint_state()   (model, optimizer) state dicts, full tensors keyed by name: any world size resumes them;
                         a LoRA policy (one process, lora.py): the adapter and the optimizer's own state dict
    restore(...)         put them back (sharded: rank 0 reads them, every rank gets them)
    close()              sharded: the followers' loop returns

On rank 0 each sharded operation first sends its command (distributed.Command: Train, GatherWeights,
Checkpoint, Restore, Stop), so the followers (`follow`, one `obey` per command) run the same collective
at the same point.
"""

from __future__ import annotations

import copy
import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

import torch

from services.learner import data_parallel, lora, trainer
from services.learner.batch import TrainBatch
from services.learner.distributed import (
    Checkpoint,
    Command,
    GatherWeights,
    RankGroup,
    Restore,
    Stop,
    Train,
    full_state_dicts,
    gather_full_weights,
    load_full_state_dicts,
    shard_model,
)
from services.learner.grpo import token_logprobs
from services.learner.precision import resolve_precision, warn_if_updates_are_lost
from shared.config import RunConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


class Policy:
    def __init__(self, model_dir: Path, run: RunConfig, ranks: RankGroup | None = None) -> None:
        self.run = run
        self.ranks = ranks or RankGroup()
        self.precision = resolve_precision(run.learner, model_dir)
        # LoRA: the frozen base needs no master copy, so mixed precision holds it in the compute dtype and
        # only the adapters (the trained parameters) in float32 (lora.py)
        base_dtype = self.precision.compute_dtype if run.lora.enabled else self.precision.param_dtype
        self.model, self.tokenizer = trainer.load_policy(model_dir, run.learner, dtype=base_dtype)
        if run.lora.enabled:  # adapters on the frozen base (lora.py: refused when sharded); versions are the adapter
            self.model = lora.apply_lora(
                self.model, run.lora, adapter_dtype=self.precision.param_dtype, world_size=self.ranks.world_size
            )
        # what the step runs on: the model's log-prob forward, and the ranks its rows are dealt to
        self.forward: data_parallel.LogprobsForward = functools.partial(token_logprobs, self.model)
        self.parallel: data_parallel.DataParallel = data_parallel.ONE_PROCESS
        self.replica: PreTrainedModel | None = None  # rank 0 of a sharded policy: the full weights, on CPU
        if self.ranks.is_sharded:
            if self.ranks.is_leader:
                self.replica = copy.deepcopy(self.model).requires_grad_(False)
                torch.nn.Module.to(self.replica, "cpu")
            self.forward = shard_model(self.model, self.ranks, self.precision)
            self.parallel = self.ranks
            log.info("policy sharded over %d ranks (FSDP2: each decoder layer, then the root)", self.ranks.world_size)
        self.optimizer = trainer.make_optimizer(self.model, run.grpo)
        warn_if_updates_are_lost(self.precision, self.model, run.grpo.learning_rate)
        self._replica_fresh = True  # the replica holds the current weights (both start from the folder)

    @property
    def config(self) -> Any:
        return self.model.config

    def train_step(self, batch: TrainBatch, group_sizes: list[int], shuffle_seed: int) -> trainer.StepResult:
        command = Train(batch, group_sizes, shuffle_seed)
        self.ranks.send(command)
        return self._train_step(command)

    def weights(self) -> PreTrainedModel:
        """The full weights of the current version (rank 0 only, when sharded)."""
        if self.replica is None:
            return self.model
        if not self._replica_fresh:
            self.ranks.send(GatherWeights())
            gather_full_weights(self.model, self.replica)
            self._replica_fresh = True
        return self.replica

    def checkpoint_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        if self.run.lora.enabled:  # one process: the adapter (the base is the model folder), the optimizer as is
            return lora.adapter_state(self.model), self.optimizer.state_dict()
        self.ranks.send(Checkpoint())
        return full_state_dicts(self.model, self.optimizer)

    def restore(self, model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> None:
        if self.run.lora.enabled:
            lora.restore_adapter(self.model, model_state)  # ValueError: not this run's adapter
            self.optimizer.load_state_dict(optimizer_state)
            return
        self.ranks.send(Restore())
        load_full_state_dicts(self.model, self.optimizer, model_state, optimizer_state, self.ranks)
        self._replica_fresh = self.replica is None

    def close(self) -> None:
        """Rank 0: release the followers (they return from `follow`)."""
        self.ranks.send(Stop())

    def follow(self) -> None:
        """A follower rank: run the collectives rank 0 announces until it sends Stop."""
        while self.obey(self.ranks.receive()):
            pass

    def obey(self, command: Command) -> bool:
        """A follower: this rank's part of the collective `command` names, the part rank 0 runs too; False at
        Stop. Anything that is not a Command raises (and a Command without its case fails mypy)."""
        match command:
            case Train():
                self._train_step(command)
            case GatherWeights():
                gather_full_weights(self.model, None)
            case Checkpoint():
                full_state_dicts(self.model, self.optimizer)
            case Restore():
                load_full_state_dicts(self.model, self.optimizer, {}, {}, self.ranks)
            case Stop():
                return False
            case _:
                assert_never(command)
        return True

    def _train_step(self, command: Train) -> trainer.StepResult:
        with self.precision.compute():  # mixed: bf16 matmuls on the float32 masters
            result = trainer.train_step(
                self.model,
                self.optimizer,
                command.batch,
                self.run.grpo,
                self.run.learner,
                group_sizes=command.group_sizes,
                shuffle_seed=command.shuffle_seed,
                forward=self.forward,
                parallel=self.parallel,
            )
        self._replica_fresh = self.replica is None
        return result
