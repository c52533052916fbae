"""Multi-turn episodes against real parts: the worker's episode path (services/rollout/episodes.py) plays
Kuhn poker with the real TorchEngine on a tiny model, and the reward service's scorer replays those
episodes from the token ids in its verifier process and gets the same rewards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.episodes import run_episodes, start_episode
from engines.interface import Sampling
from engines.torch_engine import TorchEngine
from services.learner.evaluate import evaluate_greedy
from services.reward.decode import CompletionDecoder, InvalidTokensError
from services.reward.scoring import GroupScorer
from services.rollout.episodes import EpisodeRunner, build_episode_group
from shared.config import TaskConfig
from shared.messages import EnvironmentSpec, RolloutGroup, TaskGroup, pack_int32, unpack_int32
from shared.tasks.poker import KuhnPokerEnvironment, KuhnPokerTask
from shared.verifier_pool import VerifierPool

pytestmark = pytest.mark.integration
torch.set_num_threads(1)

MAX_NEW_TOKENS = 6
SEEDS = ("0", "5")  # Q first to act against K (a check meets a bet: two turns), K second against Q (one turn)


@pytest.fixture
def poker_model_dir(poker_policy_dir: Path) -> Path:
    return poker_policy_dir


@pytest.fixture(scope="module")
def verifiers() -> Iterator[VerifierPool]:
    pool = VerifierPool(TaskConfig(name="kuhn_poker"), timeout_s=30.0).start()
    yield pool
    pool.close()


def poker_task(seed: str) -> TaskGroup:
    return TaskGroup(
        run_id="poker",
        task_id=f"t{seed}",
        task_name="kuhn_poker",
        prompt=KuhnPokerEnvironment(int(seed)).reset(),
        num_samples=8,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=1.0,
        environment=EnvironmentSpec(state=seed, max_turns=KuhnPokerTask.max_turns),
    )


def play_groups(model_dir: Path) -> list[RolloutGroup]:
    torch.manual_seed(0)
    engine = TorchEngine(model_dir)
    runner = EpisodeRunner(engine, TaskConfig(name="kuhn_poker"))
    tasks = [poker_task(seed) for seed in SEEDS]
    episodes = runner.play(tasks)
    return [build_episode_group(task, group, "w-test", 0, 0.1) for task, group in zip(tasks, episodes, strict=True)]


def test_the_worker_plays_poker_episodes_with_the_torch_engine(poker_model_dir: Path) -> None:
    groups = [RolloutGroup.decode(group.encode()) for group in play_groups(poker_model_dir)]
    first_to_act, second = groups
    encode = CompletionDecoder(poker_model_dir, MAX_NEW_TOKENS).encode_observation
    bet_ids = encode("opp=bets;pot=3;fold/call?")
    num_two_turn = 0
    for tokens, mask in zip(first_to_act.sample_tokens(), first_to_act.sample_masks(), strict=True):
        # a random model's text is mostly unparsable: the fallback checks, K bets, a second turn follows
        env_ids = tokens[~mask].tolist()
        assert env_ids in ([], bet_ids)
        num_two_turn += bool(env_ids)
    assert num_two_turn > 0
    for tokens, mask in zip(second.sample_tokens(), second.sample_masks(), strict=True):
        assert mask.all() and len(tokens) <= MAX_NEW_TOKENS  # facing the opponent's bet, one decision ends it
    for group, seed in zip(groups, SEEDS, strict=True):
        task = KuhnPokerTask(num_eval_prompts=20, seed=0)
        decoder = CompletionDecoder(poker_model_dir, MAX_NEW_TOKENS)
        replays = [task.replay(seed, episode.actions).reward for episode in decoder.decode_episodes(group, 2)]
        assert group.env_rewards == replays
        logprobs = np.concatenate(group.sample_logprobs())
        assert (logprobs[np.concatenate(group.sample_masks())] < 0).all()  # model tokens carry their log-prob


def test_the_reward_service_replay_agrees_with_the_workers_episodes(
    poker_model_dir: Path, verifiers: VerifierPool
) -> None:
    scorer = GroupScorer("kuhn_poker", CompletionDecoder(poker_model_dir, MAX_NEW_TOKENS), verifiers, max_turns=2)
    for group, seed in zip(play_groups(poker_model_dir), SEEDS, strict=True):
        assert scorer.replay(group, seed, 2) == group.env_rewards
    assert not scorer.env_reward_mismatches_by_worker
    assert not scorer.text_mismatches_by_worker  # the worker's texts are what its ids decode to


def test_a_worker_claimed_reward_is_overwritten_and_forged_observations_are_refused(
    poker_model_dir: Path, verifiers: VerifierPool
) -> None:
    scorer = GroupScorer("kuhn_poker", CompletionDecoder(poker_model_dir, MAX_NEW_TOKENS), verifiers, max_turns=2)
    group = play_groups(poker_model_dir)[0]
    liar = group.model_copy(update={"env_rewards": [1.0] * group.num_samples})
    assert scorer.replay(liar, "0", 2) == group.env_rewards
    assert scorer.env_reward_mismatches_by_worker["w-test"] == sum(r != 1.0 for r in group.env_rewards) > 0

    ids = unpack_int32(group.completion_token_ids).copy()
    mask = np.concatenate(group.sample_masks())
    pot_digit = CompletionDecoder(poker_model_dir, MAX_NEW_TOKENS).encode_observation("3")[0]
    other_digit = CompletionDecoder(poker_model_dir, MAX_NEW_TOKENS).encode_observation("9")[0]
    forged_at = np.flatnonzero(~mask & (ids == pot_digit))
    assert forged_at.size  # some sample saw the bet
    ids[forged_at] = other_digit  # "pot=9": the model would be trained after an observation never shown
    forged = RolloutGroup.decode(group.model_copy(update={"completion_token_ids": pack_int32(ids)}).encode())
    with pytest.raises(InvalidTokensError, match="not the observations the replay shows"):
        scorer.replay(forged, "0", 2)


def test_held_out_evaluation_plays_greedy_episodes(poker_model_dir: Path) -> None:
    engine = TorchEngine(poker_model_dir)
    task = KuhnPokerTask(num_eval_prompts=20, seed=0)
    result = evaluate_greedy(engine, task, max_new_tokens=MAX_NEW_TOKENS)

    episodes = [
        start_episode(engine, item.input, task.make_environment(item.reference), 2, MAX_NEW_TOKENS)
        for item in task.eval_set
    ]
    run_episodes(engine, episodes, Sampling(1, MAX_NEW_TOKENS, 1.0, greedy=True))
    replayed = [task.replay(item.reference, e.actions).reward for item, e in zip(task.eval_set, episodes, strict=True)]
    assert result.num_prompts == 20
    assert result.reward_mean == pytest.approx(sum(replayed) / 20)
    assert result.accuracy == sum(reward == 1.0 for reward in replayed) / 20
