"""Multi-turn episodes played as rows of a continuous batch (services/rollout/continuous_tasks.py), on both
engines, with Kuhn poker and a tiny random character model (fp32), against batch mode's `run_episodes` and a
plain transformers forward:

- with fixed weights, each turn a row: the same episodes as batch mode (tokens, masks, observations, texts,
  rewards; log-probs to ATOL) when both key their turns with the same seeds. Workers do not key episodes
  (neither mode: the learner checks keyed sampling for single-turn groups only), so without seeds the two
  modes draw different random tokens and only this, what follows from the tokens drawn, can be compared;
- versions loaded mid-episode: a turn admitted after a load starts on it, a turn in flight records the token
  where it took over; the group's version_changes (completion index space, observations included) give every
  model token the version whose forward over its context reproduces its behaviour log-prob; policy_version is
  the oldest; the group validates and the reward service's replay scores it;
- other tasks' rows decode while an episode is between turns: single-turn groups complete meanwhile;
- an observation the engine cannot encode fails its task alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save as safetensors_save

from engines.episodes import Episode, run_episodes
from engines.interface import InferenceEngine, Sampling, UnencodablePromptError
from services.reward.decode import CompletionDecoder
from services.reward.scoring import GroupScorer
from services.rollout.continuous_tasks import ContinuousTasks, EpisodesInFlight, SamplesInFlight, TaskInFlight
from services.rollout.episodes import EpisodeRunner
from shared.config import TaskConfig
from shared.messages import EnvironmentSpec, RolloutGroup, TaskGroup
from shared.tasks.environment import StepResult
from shared.tasks.poker import KuhnPokerEnvironment, KuhnPokerTask
from shared.verifier_pool import VerifierPool
from shared.work_api import LeasedTask
from tests.hf_folders import build_char_folder
from tests.keyed_checks import build_cpu_engine, load_reference
from tests.vllm_required import require_vllm

torch.set_num_threads(1)

MAX_NEW_TOKENS = 6
TEMPERATURE = 1.0
SEED = 4321
ATOL = 1e-4  # fp32 engines against fp32 transformers, other batch shapes: differences ~1e-6
TIED_OUTPUT_KEY = "lm_head.weight"
DEALS = ("0", "4", "5")  # first to act with Q and J (a check meets a bet: two turns), second with K
TWO_TURN_DEAL = "0"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_folder(
        tmp_path_factory.mktemp("poker"), max_position_embeddings=128, alphabet=KuhnPokerTask.alphabet
    )


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


@pytest.fixture(scope="module")
def weights(folder: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Three versions: the folder's weights and two perturbed copies."""
    original = load_reference(folder).state_dict()
    versions = {3: {k: v for k, v in original.items() if k != TIED_OUTPUT_KEY}}
    for version in (4, 5):
        generator = torch.Generator().manual_seed(version)
        versions[version] = {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in versions[3].items()}
    return versions


@pytest.fixture(scope="module")
def verifiers() -> Iterator[VerifierPool]:
    pool = VerifierPool(TaskConfig(name="kuhn_poker"), timeout_s=30.0).start()
    yield pool
    pool.close()


def load(engine: InferenceEngine, weights: dict[int, dict[str, torch.Tensor]], version: int) -> None:
    blob = safetensors_save({k: v.contiguous() for k, v in weights[version].items()})
    engine.load_weights(blob, policy_version=version)


def poker_task(deal: str, num_samples: int = 4) -> TaskGroup:
    return TaskGroup(
        run_id="continuous-episodes",
        task_id=f"poker-{deal}",
        task_name="kuhn_poker",
        prompt=KuhnPokerEnvironment(int(deal)).reset(),
        num_samples=num_samples,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        environment=EnvironmentSpec(state=deal, max_turns=KuhnPokerTask.max_turns),
    )


def single_turn_task(index: int, max_new_tokens: int = 2) -> TaskGroup:
    """A task without an environment (one row per sample); its prompt in the poker alphabet."""
    return TaskGroup(
        run_id="continuous-episodes",
        task_id=f"single-{index}",
        task_name="kuhn_poker",
        prompt=KuhnPokerEnvironment(index).reset(),
        num_samples=2,
        max_new_tokens=max_new_tokens,
        temperature=TEMPERATURE,
    )


def lease_of(task: TaskGroup) -> LeasedTask:
    return LeasedTask(lease_id=f"lease-{task.task_id}", task=task)


def run_to_end(tasks: ContinuousTasks, max_steps: int = 500) -> list[TaskInFlight]:
    completed: list[TaskInFlight] = []
    for _ in range(max_steps):
        if not tasks.in_flight:
            return completed
        stepped = tasks.step()
        assert not stepped.failed
        completed += stepped.completed
    raise AssertionError("the tasks did not finish")


