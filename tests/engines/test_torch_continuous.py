"""The torch engine's continuous batch (engines/torch_continuous.py) on the demo's tiny policy, against the
engine's own batch `generate` and a plain transformers forward:

- rows admitted as others finish (at most max_rows at once) pick the same keyed tokens, with the same
  log-probs, as one batch `generate` of every sample;
- weights loaded between two steps: the running rows record the change point, and every token's log-prob is
  the one its own version gives the whole context (what the learner's audit recomputes);
- abort drops rows, running or waiting; a bad request is refused before anything is queued.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.continuous import ContinuousBatch, FinishedSample, SampleRequest, VersionChange
from engines.interface import Sample
from engines.torch_engine import TorchEngine

torch.set_num_threads(1)

PROMPTS = ["3+4=", "12+345=", "9=", "1+1+1+1+1="]
NUM_SAMPLES = 3
MAX_NEW_TOKENS = 12
TEMPERATURE = 0.9
SEED = 1234
ATOL = 1e-4  # the same fp32 forward with other padding: measured differences ~1e-6


@pytest.fixture(scope="module")
def engine(tiny_policy_dir: Path) -> TorchEngine:
    engine = TorchEngine(tiny_policy_dir)
    engine.load_state_dict(engine.model.state_dict(), policy_version=0)
    return engine


def requests_of(engine: TorchEngine) -> list[SampleRequest]:
    prompt_ids = engine.encode_prompts(PROMPTS, MAX_NEW_TOKENS)
    return [
        SampleRequest(
            request_id=p * NUM_SAMPLES + j,
            prompt_ids=tuple(ids),
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=TEMPERATURE,
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


def test_rows_admitted_as_others_finish_sample_what_one_batch_generate_samples(engine: TorchEngine) -> None:
    expected = engine.generate(
        PROMPTS,
        NUM_SAMPLES,
        MAX_NEW_TOKENS,
        TEMPERATURE,
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
            done = finished[p * NUM_SAMPLES + j]
            want = expected[p][j]
            assert done.sample.token_ids == want.token_ids, (p, j)
            assert done.sample.text == want.text
            assert done.sample.finish_reason == want.finish_reason
            assert done.sample.prompt_token_ids == want.prompt_token_ids
            assert torch.allclose(torch.tensor(done.sample.logprobs), torch.tensor(want.logprobs), atol=ATOL)
            assert done.versions == (VersionChange(0, 0),)
    lengths = {len(done.sample.token_ids) for done in finished.values()}
    assert len(lengths) > 1  # uneven lengths: rows did leave early and others took their place


def reference_logprobs(model: torch.nn.Module, sample: Sample, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of every completion token given everything before it (teacher forcing)."""
    ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(sample.prompt_token_ids) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return logprobs.gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)


def test_weights_loaded_between_steps_reach_the_running_rows_at_a_recorded_token(
    engine: TorchEngine, tiny_policy_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    old_state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    generator = torch.Generator().manual_seed(7)
    new_state = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in old_state.items() if k != "lm_head.weight"
    }  # the head is tied to the embedding
    request = requests_of(engine)[0]
    long_requests = [
        SampleRequest(i, request.prompt_ids, max_new_tokens=16, temperature=TEMPERATURE, seed=SEED + i)
        for i in range(4)
    ]
    try:
        engine.load_state_dict(old_state, policy_version=3)
        batch = engine.continuous_batch(max_rows=4)
        batch.add(long_requests)
        finished: dict[int, FinishedSample] = {}
        for _ in range(3):
            finished.update((done.request_id, done) for done in batch.step())
        tokens_before = {row.request.request_id: len(row.token_ids) for row in batch.rows}
        engine.load_state_dict(new_state, policy_version=4)  # between two steps, rows in flight
        rest, _ = run_to_end(batch)
        finished.update(rest)
        assert batch.last_step is not None
    finally:
        engine.load_state_dict(old_state, policy_version=0)

    old_model = AutoModelForCausalLM.from_pretrained(tiny_policy_dir, dtype=torch.float32).eval()
    new_model = AutoModelForCausalLM.from_pretrained(tiny_policy_dir, dtype=torch.float32).eval()
    old_model.load_state_dict(old_state)
    new_model.load_state_dict(new_state, strict=False)
    assert tokens_before, "some rows were still running at the swap"
    for request_id, num_before in tokens_before.items():
        done = finished[request_id]
        assert done.versions == (VersionChange(0, 3), VersionChange(num_before, 4))
        assert done.oldest_version == 3
        logprobs = torch.tensor(done.sample.logprobs)
        under_old = reference_logprobs(old_model, done.sample, TEMPERATURE)
        under_new = reference_logprobs(new_model, done.sample, TEMPERATURE)
        assert torch.allclose(logprobs[:num_before], under_old[:num_before], atol=ATOL)
        assert torch.allclose(logprobs[num_before:], under_new[num_before:], atol=ATOL)
        assert not torch.allclose(under_old[num_before:], under_new[num_before:], atol=1e-3)  # the swap mattered


def test_abort_drops_running_and_waiting_rows_and_a_bad_request_queues_nothing(engine: TorchEngine) -> None:
    batch = engine.continuous_batch(max_rows=2)
    requests = requests_of(engine)[:4]
    batch.add(requests)
    batch.step()
    assert (batch.num_running, batch.num_waiting) == (2, 2)
    batch.abort([requests[0].request_id, requests[3].request_id, 999])
    assert (batch.num_running, batch.num_waiting) == (1, 1)
    finished, _ = run_to_end(batch)
    assert sorted(finished) == [requests[1].request_id, requests[2].request_id]

    too_long = SampleRequest(50, requests[0].prompt_ids, max_new_tokens=10_000, temperature=1.0)
    with pytest.raises(ValueError):
        batch.add([requests[0], too_long])
    assert (batch.num_running, batch.num_waiting) == (0, 0)
