"""Any local HF causal-LM folder works (issue 9): one pad fallback, one EOS set, one prompt encoding,
chat templates, and clear errors, shared by the learner and the workers (shared/tokenization.py).
Folders are built locally (tests/hf_folders.py): byte-level BPE tokenizers, tiny random Qwen3/GPT-2."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engines.interface import PromptTooLongError, Sampling, UnencodablePromptError
from engines.torch_engine import TorchEngine
from services.learner.batch import tensorize
from services.learner.evaluate import evaluate_greedy
from shared.messages import ChatMessage, TaskGroup
from shared.tasks import TaskAdapter, TaskPrompt
from shared.tokenization import (
    ChatTemplateError,
    ModelFolderError,
    PromptEncodingError,
    PromptInput,
    check_model_folder,
    encode_prompt,
    eos_token_ids,
    model_fingerprint,
    pad_token_id,
)
from tests.hf_folders import (
    BROKEN_CHAT_TEMPLATE,
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    build_folder,
)
from tests.selfplay import sample_scored_groups

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def llama_like_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """No pad token, a BOS post-processor, a chat template, and generation_config EOS
    [<|endoftext|>, <|im_end|>] (the tokenizer's own EOS is <|endoftext|>)."""
    return build_folder(
        tmp_path_factory.mktemp("llama_like"),
        with_pad=False,
        with_bos=True,
        chat_template=CHAT_TEMPLATE,
        generation_eos_tokens=(ENDOFTEXT, IM_END),
    )


@pytest.fixture(scope="module")
def tokenizer(llama_like_dir: Path):  # type: ignore[no-untyped-def]  # transformers' tokenizer types
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama_like_dir)


class OneAnswerTask(TaskAdapter):
    """Every prompt's answer is "7": lets a scripted model answer correctly."""

    name = "one_answer"
    alphabet = "0123456789+="

    def all_prompts(self) -> list[TaskPrompt]:
        return [TaskPrompt(f"{a}+{b}=", "7") for a in range(3) for b in range(3)]

    def score(self, completion: str, reference: str) -> float:
        return 1.0 if completion == reference else 0.0


class ScriptedLM(torch.nn.Module):
    """Answers "7", then emits `stop_id`, through the engine's KV-cache calls (prefill, then one token per
    step: the answer depends on the last token only); records the prompts of the prefill, pads dropped."""

    def __init__(self, answer_id: int, stop_id: int, vocab_size: int) -> None:
        super().__init__()
        self.answer_id, self.stop_id, self.vocab_size = answer_id, stop_id, vocab_size
        self.seen_prompts: list[list[int]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: object) -> object:
        if not self.seen_prompts:  # the prefill: left-padded prompts
            rows = zip(input_ids.tolist(), attention_mask.tolist(), strict=True)
            self.seen_prompts = [[t for t, m in zip(ids, mask, strict=True) if m] for ids, mask in rows]
        logits = torch.zeros(*input_ids.shape, self.vocab_size)
        last = input_ids[:, -1]
        logits[:, -1, self.answer_id] = torch.where(last == self.answer_id, 0.0, 10.0)
        logits[:, -1, self.stop_id] = torch.where(last == self.answer_id, 10.0, 0.0)
        return SimpleNamespace(logits=logits, past_key_values=SimpleNamespace(batch_repeat_interleave=lambda n: None))


