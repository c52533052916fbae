"""The learner over G processes under torchrun: FSDP2 sharding, the ranks' share of a batch, and the
commands rank 0 sends (docs/distributed_learner.md).

    python -m torch.distributed.run --nproc-per-node=G [--nnodes N --node-rank R --rdzv-endpoint H:P] -m services.learner

torchrun sets WORLD_SIZE, RANK and LOCAL_RANK; WORLD_SIZE > 1 makes `init_ranks` join the process group
(nccl with device cuda:LOCAL_RANK on a GPU, gloo on CPU; an explicit 1-D device mesh) and the policy is
sharded with `fully_shard`: every decoder layer, then the root (embeddings, final norm, LM head).

Rank 0 leads: it alone holds the Redis connection, decides admission, serves and announces weights,
evaluates and writes checkpoints and run files (services/learner/learner.py). The others follow
(`Policy.follow`): they hold no connection and bind no port, and run exactly the collectives rank 0
announces, in its order, so every rank makes the same forward/backward and gather calls (a rank that
skipped one would hang the others). Each announcement is one typed command (`Command`, below), one
broadcast:

    rank 0                                          ranks 1..G-1
    Policy.train_step(batch)  -- Train(batch, ...) -> the same step on their rows of the same batch
    Policy.weights()          -- GatherWeights() --> full_tensor() per parameter (rank 0 keeps them)
    Policy.checkpoint_state() -- Checkpoint() -----> full model and optimizer state (rank 0 keeps them)
    Policy.restore(state)     -- Restore() --------> rank 0's tensors, broadcast
    Policy.close()            -- Stop() -----------> return: the process exits 0

A follower handed anything else raises, and torchrun stops every rank.

`RankGroup` is the step's `data_parallel.DataParallel` when sharded. A batch is split by rows (`share`):
contiguous, balanced, every rank padded with zero-weight rows to the same count, so every rank runs the
same number of micro-batches. Each rank's loss is its tokens' sum over the GLOBAL token count, so the ranks'
gradients add up to the single process's; FSDP's reduce-scatter averages them, so each rank's backward is
scaled by G (`gradient_scale`, exact for a power of two). Not set_gradient_divide_factor(1): that reduces
with PREMUL_SUM, which gloo does not have.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import torch
import torch.distributed as dist
from pydantic import Field
from pydantic_settings import BaseSettings

from services.learner.batch import TrainBatch

if TYPE_CHECKING:
    from services.learner.data_parallel import LogprobsForward
    from services.learner.precision import Precision

log = logging.getLogger(__name__)

# The commands rank 0 sends the other ranks: produced by Policy's operations (policy.py) on rank 0,
# consumed by Policy.follow on every other rank; pickled whole by broadcast_object_list.


@dataclass(frozen=True)
class Train:
    """One learner step (trainer.train_step) on the same batch: each rank runs its rows of it."""

    batch: TrainBatch
    group_sizes: list[int]  # rows per group, in row order
    shuffle_seed: int


@dataclass(frozen=True)
class GatherWeights:
    """Every parameter in full, one at a time, into rank 0's replica (gather_full_weights)."""


@dataclass(frozen=True)
class Checkpoint:
    """The full model and optimizer state dicts, to rank 0 (full_state_dicts)."""


@dataclass(frozen=True)
class Restore:
    """Rank 0's model and optimizer state dicts, broadcast to every rank (load_full_state_dicts)."""


@dataclass(frozen=True)
class Stop:
    """The followers return from Policy.follow (their process exits 0)."""


Command: TypeAlias = Train | GatherWeights | Checkpoint | Restore | Stop


