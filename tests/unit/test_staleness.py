import pytest

from shared.staleness import DropReason, admission_verdict, is_admissible, steps_remaining


@pytest.mark.parametrize(
    "t, v, s, admissible",
    [
        (0, 0, 0, True),
        (1, 0, 0, False),
        (5, 3, 2, True),
        (6, 3, 2, False),
        (3, 4, 2, False),
        (10, 0, 10, True),
    ],
)
def test_admission_rule_is_t_minus_v_at_most_s(t: int, v: int, s: int, admissible: bool) -> None:
    assert is_admissible(t, v, s) is admissible
    assert (admission_verdict(t, v, s) is None) is admissible


def test_drop_reasons_distinguish_old_from_impossible_versions() -> None:
    assert admission_verdict(7, 4, 2) is DropReason.STALE
    assert admission_verdict(7, 8, 2) is DropReason.FUTURE_VERSION


def test_steps_remaining_counts_down_to_the_last_admissible_step() -> None:
    assert [steps_remaining(t, 3, 2) for t in range(3, 7)] == [2, 1, 0, -1]