# 1. a tokenizer without a pad token
def test_a_tokenizer_without_pad_pads_with_eos_in_the_engine_and_the_learner(
    llama_like_dir: Path, tokenizer: object
) -> None:
    engine = TorchEngine(llama_like_dir)
    assert engine.tokenizer.pad_token_id is None
    assert engine.pad_token_id == pad_token_id(engine.tokenizer) == engine.tokenizer.eos_token_id

    groups = engine.generate(["1+2=", "12+3="], Sampling(2, 3, 1.0))
    assert [len(g) for g in groups] == [2, 2]
    # The learner's batch of such groups: tensorize used to get None from tokenizer.pad_token_id.
    scored = sample_scored_groups(
        engine.model,
        engine.tokenizer,
        OneAnswerTask(num_eval_prompts=1, seed=0),
        [TaskPrompt("1+2=", "7"), TaskPrompt("12+3=", "7")],
        run_id="pad",
        policy_version=0,
        sampling=Sampling(2, 3, 1.0),
    )
    batch = tensorize(scored, pad_token_id(engine.tokenizer), normalize_advantage_by_std=True)
    assert batch.input_ids.shape[0] == 4


# 3. evaluation stops at every EOS the workers stop at
def test_eval_stops_at_the_generation_config_eos_like_the_workers(llama_like_dir: Path, tokenizer: object) -> None:
    from transformers import PreTrainedTokenizerBase

    assert isinstance(tokenizer, PreTrainedTokenizerBase)
    eos = eos_token_ids(llama_like_dir, tokenizer)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    assert eos == {tokenizer.eos_token_id, im_end}
    engine = TorchEngine(llama_like_dir)
    assert set(engine.eos_token_ids.tolist()) == eos

    # A policy that answers "7" and ends with <|im_end|> (not the tokenizer's eos): full marks.
    answer_id = tokenizer("7", add_special_tokens=False)["input_ids"][0]
    engine.model = ScriptedLM(answer_id, im_end, len(tokenizer))
    task = OneAnswerTask(num_eval_prompts=4, seed=0)
    result = evaluate_greedy(engine, task, max_new_tokens=3)
    assert result.accuracy == 1.0


# 4. one encoding path for training and evaluation
def test_eval_encodes_prompts_exactly_as_the_workers_do(llama_like_dir: Path, tokenizer: object) -> None:
    from transformers import PreTrainedTokenizerBase

    assert isinstance(tokenizer, PreTrainedTokenizerBase)
    task = OneAnswerTask(num_eval_prompts=4, seed=0)
    engine = TorchEngine(llama_like_dir)
    worker_ids = engine.encode_prompts([item.input for item in task.eval_set])
    assert all(ids[0] == tokenizer.bos_token_id for ids in worker_ids)  # this tokenizer adds a BOS

    answer_id = tokenizer("7", add_special_tokens=False)["input_ids"][0]
    model = ScriptedLM(answer_id, tokenizer.eos_token_id, len(tokenizer))
    engine.model = model
    evaluate_greedy(engine, task, max_new_tokens=2)
    assert sorted(model.seen_prompts) == sorted(worker_ids)


# 5. chat templates
def test_chat_messages_are_rendered_with_the_chat_template(llama_like_dir: Path, tokenizer: object) -> None:
    from transformers import PreTrainedTokenizerBase

    assert isinstance(tokenizer, PreTrainedTokenizerBase)
    prompt = PromptInput(
        "1+2=", (ChatMessage(role="system", content="answer"), ChatMessage(role="user", content="1+2="))
    )
    ids = encode_prompt(tokenizer, prompt)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == f"{IM_START}system\nanswer{IM_END}\n{IM_START}user\n1+2={IM_END}\n{IM_START}assistant\n"
    # raw text (the demo tasks) stays raw: the tokenizer's BOS, no template
    assert tokenizer.decode(encode_prompt(tokenizer, "1+2="), skip_special_tokens=False) == "<s>1+2="

    engine = TorchEngine(llama_like_dir)
    (group,) = engine.generate([prompt], Sampling(1, 1, 1.0))
    assert group[0].prompt_token_ids == ids


def test_chat_messages_fall_back_to_their_text_only_without_a_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = build_folder(tmp_path / "base", chat_template=None)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = PromptInput("1+2=", (ChatMessage(role="user", content="1+2="),))
    assert encode_prompt(tokenizer, prompt) == encode_prompt(tokenizer, "1+2=")