@dataclass(frozen=True)
class RankGroup:
    """This process's place among the learner's ranks. world_size 1: one process, no process group."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    mesh: Any = None  # torch.distributed.device_mesh.DeviceMesh when world_size > 1

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def is_sharded(self) -> bool:
        return self.world_size > 1

    # data_parallel.DataParallel: the policy hands a sharded step its RankGroup (one process: data_parallel.ONE_PROCESS)

    @property
    def gradient_scale(self) -> int:
        """FSDP's reduce-scatter averages the ranks' gradients; the step wants their sum."""
        return self.world_size

    def share(self, num_rows: int) -> tuple[torch.Tensor, int]:
        """This rank's rows of [0, num_rows): (indices (m,), number of real rows). Contiguous and balanced
        (sizes differ by at most one), padded by repeating row 0 to m = ceil(num_rows / world_size) rows
        (at least 1): the caller gives padding rows zero weight."""
        mine = torch.arange(num_rows).tensor_split(self.world_size)[self.rank]
        num_padded = max(1, -(-num_rows // self.world_size))
        padding = torch.zeros(num_padded - len(mine), dtype=torch.long)
        return torch.cat([mine, padding]), len(mine)

    def gather_rows(self, local: torch.Tensor, num_real: int, num_rows: int) -> torch.Tensor:
        """Every rank's real rows of `local` (m, ...) in rank order: the (num_rows, ...) whole, on every rank
        (a collective)."""
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local.contiguous())
        sizes = [len(part) for part in torch.arange(num_rows).tensor_split(self.world_size)]
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    def sum(self, *values: float) -> list[float]:
        """The sums over the ranks of each value (all-reduce), in float64."""
        device = torch.device("cuda", self.local_rank) if self.mesh.device_type == "cuda" else torch.device("cpu")
        summed = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        return summed.tolist()

    def send(self, command: Command) -> None:
        """Rank 0: tell the followers which collective comes next (no-op with one process)."""
        if self.is_sharded:
            dist.broadcast_object_list([command], src=0)

    def send_path(self, path: Path) -> None:
        """Rank 0: where the policy folder is, once it exists (the followers wait in `receive_path`)."""
        if self.is_sharded:
            dist.broadcast_object_list([str(path)], src=0)

    def receive_path(self) -> Path:
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0)
        return Path(message[0])

    def receive(self) -> Command:
        """A follower: the next command rank 0 sent (Policy.obey raises on anything else)."""
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0)
        return cast(Command, message[0])


class TorchrunEnvironment(BaseSettings):
    """What torchrun tells each process it starts (its own names, no RL_ prefix); one process without it."""

    world_size: int = Field(1, ge=1, description="WORLD_SIZE: processes in the group")
    local_rank: int = Field(0, ge=0, description="LOCAL_RANK: this process's index on its node (its GPU)")


def init_ranks(device_setting: str, timeout_s: float = 1800.0) -> RankGroup:
    """Join torchrun's process group when WORLD_SIZE > 1 (else one process): nccl on cuda:LOCAL_RANK
    when the run file's learner.device is cuda (or auto on a GPU machine), gloo on CPU. `timeout_s`:
    how long a collective may wait (a follower waits in one while rank 0 collects a batch)."""
    launcher = TorchrunEnvironment()
    if launcher.world_size == 1:
        return RankGroup()
    from torch.distributed.device_mesh import init_device_mesh

    world_size, local_rank = launcher.world_size, launcher.local_rank
    exit_with_launcher()
    cuda = device_setting == "cuda" or (device_setting == "auto" and torch.cuda.is_available())
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # the learner's "cuda" means this rank's GPU from here on
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    # An explicit mesh of the device type: a gloo default group on a CUDA box can crash full_tensor().
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world_size,))
    ranks = RankGroup(rank=dist.get_rank(), world_size=world_size, local_rank=local_rank, mesh=mesh)
    log.info("rank %d of %d (local %d), backend %s", ranks.rank, world_size, local_rank, dist.get_backend())
    return ranks


def exit_with_launcher(poll_s: float = 0.5) -> None:
    """Exit when torchrun does. torchrun starts every rank in a session of its own, so a kill -9 of its
    process group (cluster/processes.py, a supervisor) would leave the ranks running: rank 0 still
    consuming `scored` next to its replacement, the others waiting forever. A thread watches the parent."""
    launcher_pid = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher_pid:
            time.sleep(poll_s)
        log.error("the launcher (pid %d) is gone: exiting", launcher_pid)
        os._exit(1)  # as if killed with it: no checkpoint, nothing acked

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def teardown(ranks: RankGroup) -> None:
    if ranks.is_sharded and dist.is_initialized():
        dist.destroy_process_group()


LOGPROBS_METHOD = "fsdp_token_logprobs"  # the name shard_model registers the log-prob forward under


def shard_model(model: torch.nn.Module, ranks: RankGroup, precision: Precision | None = None) -> LogprobsForward:
    """FSDP2 in place: each decoder layer its own unit, then the root (whatever is left: embeddings, final
    norm, LM head, tied or not). Returns the log-prob forward the step must call: grpo.token_logprobs
    registered as a root forward. Mixed precision: the shards stay float32 (the masters the optimizer
    steps), each unit's parameters are gathered in the compute dtype, and gradients are reduced in float32
    (MixedPrecisionPolicy)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    mp_policy = MixedPrecisionPolicy()  # every dtype as the parameters'
    if precision is not None and precision.autocasts:
        mp_policy = MixedPrecisionPolicy(param_dtype=precision.compute_dtype, reduce_dtype=precision.param_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=ranks.mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=ranks.mesh, mp_policy=mp_policy)
    # The log-probs are computed from the decoder body and the LM head weight, not through HF's forward,
    # so FSDP must know that this is a forward of the root: FSDP registers a method of the module, so it is
    # set as an instance attribute, then wrapped with the root's pre/post-forward (gather the root's
    # parameters, register the backward hooks). The wrapped method is what the policy hands the step.
    setattr(model, LOGPROBS_METHOD, functools.partial(sharded_token_logprobs, model))
    register_fsdp_forward_method(model, LOGPROBS_METHOD)
    return cast("LogprobsForward", getattr(model, LOGPROBS_METHOD))


