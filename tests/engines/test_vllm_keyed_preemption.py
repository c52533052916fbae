"""Keyed sampling in the vLLM engine survives preemption (engines/vllm_keyed_sampler.py): with a KV cache of
8 blocks of 128 tokens, 16 requests growing to ~185 tokens preempt each other and are recomputed; every token
is still keyed sampling's pick under the reference, because the pick is a pure function of (seed, position).

Its own module: this engine must not live beside tests/engines/test_vllm_keyed_sampling.py's (an in-process
vLLM engine tears down the process's distributed state when it goes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.interface import InferenceEngine, Sampling
from shared.keyed_sampling import task_seed
from tests.keyed_checks import GAP_TOLERANCE, build_cpu_engine, build_keyed_folder, gaps_of, load_reference
from tests.vllm_required import require_vllm

pytestmark = pytest.mark.vllm

TEMPERATURE = 0.7
KV_CACHE_BYTES = 1 << 18  # 8 blocks of 128 tokens for this model (1 layer, 1 KV head of 32, fp32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_keyed_folder(tmp_path_factory.mktemp("keyed-preemption"))


@pytest.fixture(scope="module")
def tight_engine(folder: Path) -> Iterator[InferenceEngine]:
    require_vllm()
    engine = build_cpu_engine("vllm", folder, kv_cache_bytes=KV_CACHE_BYTES)
    yield engine
    engine.close()  # type: ignore[attr-defined]


def test_preempted_requests_keep_their_keyed_tokens(
    tight_engine: InferenceEngine, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    num_preemptions = 0
    preempt = Scheduler._preempt_request

    def counted_preempt(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal num_preemptions
        num_preemptions += 1
        return preempt(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "_preempt_request", counted_preempt)
    prompts = [" ".join(["hello what is the answer"] * 12) + f" {i}" for i in range(4)]  # 65 tokens each
    seeds = [task_seed(f"preempted-{i}") for i in range(len(prompts))]

    groups = tight_engine.generate(prompts, Sampling(4, 120, TEMPERATURE), sampling_seeds=seeds)

    assert num_preemptions > 0
    reference = load_reference(folder)
    for seed, group in zip(seeds, groups, strict=True):
        for j, sample in enumerate(group):
            assert gaps_of(reference, sample, seed + j, TEMPERATURE).max().item() < GAP_TOLERANCE
