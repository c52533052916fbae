"""The lying workers of the trust tests (benchmarks/liars.py, benchmarks/liar_worker.py): each lie changes
what it says it changes and nothing else; the production worker's entry point has no way to lie."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from benchmarks.liar_worker import MODULE, liar_entry_points, lie_from_environment
from benchmarks.liars import FaultKind, LyingEngine, TamperingStore
from engines.interface import InferenceEngine, Sample, Sampling
from shared.tokenization import PromptInput
from shared.weight_channel import Buffer

PROMPT_IDS = [7, 3, 8, 14]
COMPLETIONS = [[5, 1], [2, 9], [9, 1]]


class FixedEngine(InferenceEngine):
    """Samples the same three completions of every prompt; `load_weights` only records the version."""

    model_fingerprint = "f" * 64

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], sampling: Sampling, sampling_seeds: Sequence[int] | None = None
    ) -> list[list[Sample]]:
        return [
            [Sample(list(ids), list(tokens), [-0.1] * len(tokens), "7", "stop") for tokens in COMPLETIONS]
            for ids in prompt_ids
        ]

    def encode_prompts(self, prompts: Sequence[str | PromptInput], max_new_tokens: int = 0) -> list[list[int]]:
        return [PROMPT_IDS for _ in prompts]

    def encode_observation(self, text: str) -> list[int]:
        return [1]

    def load_weights(self, safetensors_bytes: Buffer, policy_version: int, path: Path | None = None) -> None:
        self._policy_version = policy_version


def sample_once(engine: InferenceEngine) -> list[Sample]:
    return engine.generate(["3+4="], Sampling(3, 2, 1.0))[0]


def test_garbage_logprobs_replaces_the_logprobs_only() -> None:
    honest = sample_once(FixedEngine())
    garbage = sample_once(LyingEngine(FixedEngine(), FaultKind.GARBAGE_LOGPROBS))
    assert [s.token_ids for s in garbage] == [s.token_ids for s in honest]
    assert [s.text for s in garbage] == [s.text for s in honest]
    assert all(len(s.logprobs) == s.num_tokens for s in garbage)
    assert [s.logprobs for s in garbage] != [s.logprobs for s in honest]


def test_swapped_text_replaces_the_ids_with_ids_of_the_group() -> None:
    honest = sample_once(FixedEngine())
    swapped = sample_once(LyingEngine(FixedEngine(), FaultKind.SWAPPED_TEXT, seed=3))
    assert [s.text for s in swapped] == [s.text for s in honest]
    assert [s.logprobs for s in swapped] == [s.logprobs for s in honest]
    assert [s.num_tokens for s in swapped] == [s.num_tokens for s in honest]
    assert [s.token_ids for s in swapped] != [s.token_ids for s in honest]
    pool = set(PROMPT_IDS) | {token for tokens in COMPLETIONS for token in tokens}
    assert {token for s in swapped for token in s.token_ids} <= pool


def test_stale_weights_stops_loading_but_reports_the_newest_version_given() -> None:
    inner = FixedEngine()
    stale = LyingEngine(inner, FaultKind.STALE_WEIGHTS, stale_after_version=2)
    for version in (0, 1, 2, 3, 7):
        stale.load_weights(b"", version)
    assert inner.policy_version == 2  # the weights it samples with
    assert stale.policy_version == 7  # what the worker writes on its groups and gates on
    assert sample_once(stale) == sample_once(FixedEngine())  # its samples are honest, for version 2


def test_the_lies_refuse_the_wrong_wrapper() -> None:
    with pytest.raises(ValueError, match="chunk store"):
        LyingEngine(FixedEngine(), FaultKind.CORRUPT_CHUNKS)
    with pytest.raises(ValueError, match="engine"):
        TamperingStore(FaultKind.SWAPPED_TEXT, keep_versions=2, trusted_key=None, spill_dir=None)


def test_the_liar_entry_reads_its_kind_from_the_environment() -> None:
    with pytest.raises(ValueError, match="expected one of"):
        lie_from_environment({})
    with pytest.raises(ValueError, match="expected one of"):
        lie_from_environment({"RL_FAULT_INJECT": "nope"})
    assert lie_from_environment({"RL_FAULT_INJECT": "stale_weights", "RL_FAULT_STALE_AFTER_VERSION": "4"}) == (
        FaultKind.STALE_WEIGHTS,
        4,
    )


def test_a_benchmark_starts_its_liars_through_the_runner_by_their_entry_point() -> None:
    """The runner (cluster/) names no benchmark: it runs the entry point the test or benchmark gives it."""
    entry_points = liar_entry_points({"worker-3": FaultKind.STALE_WEIGHTS, "worker-0": "corrupt_chunks"})
    assert {name: (point.module, point.env) for name, point in entry_points.items()} == {
        "worker-3": (MODULE, {"RL_FAULT_INJECT": "stale_weights"}),
        "worker-0": (MODULE, {"RL_FAULT_INJECT": "corrupt_chunks"}),
    }
    with pytest.raises(ValueError):  # a typo fails before any process starts
        liar_entry_points({"worker-3": "stale_weight"})


def test_a_lying_engine_lies_in_its_continuous_batch_too(tiny_policy_dir: Path) -> None:
    """Continuous mode: garbage log-probs per finished sample; stale_weights claims the newest version it was
    given for the whole sample."""
    from engines.continuous import SampleRequest, VersionChange
    from engines.torch_engine import TorchEngine

    honest = TorchEngine(tiny_policy_dir)
    honest.load_state_dict(honest.model.state_dict(), policy_version=0)
    (prompt_ids,) = honest.encode_prompts(["3+4="], 4)
    requests = [SampleRequest(j, tuple(prompt_ids), Sampling(1, 4, 1.0), 100 + j) for j in range(4)]

    def run(engine: LyingEngine) -> list:  # type: ignore[type-arg]
        batch = engine.continuous_batch(max_rows=4)
        batch.add(requests)
        finished = []
        while batch.num_running or batch.num_waiting:
            finished.extend(batch.step())
        return sorted(finished, key=lambda done: done.request_id)

    truth = run(LyingEngine(honest, FaultKind.STALE_WEIGHTS, stale_after_version=5))  # not stale yet: honest
    garbage = run(LyingEngine(honest, FaultKind.GARBAGE_LOGPROBS, seed=1))
    assert [d.sample.token_ids for d in garbage] == [d.sample.token_ids for d in truth]  # keyed: same picks
    assert all(d.sample.logprobs != t.sample.logprobs for d, t in zip(garbage, truth, strict=True))

    stale = LyingEngine(honest, FaultKind.STALE_WEIGHTS, stale_after_version=0)
    stale.load_weights(b"never loaded", policy_version=7)
    assert honest.policy_version == 0 and stale.policy_version == 7
    assert all(done.versions == (VersionChange(0, 7),) for done in run(stale))
