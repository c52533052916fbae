"""Heads-up Kuhn poker against a fixed opponent, on pokerkit's engine (docs/environments.md#poker).

The game (pokerkit's `KuhnPoker`: its state machine deals, enforces the betting rules and evaluates the
showdown; nothing here re-implements them): a three-card deck J < Q < K, each player antes 1 chip and
gets one card, one betting round with a single bet of 1 chip. The player in seat 0 acts first.

A prompt is a seeded deal: seed -> (the model's card, the opponent's card, the model's seat). The task's
prompt universe is seeds 0..NUM_DEALS-1; the held-out prompts are other seeds than the training ones
(the deals repeat: Kuhn has 6 deals x 2 seats, so held-out measures play, not memorised seeds).

The opponent plays a fixed, aggressive hand-strength rule: it bets whenever it can (any card), and facing
a bet it calls with Q or K and folds J. Against it, checking and folding (the fallback below) averages
0.25, calling every bet 0.50, and the best response (fold J, call with Q and K) 0.583 (reward units
below; tests/unit/test_poker.py enumerates the strategies). A more cautious opponent (bet K, check-call
Q, check-fold J) leaves almost nothing to learn: always checking and folding gets 0.50 against it, the
best response 0.54.

The model acts by text: its turn, lower-cased, is the legal action whose name (`check`, `bet`, `fold`,
`call`) appears first in it; with no name in it, the legal action whose first letter appears first (the
legal actions always have distinct first letters: check/bet facing no bet, fold/call facing one); with
neither, the fallback action: check when nobody bet, else fold. Letters count so that a tiny model
sampling characters explores every action (counting only a turn-initial letter, 2 chances in 36 per
turn, the demo-sized model's training reward went from 0.26 to 0.37 in 300 steps; docs/environments.md). The model acts at most twice
(check, then facing the opponent's bet), so `max_turns = 2` always ends the hand; a truncated episode
(context full) plays the fallback to the end.

Reward: the chips the model won, in big blinds (the ante is the blind of this game: 1 chip = 1 bb),
from -2 to +2, mapped linearly to [0, 1]: reward = (bb_won + 2) / 4 (fold at once: 0.25; win the
antes: 0.75; win a called bet: 1.0).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from shared.tasks.base import TaskPrompt
from shared.tasks.environment import Environment, EnvironmentTask, StepResult

if TYPE_CHECKING:
    from pokerkit import State

RANKS = ("J", "Q", "K")  # ascending
SUIT = "s"  # pokerkit's Kuhn deck is J, Q, K of spades
ANTE_CHIPS = 1  # = 1 big blind
MAX_WIN_BB = 2  # ante + the one bet
NUM_DEALS = 1000


def new_hand() -> State:
    """A fresh Kuhn poker hand on pokerkit, antes posted, cards not dealt. pokerkit is imported here, not at
    the top: registering the task (shared/tasks/__init__.py) must not need it where no one plays poker."""
    from pokerkit import Automation, KuhnPoker

    automations = (  # everything but the dealing and the players' decisions
        Automation.ANTE_POSTING,
        Automation.BET_COLLECTION,
        Automation.BLIND_OR_STRADDLE_POSTING,
        Automation.HOLE_CARDS_SHOWING_OR_MUCKING,
        Automation.HAND_KILLING,
        Automation.CHIPS_PUSHING,
        Automation.CHIPS_PULLING,
    )
    return KuhnPoker.create_state(automations)


def bb_to_reward(bb_won: float) -> float:
    """-2..+2 big blinds -> [0, 1], linearly."""
    return (bb_won + MAX_WIN_BB) / (2 * MAX_WIN_BB)


def parse_action(text: str, legal: list[str]) -> str:
    """The legal action `text` names first (by word, else by first letter), else the fallback: check, else fold."""
    said = text.lower()
    for names in (legal, [name[0] for name in legal]):  # words first: "I call" is a call, not a check
        found = [(said.find(name), index) for index, name in enumerate(names) if name in said]
        if found:
            return legal[min(found)[1]]
    return "check" if "check" in legal else "fold"


def deal(seed: int) -> tuple[str, str, int]:
    """(the model's rank, the opponent's rank, the model's seat) of deal `seed`."""
    rng = random.Random(seed)
    hero_rank, opponent_rank = rng.sample(RANKS, 2)
    return hero_rank, opponent_rank, rng.randrange(2)


class KuhnPokerEnvironment(Environment):
    def __init__(self, seed: int) -> None:
        self.hero_rank, self.opponent_rank, self.hero_seat = deal(seed)
        self.state: State | None = None

    def reset(self) -> str:
        self.state = new_hand()
        ranks = {self.hero_seat: self.hero_rank, 1 - self.hero_seat: self.opponent_rank}
        for seat in range(2):  # pokerkit deals hole cards in seat order
            self.state.deal_hole(ranks[seat] + SUIT)
        return f"kuhn;card={self.hero_rank};" + self._play_opponent() + self._ask()

    def step(self, action: str) -> StepResult:
        self._apply(parse_action(action, self.legal_actions()))
        notes = self._play_opponent()
        if self.done:
            return StepResult(observation="", reward=self.reward(), done=True)
        return StepResult(observation=notes + self._ask(), reward=0.0, done=False)

    def truncate(self) -> float:
        while not self.done:
            self._apply(parse_action("", self.legal_actions()))
            self._play_opponent()
        return self.reward()

    @property
    def done(self) -> bool:
        return not self._state.status

    def legal_actions(self) -> list[str]:
        state = self._state
        if state.checking_or_calling_amount:
            return ["fold", "call"]
        return ["check", "bet"] if state.can_complete_bet_or_raise_to() else ["check"]

    def bb_won(self) -> float:
        return self._state.payoffs[self.hero_seat] / ANTE_CHIPS

    def reward(self) -> float:
        return bb_to_reward(self.bb_won())

    @property
    def _state(self) -> State:
        if self.state is None:
            raise RuntimeError("reset() the environment before stepping it")
        return self.state

    def _apply(self, name: str) -> None:
        state = self._state
        if name == "fold":
            state.fold()
        elif name == "bet":
            state.complete_bet_or_raise_to()
        else:  # check or call
            state.check_or_call()

    def _play_opponent(self) -> str:
        """The opponent acts while it is its turn; returns what the model sees of it."""
        notes = ""
        while not self.done and self._state.actor_index != self.hero_seat:
            name = self._opponent_action()
            self._apply(name)
            notes += f"opp={'checks' if name == 'check' else name + 's'};"
        return notes

    def _opponent_action(self) -> str:
        if self._state.checking_or_calling_amount:  # facing the model's bet
            return "fold" if self.opponent_rank == "J" else "call"
        return "bet"

    def _ask(self) -> str:
        return f"pot={self._state.total_pot_amount};{'/'.join(self.legal_actions())}?"


class KuhnPokerTask(EnvironmentTask):
    name = "kuhn_poker"
    # every character of an observation or an action (tests/unit/test_poker.py checks all episodes); terse,
    # without spaces: a character tokenizer spends one position per character
    alphabet = "".join(sorted(set("kuhn;card=JQK;opp=checks/bets/calls/folds;pot=0123456789;check/bet?fold/call?")))
    max_turns = 2

    def all_prompts(self) -> list[TaskPrompt]:
        return [TaskPrompt(KuhnPokerEnvironment(seed).reset(), str(seed)) for seed in range(NUM_DEALS)]

    def make_environment(self, state: str) -> KuhnPokerEnvironment:
        if not state.isdigit():
            raise ValueError(f"kuhn_poker: state {state[:32]!r} is not a deal seed")
        return KuhnPokerEnvironment(int(state))