def episodes_of(task: TaskInFlight) -> list[Episode]:
    assert isinstance(task, EpisodesInFlight)
    return task.episodes


def test_episodes_played_turn_by_turn_as_rows_are_the_episodes_batch_mode_plays(
    engine: InferenceEngine, weights: dict[int, dict[str, torch.Tensor]]
) -> None:
    """Keyed with the same seeds, so that both modes draw the same tokens (module docstring)."""
    load(engine, weights, 3)
    runner = EpisodeRunner(engine, TaskConfig(name="kuhn_poker"))
    tasks = [poker_task(deal) for deal in DEALS]
    seeds = [SEED + 100 * i for i in range(len(tasks))]

    batch_played = [runner.start(task) for task in tasks]
    run_episodes(
        engine,
        [episode for group in batch_played for episode in group],
        Sampling(1, MAX_NEW_TOKENS, TEMPERATURE),
        sampling_seeds=[seed + j for seed, task in zip(seeds, tasks, strict=True) for j in range(task.num_samples)],
    )

    continuous = ContinuousTasks(engine, max_rows=5, episode_runner=lambda: runner)  # fewer rows than episodes
    admitted = [continuous.admit(lease_of(task), episode_seed=seed) for task, seed in zip(tasks, seeds, strict=True)]
    completed = run_to_end(continuous)

    assert sorted(task.number for task in completed) == [task.number for task in admitted]
    num_two_turn = 0
    for task, want_group in zip(admitted, batch_played, strict=True):
        for got, want in zip(episodes_of(task), want_group, strict=True):
            assert (got.token_ids, got.mask, got.actions, got.text) == (
                want.token_ids,
                want.mask,
                want.actions,
                want.text,
            )
            assert (got.reward, got.done, got.truncated, got.finish_reason) == (
                want.reward,
                want.done,
                want.truncated,
                want.finish_reason,
            )
            assert got.prompt_token_ids == want.prompt_token_ids
            assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=ATOL)
            num_two_turn += got.num_turns == 2
        group = RolloutGroup.decode(task.group("w-test").encode())
        assert group.policy_version == engine.policy_version and not group.version_changes
        assert group.is_masked
    assert num_two_turn > 0  # some episodes took a second turn after an observation


def model_logprobs(references: dict[int, Any], episode: Episode) -> dict[int, np.ndarray]:
    """Per version: (N,) log_softmax(logits / T) of each completion token given everything before it."""
    ids = torch.tensor([episode.prompt_token_ids + episode.token_ids])
    num_prompt = len(episode.prompt_token_ids)
    result = {}
    for version, reference in references.items():
        with torch.no_grad():
            logits = reference(input_ids=ids).logits[0, num_prompt - 1 : -1].float()
        logprobs = torch.log_softmax(logits / TEMPERATURE, dim=-1)
        result[version] = logprobs.gather(-1, torch.tensor(episode.token_ids)[:, None]).squeeze(-1).numpy()
    return result


def test_versions_loaded_mid_episode_are_recorded_in_the_groups_completion_index_space(
    engine: InferenceEngine,
    folder: Path,
    weights: dict[int, dict[str, torch.Tensor]],
    verifiers: VerifierPool,
) -> None:
    """Version 4 lands when some episodes have ended their first turn (their second turn, queued, starts on
    it), version 5 two steps later (second turns in flight take it mid-turn). Turns are not keyed (the
    worker's way)."""
    load(engine, weights, 3)
    runner = EpisodeRunner(engine, TaskConfig(name="kuhn_poker"))
    continuous = ContinuousTasks(engine, max_rows=8, episode_runner=lambda: runner)
    tasks = [continuous.admit(lease_of(poker_task(TWO_TURN_DEAL, num_samples=8)))]
    (task,) = tasks
    completed = []
    for _ in range(100):
        stepped = continuous.step()
        completed += stepped.completed
        if any(episode.num_turns == 1 and not episode.done for episode in episodes_of(task)):
            break
    else:
        raise AssertionError("no episode went on to a second turn")
    load(engine, weights, 4)
    for _ in range(2):
        completed += continuous.step().completed
    load(engine, weights, 5)
    completed += run_to_end(continuous)
    assert completed == [task]

    group = RolloutGroup.decode(task.group("w-test").encode())  # the message's checks hold
    assert group.policy_version == 3 and group.newest_version == 5
    references = {version: load_reference(folder) for version in weights}
    for version, reference in references.items():
        reference.load_state_dict(weights[version], strict=False)
    lengths = [len(episode.token_ids) for episode in episodes_of(task)]
    token_versions = np.split(group.token_versions(), np.cumsum(lengths)[:-1])
    masks = group.sample_masks()
    num_turn_starts = num_mid_turn = 0
    for episode, versions, mask, logprobs in zip(
        episodes_of(task), token_versions, masks, group.sample_logprobs(), strict=True
    ):
        assert (mask == np.array(episode.mask, dtype=bool)).all()
        under = model_logprobs(references, episode)
        for version in set(versions[mask].tolist()):
            at = mask & (versions == version)  # the model's tokens this version sampled (observations: no matter)
            np.testing.assert_allclose(logprobs[at], under[version][at], atol=ATOL)
            for other in set(references) - {version}:  # and no other version gives those log-probs
                assert not np.allclose(logprobs[at], under[other][at], atol=1e-3)
        changes = np.flatnonzero(np.diff(versions)) + 1  # completion indices where the version changes
        assert (np.diff(versions) >= 0).all() and mask[changes].all()  # newer only, at model tokens
        num_turn_starts += int((~mask[changes - 1]).sum())  # a turn admitted after a load
        num_mid_turn += int(mask[changes - 1].sum())  # a turn in flight at a load
    assert num_turn_starts > 0 and num_mid_turn > 0
    assert min(int(versions[mask].min()) for versions, mask in zip(token_versions, masks, strict=True)) == 3

    scorer = GroupScorer("kuhn_poker", CompletionDecoder(folder, MAX_NEW_TOKENS), verifiers, max_turns=2)
    assert scorer.replay(group, TWO_TURN_DEAL, 2) == group.env_rewards  # the reward service accepts it
    assert not scorer.env_reward_mismatches_by_worker and not scorer.text_mismatches_by_worker


