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


def test_a_mixed_version_group_is_bounded_by_its_oldest_or_its_newest_token_as_the_rule_says() -> None:
    # tokens of versions 3 (oldest) to 5 (newest), at learner step 6 with S = 2
    assert admission_verdict(6, 3, 2, newest_version=5) is DropReason.STALE
    assert admission_verdict(6, 3, 2, newest_version=5, rule="per_token") is None
    assert admission_verdict(7, 3, 2, newest_version=5, rule="per_token") is None
    assert admission_verdict(8, 3, 2, newest_version=5, rule="per_token") is DropReason.STALE


@pytest.mark.parametrize("rule", ["oldest_token", "per_token"])
def test_a_token_from_a_version_the_learner_has_not_made_is_refused_under_either_rule(rule: str) -> None:
    assert admission_verdict(6, 5, 2, newest_version=7, rule=rule) is DropReason.FUTURE_VERSION  # type: ignore[arg-type]
