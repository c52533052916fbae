"""Placement (cluster/placement.py): core lists, roles, and what each process is started with."""

from __future__ import annotations

import os

import pytest

from cluster.placement import Placement, parse_cores


def test_core_lists_parse_as_taskset_takes_them() -> None:
    assert parse_cores("0,2,4-6") == (0, 2, 4, 5, 6)
    for bad in ("a", "3-1", "-1", ""):
        with pytest.raises(ValueError):
            parse_cores(bad)


def test_each_role_gets_its_cores_and_threads_to_match() -> None:
    core = min(os.sched_getaffinity(0))
    placement = Placement.parse(f"learner={core} workers={core}", num_workers=3)
    assert placement.command_prefix("learner") == ["taskset", "-c", str(core)]
    assert placement.env("learner") == {"OMP_NUM_THREADS": "1", "RL_TORCH_NUM_THREADS": "1"}
    worker = placement.env("worker-2")
    assert worker["RL_WORKER_NUM_THREADS"] == "1" and worker["VLLM_CPU_OMP_THREADS_BIND"] == str(core)
    assert placement.command_prefix("coordinator") == [] and placement.env("reward") == {}  # services float


def test_workers_share_their_cores() -> None:
    placement = Placement((0,), (1, 2, 3, 4), (), num_workers=2)
    assert placement.threads_of("worker-0") == 2 and placement.threads_of("learner") == 1


def test_a_bad_placement_is_refused_with_its_reason() -> None:
    with pytest.raises(ValueError, match="no cores for workers"):
        Placement.parse("learner=0")
    with pytest.raises(ValueError, match="not one of"):
        Placement.parse("learner=0 gpu=1 workers=0")
    with pytest.raises(ValueError, match="does not let the runner use"):
        Placement.parse("learner=0 workers=4096")