def test_other_tasks_rows_decode_while_an_episode_is_between_turns(torch_engine: InferenceEngine) -> None:
    runner = EpisodeRunner(torch_engine, TaskConfig(name="kuhn_poker"))
    continuous = ContinuousTasks(torch_engine, max_rows=8, episode_runner=lambda: runner)
    poker = continuous.admit(lease_of(poker_task(TWO_TURN_DEAL)), episode_seed=SEED)  # keyed: repeatable
    for index in range(2):
        continuous.admit(lease_of(single_turn_task(index)))
    completed_mid_episode: list[SamplesInFlight] = []
    poker_done = False
    next_index = 2
    for _ in range(200):
        if not continuous.in_flight:
            break
        stepped = continuous.step()
        between_turns = any(episode.num_turns == 1 and not episode.done for episode in episodes_of(poker))
        for task in stepped.completed:
            if isinstance(task, SamplesInFlight) and not poker_done:
                completed_mid_episode.append(task)
            poker_done |= task is poker
        if between_turns and continuous.room >= 2 and next_index < 6:  # new single-turn tasks meanwhile
            continuous.admit(lease_of(single_turn_task(next_index)))
            next_index += 1
    assert poker_done and not continuous.in_flight
    assert any(episode.num_turns == 2 for episode in episodes_of(poker))
    late = [task for task in completed_mid_episode if task.lease.task.task_id not in ("single-0", "single-1")]
    assert late, "tasks admitted after the episodes' first turns completed before the episodes did"


class BrokenObservations(KuhnPokerTask):
    """Kuhn poker whose deal "4" shows an observation outside the tokenizer's alphabet."""

    def make_environment(self, state: str) -> KuhnPokerEnvironment:
        environment = super().make_environment(state)
        if state != "4":
            return environment
        step = environment.step

        def broken_step(action: str) -> StepResult:
            result = step(action)
            return StepResult("ZZZ" + result.observation, result.reward, result.done) if not result.done else result

        environment.step = broken_step  # type: ignore[method-assign]
        return environment


def test_an_observation_the_engine_cannot_encode_fails_its_task_alone(torch_engine: InferenceEngine) -> None:
    runner = EpisodeRunner(torch_engine, TaskConfig(name="kuhn_poker"))
    runner.task = BrokenObservations(num_eval_prompts=20, seed=0)
    continuous = ContinuousTasks(torch_engine, max_rows=8, episode_runner=lambda: runner)
    good = continuous.admit(lease_of(poker_task("0")), episode_seed=SEED)
    broken = continuous.admit(lease_of(poker_task("4")), episode_seed=SEED)  # first to act with J: K bets after a check
    completed, failed = [], []
    for _ in range(200):
        if not continuous.in_flight:
            break
        stepped = continuous.step()
        completed += stepped.completed
        failed += stepped.failed
    assert completed == [good]
    ((lease, error),) = failed
    assert lease is broken.lease and isinstance(error, UnencodablePromptError)
    assert (continuous.batch.num_running, continuous.batch.num_waiting) == (0, 0)
