"""Continuous batching (engines/continuous.py) on both engines, on the demo's character-level policy (EOS is
frequent there, so samples end at uneven lengths), against the torch engine's batch `generate` and a plain
transformers forward (fp32):

- rows admitted as others finish (at most max_rows at once, full while rows wait) pick the same keyed tokens,
  with the same log-probs, as one batch `generate` of every sample;
- weights loaded between two steps while rows run: each running row records the token at which the new
  version took over, and every token's log-prob is the one its own version gives the whole context before it
  (what the learner's audit recomputes); the tokens after the change are keyed picks under the new weights;
- abort drops rows, running or waiting; a bad request is refused before anything is queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save as safetensors_save

from engines.continuous import ContinuousBatch, FinishedSample, SampleRequest, VersionChange
from engines.interface import InferenceEngine, Sample, Sampling
from tests.hf_folders import build_char_folder
from tests.keyed_checks import build_cpu_engine, load_reference
from tests.vllm_required import require_vllm

torch.set_num_threads(1)

PROMPTS = ["3+4=", "12+345=", "9=", "1+1+1+1+1="]
NUM_SAMPLES = 3
MAX_NEW_TOKENS = 12
TEMPERATURE = 0.9
SEED = 1234
ATOL = 1e-4  # fp32 engines against fp32 transformers, other batch shapes: measured differences ~1e-6
TIED_OUTPUT_KEY = "lm_head.weight"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_folder(tmp_path_factory.mktemp("char"), max_position_embeddings=48)


@pytest.fixture(scope="module")
def torch_engine(folder: Path) -> InferenceEngine:
    return build_cpu_engine("torch", folder)


@pytest.fixture(scope="module", params=["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest, folder: Path, torch_engine: InferenceEngine) -> Iterator[InferenceEngine]:
    if request.param == "torch":
        yield torch_engine
        return
    require_vllm()
    engine = build_cpu_engine("vllm", folder)
    yield engine
    engine.close()  # type: ignore[attr-defined]


def blob_of(state: dict[str, torch.Tensor]) -> bytes:
    """The weights as the learner publishes them (the tied head left out)."""
    return safetensors_save({k: v.contiguous() for k, v in state.items() if k != TIED_OUTPUT_KEY})


@pytest.fixture(scope="module")
def weights(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Two versions: the folder's weights and a perturbed copy."""
    original = load_reference(folder).state_dict()
    generator = torch.Generator().manual_seed(7)
    perturbed = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in original.items() if k != TIED_OUTPUT_KEY
    }
    return {"old": original, "new": perturbed}


def requests_of(engine: InferenceEngine, max_new_tokens: int = MAX_NEW_TOKENS) -> list[SampleRequest]:
    prompt_ids = engine.encode_prompts(PROMPTS, max_new_tokens)
    return [
        SampleRequest(
            request_id=p * NUM_SAMPLES + j,
            prompt_ids=tuple(ids),
            sampling=Sampling(1, max_new_tokens, TEMPERATURE),
            seed=SEED + 100 * p + j,
        )
        for p, ids in enumerate(prompt_ids)
        for j in range(NUM_SAMPLES)
    ]


def run_to_end(batch: ContinuousBatch, max_steps: int = 500) -> tuple[dict[int, FinishedSample], list[tuple[int, int]]]:
    """Step until nothing runs or waits: the finished samples by request id, and each step's (rows decoded,
    rows still waiting after it)."""
    finished: dict[int, FinishedSample] = {}
    occupancy = []
    for _ in range(max_steps):
        if not batch.num_running and not batch.num_waiting:
            return finished, occupancy
        finished.update((done.request_id, done) for done in batch.step())
        assert batch.last_step is not None
        occupancy.append((batch.last_step.num_rows, batch.num_waiting))
    raise AssertionError("the batch did not drain")


def test_rows_admitted_as_others_finish_sample_what_one_batch_generate_samples(
    engine: InferenceEngine, torch_engine: InferenceEngine, weights: dict[str, dict[str, torch.Tensor]]
) -> None:
    for each in {id(engine): engine, id(torch_engine): torch_engine}.values():
        each.load_weights(blob_of(weights["old"]), policy_version=0)
    expected = torch_engine.generate(
        PROMPTS,
        Sampling(NUM_SAMPLES, MAX_NEW_TOKENS, TEMPERATURE),
        sampling_seeds=[SEED + 100 * p for p in range(len(PROMPTS))],
    )
    batch = engine.continuous_batch(max_rows=5)
    batch.add(requests_of(engine))
    finished, occupancy = run_to_end(batch)

    assert max(rows for rows, _ in occupancy) == 5  # never more than max_rows
    assert all(rows == 5 for rows, waiting in occupancy if waiting)  # and full while rows waited
    assert sum(1 for _, waiting in occupancy if waiting) >= 3
    assert sorted(finished) == list(range(len(PROMPTS) * NUM_SAMPLES))
    for p in range(len(PROMPTS)):
        for j in range(NUM_SAMPLES):
            done, want = finished[p * NUM_SAMPLES + j], expected[p][j]
            assert done.sample.token_ids == want.token_ids, (p, j)
            assert (done.sample.text, done.sample.finish_reason) == (want.text, want.finish_reason)
            assert done.sample.prompt_token_ids == want.prompt_token_ids
            assert torch.allclose(torch.tensor(done.sample.logprobs), torch.tensor(want.logprobs), atol=ATOL)
            assert done.versions == (VersionChange(0, 0),)
    assert len({len(done.sample.token_ids) for done in finished.values()}) > 1  # rows left early


