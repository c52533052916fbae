"""The commands rank 0 sends the learner's other ranks (services/learner/distributed.py) and a follower's
dispatch of them (Policy.obey): each command is one frozen dataclass that survives the pickling
broadcast_object_list does, every one has its case, and a follower handed anything else raises (torchrun
then stops every rank) rather than waiting in a collective rank 0 never joins."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import get_args

import pytest
import torch

from services.learner.distributed import Checkpoint, Command, GatherWeights, Restore, Stop, Train
from services.learner.policy import Policy
from tests.sharded_step import GROUP_SIZES, RUN, fixed_batch

torch.set_num_threads(1)


def test_every_command_is_a_frozen_message_that_survives_the_broadcast() -> None:
    train = Train(fixed_batch(vocab_size=20, seed=0), GROUP_SIZES, shuffle_seed=3)
    commands = [train, GatherWeights(), Checkpoint(), Restore(), Stop()]
    assert {type(command) for command in commands} == set(get_args(Command))
    received = pickle.loads(pickle.dumps(train))
    assert torch.equal(received.batch.input_ids, train.batch.input_ids)
    assert (received.group_sizes, received.shuffle_seed) == (GROUP_SIZES, 3)
    with pytest.raises(AttributeError):
        train.shuffle_seed = 4  # type: ignore[misc]


def test_a_follower_runs_each_command_stops_at_stop_and_raises_on_anything_else(tiny_policy_dir: Path) -> None:
    policy = Policy(tiny_policy_dir, RUN)
    batch = fixed_batch(policy.config.vocab_size, seed=0)
    for command in (Train(batch, GROUP_SIZES, shuffle_seed=0), GatherWeights(), Checkpoint()):
        assert policy.obey(command) is True  # one process: the same calls, without collectives
    assert policy.obey(Stop()) is False
    for unknown in (object(), ("train", (batch, GROUP_SIZES, 0)), None):
        with pytest.raises(AssertionError):
            policy.obey(unknown)  # type: ignore[arg-type]
