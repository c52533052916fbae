"""Held-out evaluation on the workers' engine, off the training thread (services/learner/evaluator.py):
the same completions as plain greedy decoding, one skipped handoff when the previous eval overruns the
budget, and an eval-thread error that reaches the caller. Tiny real models, no mocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.interface import Sampling, WeightsLoadError
from engines.torch_engine import TorchEngine
from services.learner.evaluate import evaluate_greedy
from services.learner.evaluator import EvalFailedError, Evaluator
from shared.config import TaskConfig
from shared.run_records import EvalRecord
from shared.tasks import make_task
from shared.tokenization import encode_prompt, eos_token_ids
from shared.verifier_pool import VerifierPool
from tests.gated_task import GatedTask
from tests.hanging_task import HangingTask
from tests.hf_folders import CHAT_TEMPLATE, ENDOFTEXT, IM_END, build_folder
from tests.polling import wait_for

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_folder(
        tmp_path_factory.mktemp("qwen3"),
        with_bos=True,
        chat_template=CHAT_TEMPLATE,
        generation_eos_tokens=(ENDOFTEXT, IM_END),
    )


def plain_greedy(model: torch.nn.Module, prompt_ids: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """One prompt, no batching, no padding, no cache: the whole prefix re-run for every new token."""
    tokens = list(prompt_ids)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tokens])).logits[0, -1]  # (V,)
        tokens.append(int(logits.argmax()))
        if tokens[-1] in eos:
            break
    return tokens[len(prompt_ids) :]


def test_engine_evaluation_gives_the_completions_of_plain_transformers_greedy_decoding(qwen3_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    task = make_task("arithmetic_mod10", num_eval_prompts=20, seed=0)  # prompts of 4 and 5 tokens: padding
    engine = TorchEngine(qwen3_dir)
    reference = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # weights unlike the folder's (the engine must decode with the loaded ones),
        torch.manual_seed(0)  # large enough that completions differ from prompt to prompt
        for parameter in reference.parameters():
            parameter.copy_(torch.randn_like(parameter))
        # <|im_end|> (an EOS from generation_config, not the tokenizer's) gets the output row of ":" and a
        # little more: rows stop where they would have said ":", the others run to max_new_tokens.
        embeddings = reference.get_input_embeddings().weight  # tied to the output head
        embeddings[engine.tokenizer.convert_tokens_to_ids(IM_END)] = (
            1.01 * embeddings[engine.tokenizer.convert_tokens_to_ids(":")]
        )
    engine.load_state_dict(reference.state_dict(), policy_version=3)
    eos = eos_token_ids(qwen3_dir, engine.tokenizer)

    max_new_tokens = 12
    samples = engine.generate([p.input for p in task.eval_set], Sampling(1, max_new_tokens, 1.0, greedy=True))
    expected = [
        plain_greedy(reference, encode_prompt(engine.tokenizer, p.input), max_new_tokens, eos) for p in task.eval_set
    ]
    assert [sample.token_ids for (sample,) in samples] == expected
    lengths = [len(ids) for ids in expected]
    assert min(lengths) < max_new_tokens == max(lengths)  # some rows stop at an EOS early, some do not

    result = evaluate_greedy(engine, task, max_new_tokens=max_new_tokens)
    texts = [engine.tokenizer.decode(ids[:-1] if ids[-1] in eos else ids) for ids in expected]
    rewards = [task.score(text, p.reference) for text, p in zip(texts, task.eval_set, strict=True)]
    assert (result.num_prompts, result.reward_mean) == (20, pytest.approx(sum(rewards) / 20))


def make_evaluator(policy_dir: Path, task: GatedTask, records: list[EvalRecord]) -> Evaluator:
    engine = TorchEngine(policy_dir)
    return Evaluator(engine, task, max_new_tokens=2, on_record=records.append, wall_s=lambda: 0.0)


def test_an_eval_that_overruns_the_budget_skips_the_next_one_instead_of_stalling_training(
    tiny_policy_dir: Path,
) -> None:
    task, records = GatedTask(num_eval_prompts=4, seed=0), []
    evaluator = make_evaluator(tiny_policy_dir, task, records)
    model = evaluator.engine.model  # any module with the policy's weights
    try:
        first = evaluator.submit(model, 0, max_wait_s=0.2)
        assert first.accepted and first.stall_s < 0.2  # the thread was idle: the snapshot is the stall
        second = evaluator.submit(model, 1, max_wait_s=0.2)  # the first one is stuck in scoring
        assert not second.accepted and 0.2 <= second.stall_s < 1.0
        assert records == [] and evaluator.take_finished() == []

        task.gate.set()
        assert evaluator.wait_idle(timeout_s=30)
        (record,) = evaluator.take_finished()
        assert records == [record]
        assert (record.eval_step, record.num_eval_prompts, record.eval_stall_s) == (0, 4, first.stall_s)
        third = evaluator.submit(model, 2, max_wait_s=0.2)  # idle again: accepted
        assert third.accepted
        wait_for(lambda: len(records) == 2, "the third eval's record")
        assert [r.eval_step for r in evaluator.take_finished()] == [2]
    finally:
        task.gate.set()
        evaluator.close()


def test_an_error_in_the_eval_thread_is_raised_on_the_callers_next_call(tiny_policy_dir: Path) -> None:
    task, records = GatedTask(num_eval_prompts=4, seed=0), []
    task.fail = True
    task.gate.set()
    evaluator = make_evaluator(tiny_policy_dir, task, records)
    try:
        assert evaluator.submit(evaluator.engine.model, 0, max_wait_s=1.0).accepted
        with pytest.raises(EvalFailedError, match="verifier broke") as raised:
            evaluator.wait_idle(timeout_s=30)
        assert isinstance(raised.value.__cause__, RuntimeError)
        with pytest.raises(EvalFailedError):  # and at every later handoff: never trained past silently
            evaluator.submit(evaluator.engine.model, 1, max_wait_s=1.0)
        assert records == []
    finally:
        evaluator.close()


def test_load_state_dict_checks_tensors_like_load_weights_and_keeps_the_old_ones(tiny_policy_dir: Path) -> None:
    engine = TorchEngine(tiny_policy_dir)
    state = {name: tensor.clone() for name, tensor in engine.model.state_dict().items()}
    engine.load_state_dict(state, policy_version=4)
    name = next(iter(state))
    with pytest.raises(WeightsLoadError, match="missing"):
        engine.load_state_dict({k: v for k, v in state.items() if k != name}, policy_version=5)
    with pytest.raises(WeightsLoadError, match="wrong shape"):
        engine.load_state_dict({**state, name: state[name][:1]}, policy_version=5)
    assert engine.policy_version == 4


def test_a_verifier_that_hangs_counts_its_prompts_as_wrong_instead_of_wedging_the_eval(tiny_policy_dir: Path) -> None:
    records: list[EvalRecord] = []
    verifier = VerifierPool(TaskConfig(name="tests.hanging_task:HangingTask", num_eval_prompts=2), timeout_s=0.5)
    evaluator = Evaluator(
        TorchEngine(tiny_policy_dir),
        HangingTask(num_eval_prompts=2, seed=0),
        max_new_tokens=2,
        on_record=records.append,
        wall_s=lambda: 0.0,
        verifier=verifier,  # started by the evaluator, closed with it
    )
    try:
        assert verifier.pid is not None
        assert evaluator.submit(evaluator.engine.model, 0, max_wait_s=1.0).accepted
        assert evaluator.wait_idle(timeout_s=60)  # each prompt's verifier killed after 0.5 s
        (record,) = evaluator.take_finished()
        assert (record.num_eval_prompts, record.num_verifier_failures, record.eval_accuracy) == (2, 2, 0.0)
        assert verifier.num_replaced == 2
    finally:
        evaluator.close()
    assert verifier.pid is None