def chosen_logprobs(reference: Any, sample: Sample) -> torch.Tensor:
    """(N,) log_softmax(logits / T) of each completion token given everything before it (teacher forcing)."""
    ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
    with torch.no_grad():
        logits = reference(input_ids=ids).logits[0, len(sample.prompt_token_ids) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    return logprobs.gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)


def test_weights_loaded_between_steps_reach_the_running_rows_at_a_recorded_token(
    engine: InferenceEngine, folder: Path, weights: dict[str, dict[str, torch.Tensor]]
) -> None:
    engine.load_weights(blob_of(weights["old"]), policy_version=3)
    batch = engine.continuous_batch(max_rows=4)
    batch.add([SampleRequest(i, (5, 6, 7), Sampling(1, 30, TEMPERATURE), seed=SEED + i) for i in range(4)])
    finished: dict[int, FinishedSample] = {}
    for _ in range(4):
        finished.update((done.request_id, done) for done in batch.step())
    engine.load_weights(blob_of(weights["new"]), policy_version=4)  # between two steps, rows in flight
    rest, _ = run_to_end(batch)
    finished.update(rest)

    references = {version: load_reference(folder) for version in (3, 4)}
    references[4].load_state_dict(weights["new"], strict=False)
    swapped = [done for done in finished.values() if len(done.versions) == 2]
    assert swapped, "some rows were still running at the swap"
    for done in finished.values():
        assert done.versions[0] == VersionChange(0, 3)
        logprobs = torch.tensor(done.sample.logprobs)
        for index, change in enumerate(done.versions):
            end = done.versions[index + 1].token_index if index + 1 < len(done.versions) else len(logprobs)
            under_version = chosen_logprobs(references[change.policy_version], done.sample)
            assert torch.allclose(
                logprobs[change.token_index : end], under_version[change.token_index : end], atol=ATOL
            )
    for done in swapped:
        (_, change) = done.versions
        assert change.policy_version == 4 and 0 < change.token_index < len(done.sample.token_ids)
        under_old = chosen_logprobs(references[3], done.sample)[change.token_index :]
        under_new = chosen_logprobs(references[4], done.sample)[change.token_index :]
        assert not torch.allclose(under_old, under_new, atol=1e-3)  # the swap mattered
        assert done.oldest_version == 3


def test_only_a_load_with_rows_in_flight_reports_a_recompute(
    engine: InferenceEngine, weights: dict[str, dict[str, torch.Tensor]]
) -> None:
    """The swap pause a worker reports is the load plus the recompute of the rows in flight; a load before
    any row runs (a worker's first weights) recomputes nothing, whatever its first step costs."""
    batch = engine.continuous_batch(max_rows=4)
    engine.load_weights(blob_of(weights["old"]), policy_version=5)  # nothing in flight
    batch.add([SampleRequest(i, (5, 6, 7), Sampling(1, 30, TEMPERATURE), seed=SEED + i) for i in range(4)])
    batch.step()
    assert batch.last_step is not None
    assert (batch.last_step.num_admitted, batch.last_step.recompute_s) == (4, 0.0)
    batch.step()
    assert batch.last_step.recompute_s == 0.0 and batch.num_running > 0
    engine.load_weights(blob_of(weights["new"]), policy_version=6)  # rows in flight
    batch.step()
    assert batch.last_step.recompute_s > 0.0
    batch.step()
    assert batch.last_step.recompute_s == 0.0
    run_to_end(batch)


def test_abort_drops_running_and_waiting_rows_and_a_bad_request_queues_nothing(engine: InferenceEngine) -> None:
    batch = engine.continuous_batch(max_rows=2)
    requests = requests_of(engine)[:4]
    batch.add(requests)
    batch.step()
    assert (batch.num_running, batch.num_waiting) == (2, 2)
    batch.abort([requests[0].request_id, requests[3].request_id, 999])
    assert (batch.num_running, batch.num_waiting) == (1, 1)
    finished, _ = run_to_end(batch)
    assert sorted(finished) == [requests[1].request_id, requests[2].request_id]

    too_long = SampleRequest(50, requests[0].prompt_ids, Sampling(1, 10_000, 1.0))
    with pytest.raises(ValueError):
        batch.add([requests[0], too_long])
    assert (batch.num_running, batch.num_waiting) == (0, 0)
