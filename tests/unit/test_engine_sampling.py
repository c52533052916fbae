"""engines.interface.Sampling: the one sampling argument of every engine call checks itself when built, and a
continuous batch's row takes only one drawn sample."""

from __future__ import annotations

import pytest

from engines.continuous import SampleRequest
from engines.interface import Sampling
from shared.messages import TaskGroup


@pytest.mark.parametrize(
    ("num_samples", "max_new_tokens", "temperature"), [(0, 4, 1.0), (2, 0, 1.0), (2, 4, 0.0), (2, 4, -0.5)]
)
def test_a_sampling_outside_its_range_is_refused_when_built(
    num_samples: int, max_new_tokens: int, temperature: float
) -> None:
    with pytest.raises(ValueError, match="need num_samples >= 1"):
        Sampling(num_samples, max_new_tokens, temperature)


def test_a_task_s_sampling_is_its_group_and_batches_with_its_equals() -> None:
    task = TaskGroup(
        run_id="r", task_id="t", task_name="n", prompt="3+4=", num_samples=8, max_new_tokens=6, temperature=0.7
    )
    sampling = Sampling.of_task(task)
    assert sampling == Sampling(8, 6, 0.7) and not sampling.greedy
    assert {sampling, Sampling(8, 6, 0.7)} == {sampling}  # frozen and hashable: the worker batches by it
    assert sampling.one_sample() == Sampling(1, 6, 0.7)
    with pytest.raises(AttributeError):
        sampling.temperature = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("sampling", [Sampling(2, 4, 1.0), Sampling(1, 4, 1.0, greedy=True)])
def test_a_row_is_one_drawn_sample(sampling: Sampling) -> None:
    with pytest.raises(ValueError, match="one drawn sample"):
        SampleRequest(0, (5, 6, 7), sampling)
    assert SampleRequest(0, (5, 6, 7), Sampling(1, 4, 1.0), seed=3).sampling.num_samples == 1
