"""Kuhn poker on pokerkit (shared/tasks/poker.py): known deals and actions give the known big blinds."""

from __future__ import annotations

import itertools

import pytest

from shared.tasks import make_task
from shared.tasks.environment import Replay, replay, single_turn_environment
from shared.tasks.poker import KuhnPokerEnvironment, KuhnPokerTask, bb_to_reward, deal, parse_action


def play(seed: int, actions: list[str]) -> tuple[list[str], KuhnPokerEnvironment, float]:
    environment = KuhnPokerEnvironment(seed)
    observations = [environment.reset()]
    total = 0.0
    for action in actions:
        result = environment.step(action)
        total += result.reward
        observations.append(result.observation)
        if result.done:
            break
    return observations, environment, total


def test_the_deals_are_seeded() -> None:
    assert deal(0) == ("Q", "K", 0)  # the model holds Q in seat 0 (acts first) against K
    assert deal(5) == ("K", "Q", 1)
    assert deal(4) == ("J", "Q", 0)
    assert [deal(seed) for seed in range(50)] == [deal(seed) for seed in range(50)]


def test_calling_a_bet_with_the_best_card_wins_two_big_blinds() -> None:
    observations, environment, reward = play(5, ["call"])  # K in seat 1: the opponent (Q) bets first
    assert observations[0] == "kuhn;card=K;opp=bets;pot=3;fold/call?"
    assert environment.done and environment.bb_won() == 2 and reward == 1.0


def test_check_then_call_a_bet_with_the_worse_card_loses_two_big_blinds() -> None:
    observations, environment, reward = play(0, ["check", "call"])  # Q in seat 0 against K, which bets
    assert observations == ["kuhn;card=Q;pot=2;check/bet?", "opp=bets;pot=3;fold/call?", ""]
    assert environment.bb_won() == -2 and reward == 0.0


def test_folding_to_a_bet_loses_the_ante() -> None:
    _, environment, reward = play(0, ["check", "fold"])
    assert environment.bb_won() == -1 and reward == 0.25


def test_a_bet_called_by_a_better_card_loses_two_big_blinds() -> None:
    _, environment, reward = play(4, ["bet"])  # J first to act against Q, which calls
    assert environment.bb_won() == -2 and reward == 0.0


def test_the_opponent_folds_its_jack_to_a_bet() -> None:
    seed = next(seed for seed in range(100) if deal(seed)[1:] == ("J", 0))  # the model first to act, opponent J
    _, environment, reward = play(seed, ["bet"])
    assert environment.bb_won() == 1 and reward == 0.75


def test_against_this_opponent_the_best_response_beats_the_fallback_by_a_third() -> None:
    """Every pure strategy of the model (an action per card and seat, facing no bet and facing a bet),
    averaged over the 12 deals: what a policy can learn here (the module docstring's numbers)."""
    deals = [(hero, opponent, seat) for hero in "JQK" for opponent in "JQK" if opponent != hero for seat in (0, 1)]

    def outcome(deal: tuple[str, str, int], no_bet_action: str, facing_bet_action: str) -> float:
        environment = KuhnPokerEnvironment(0)
        environment.hero_rank, environment.opponent_rank, environment.hero_seat = deal
        environment.reset()
        while True:
            result = environment.step(facing_bet_action if "fold" in environment.legal_actions() else no_bet_action)
            if result.done:
                return result.reward

    pairs = list(itertools.product(("check", "bet"), ("fold", "call")))  # (facing no bet, facing a bet)
    rewards = {(deal, pair): outcome(deal, *pair) for deal in deals for pair in pairs}

    def mean_reward(strategy: dict[tuple[str, int], tuple[str, str]]) -> float:
        return sum(rewards[(deal, strategy[(deal[0], deal[2])])] for deal in deals) / len(deals)

    info_sets = [(rank, seat) for rank in "JQK" for seat in (0, 1)]
    best = max(mean_reward(dict(zip(info_sets, combo, strict=True))) for combo in itertools.product(pairs, repeat=6))
    fallback = mean_reward({info: ("check", "fold") for info in info_sets})
    call_all = mean_reward({info: ("check", "call") for info in info_sets})
    assert (fallback, call_all, round(best, 3)) == (0.25, 0.5, 0.583)


def test_the_reward_maps_big_blinds_linearly_onto_0_1() -> None:
    assert [bb_to_reward(bb) for bb in (-2, -1, 0, 1, 2)] == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize(
    ("text", "legal", "action"),
    [
        ("bet", ["check", "bet"], "bet"),
        ("  CALL now", ["fold", "call"], "call"),
        ("b", ["check", "bet"], "bet"),
        ("c", ["fold", "call"], "call"),
        ("I call.", ["fold", "call"], "call"),  # a word anywhere, before letters
        ("before I check", ["check", "bet"], "check"),
        ("xq1b", ["check", "bet"], "bet"),  # no word: the first legal initial
        ("9c?f", ["fold", "call"], "call"),
        ("f", ["check", "bet"], "check"),  # fold is not legal: the fallback checks
        ("zzz", ["fold", "call"], "fold"),  # unparsable facing a bet: fold
        ("", ["check", "bet"], "check"),
    ],
)
def test_the_parse_rule(text: str, legal: list[str], action: str) -> None:
    assert parse_action(text, legal) == action


def test_every_observation_is_in_the_alphabet() -> None:
    alphabet = set(KuhnPokerTask.alphabet)
    for seed, first, second in itertools.product(range(40), ("check", "bet", "x"), ("call", "fold", "x")):
        observations, _, _ = play(seed, [first, second])
        assert set("".join(observations)) <= alphabet, observations
    assert set("checkbetfoldcall") <= alphabet


def test_the_replay_plays_the_actions_and_truncates_an_unfinished_hand() -> None:
    task = KuhnPokerTask(num_eval_prompts=20, seed=0)
    assert task.replay("0", ["check", "call"]) == Replay(0.0, ["opp=bets;pot=3;fold/call?"])
    assert task.replay("0", ["check"]) == Replay(0.25, [])  # cut after one turn: the fallback folds to the bet
    with pytest.raises(ValueError, match="ended after action 1"):
        task.replay("5", ["call", "check"])
    with pytest.raises(ValueError, match="3 actions"):
        task.replay("0", ["check", "call", "call"])


def test_held_out_seeds_are_not_trained_on() -> None:
    task = make_task("kuhn_poker", num_eval_prompts=20, seed=0)
    assert {p.reference for p in task.eval_set}.isdisjoint({p.reference for p in task.train_set})
    prompt = task.sample_prompt()
    assert KuhnPokerEnvironment(int(prompt.reference)).reset() == prompt.prompt


def test_a_single_turn_task_is_the_one_step_case() -> None:
    task = make_task("arithmetic_mod10", num_eval_prompts=20, seed=0)
    for prompt in task.train_set[:10]:
        for completion in (prompt.reference, "7", prompt.reference + "1"):
            environment = single_turn_environment(task, prompt.prompt, prompt.reference)
            assert environment.reset() == prompt.prompt
            assert replay(environment, [completion], 1).reward == task.score(completion, prompt.reference)