def test_a_broken_chat_template_is_a_clear_error_and_a_dead_letter_at_the_worker(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = build_folder(tmp_path / "broken", chat_template=BROKEN_CHAT_TEMPLATE)
    prompt = PromptInput("1+2=", (ChatMessage(role="user", content="1+2="),))
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        encode_prompt(AutoTokenizer.from_pretrained(folder), prompt)
    # at the worker: an EngineError, which the worker dead-letters (that task alone)
    with pytest.raises(UnencodablePromptError, match="chat template failed"):
        TorchEngine(folder).generate([prompt], Sampling(1, 1, 1.0))


def test_a_prompt_longer_than_the_context_is_an_engine_error(tmp_path: Path) -> None:
    folder = build_folder(tmp_path / "short", max_position_embeddings=16)
    with pytest.raises(PromptTooLongError, match="exceed the context of 16"):
        TorchEngine(folder).generate(["0+1=1 2+3=5 4+5=9 6+7=3 8+9=7"], Sampling(1, 4, 1.0))


# 7. the folder is checked, and fingerprinted
def test_a_folder_that_is_not_a_causal_lm_with_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match="does not exist"):
        check_model_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFolderError, match="no config.json"):
        check_model_folder(tmp_path / "empty")
    folder = build_folder(tmp_path / "gpt2", architecture="gpt2")
    check_model_folder(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match="no tokenizer"):
        check_model_folder(folder)
    (tmp_path / "encoder").mkdir()
    (tmp_path / "encoder" / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(ModelFolderError, match="not a causal LM"):
        check_model_folder(tmp_path / "encoder")


def test_the_fingerprint_changes_with_the_tokenizer_or_the_architecture_only(tmp_path: Path) -> None:
    first = build_folder(tmp_path / "a", chat_template=CHAT_TEMPLATE)
    same = build_folder(tmp_path / "b", chat_template=CHAT_TEMPLATE)
    assert model_fingerprint(first) == model_fingerprint(same)
    (same / "model.safetensors").write_bytes(b"other weights: not part of the fingerprint")
    assert model_fingerprint(first) == model_fingerprint(same)
    other_tokenizer = build_folder(tmp_path / "c", chat_template=None)
    assert model_fingerprint(first) != model_fingerprint(other_tokenizer)
    other_architecture = build_folder(tmp_path / "d", chat_template=CHAT_TEMPLATE, architecture="qwen2")
    assert model_fingerprint(first) != model_fingerprint(other_architecture)


def test_chat_messages_travel_in_the_task_group_to_the_worker() -> None:
    messages = [ChatMessage(role="system", content="answer"), ChatMessage(role="user", content="1+2=")]
    task = TaskGroup(
        run_id="r",
        task_id="t",
        task_name="n",
        prompt="1+2=",
        messages=messages,
        num_samples=2,
        max_new_tokens=2,
        temperature=1.0,
    )
    decoded = TaskGroup.decode(task.encode())
    assert PromptInput.of_task(decoded) == PromptInput("1+2=", tuple(messages))
    raw = TaskGroup(
        run_id="r", task_id="t", task_name="n", prompt="1+2=", num_samples=2, max_new_tokens=2, temperature=1.0
    )
    assert PromptInput.of_task(TaskGroup.decode(raw.encode())) == PromptInput("1+2=")


def test_a_chat_message_the_tokenizer_cannot_represent_is_refused(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)  # the demo's character tokenizer, given a template
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    with pytest.raises(PromptEncodingError, match="cannot represent"):
        encode_prompt(tokenizer, PromptInput("1+2=", (ChatMessage(role="user", content="one plus two"),)))
    assert encode_prompt(tokenizer, PromptInput("1+2=", (ChatMessage(role="user", content="1+2="),))) == [
        tokenizer.convert_tokens_to_ids(c) for c in "1+2="
    ]