def sharded_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """grpo.token_logprobs as a new tensor: FSDP warns that in-place ops on a view it returns would skip
    its backward hook."""
    from services.learner.grpo import token_logprobs

    logprobs = token_logprobs(model, input_ids, attention_mask, temperatures, chunk_tokens)  # type: ignore[arg-type]
    return logprobs.clone()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (`model.model.layers` for Llama/Qwen-style models)."""
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no base_model.layers to shard")
    return list(layers)


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter: after a no_grad forward the root stays unsharded (FSDP keeps the
    root's parameters for the backward that never comes), and its parameters read as plain tensors."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@torch.no_grad()
def gather_full_weights(model: torch.nn.Module, replica: torch.nn.Module | None) -> None:
    """A collective (every rank calls it): each parameter of the sharded `model` in full, one at a time
    (DTensor.full_tensor()), copied into the plain `replica` (rank 0's; None elsewhere) and dropped, so a
    device holds one gathered parameter at a time. Buffers are not sharded: copied as they are."""
    from torch.distributed.tensor import DTensor

    reshard(model)
    targets = dict(replica.named_parameters()) if replica is not None else {}
    for name, parameter in model.named_parameters():  # tied weights once (named_parameters dedupes)
        full = parameter.full_tensor() if isinstance(parameter, DTensor) else parameter
        if replica is not None:
            targets[name].copy_(full)
        del full
    if replica is not None:
        buffers = dict(replica.named_buffers())
        for name, buffer in model.named_buffers():
            buffers[name].copy_(buffer)


def full_state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model, optimizer) state dicts keyed by parameter name, full tensors on CPU: the checkpoint's form
    for any world size. Sharded: a collective; rank 0 gets them (the others empty dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    reshard(model)
    model_state = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    return model_state, dict(get_optimizer_state_dict(model, optimizer, options=options))


def load_full_state_dicts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    ranks: RankGroup,
) -> None:
    """Put `full_state_dicts`' output back (from a checkpoint of any world size). Sharded: a collective;
    only rank 0's dicts are read, and broadcast (the others pass empty ones)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=ranks.is_sharded)
    reshard(model)
    set_model_state_dict(model, cast(dict[str, Any], model_state), options=options)
    set_optimizer_state_dict(model, optimizer, cast(Any, optimizer_state), options=options)
