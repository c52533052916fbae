"""LoRA in the learner: the run file's [lora] section, peft adapters on a frozen base, the merged view
the evaluator takes, and checkpoints that hold the adapter only and resume it exactly."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from services.learner import lora
from services.learner.checkpoint import capture, load_checkpoint, save_checkpoint
from services.learner.policy import Policy
from services.learner.publish import publication_state
from services.learner.trainer import make_optimizer
from shared.config import GRPOConfig, LoraConfig, RunConfig
from shared.weight_channel import PEFT_PREFIX
from tests.hf_folders import build_char_folder
from tests.lora_policies import randomise_adapter
from tests.tiny_models import tiny_qwen2

torch.set_num_threads(1)

TARGETS = ("q_proj", "v_proj", "down_proj")


def lora_model(tied: bool = True, seed: int = 1) -> torch.nn.Module:
    """tiny_qwen2 with rank-4 adapters on TARGETS, B randomised so the adapter changes the policy."""
    model = lora.apply_lora(
        tiny_qwen2(vocab_size=20, tied=tied), LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=TARGETS)
    )
    randomise_adapter(model, seed, scale=0.2)
    return model


def test_the_lora_section_is_off_by_default_and_refuses_bad_values() -> None:
    assert RunConfig().lora.enabled is False
    assert RunConfig.model_validate({"lora": {"enabled": True, "rank": 16}}).lora.rank == 16
    for bad, message in (
        ({"rank": 0}, "greater than or equal to 1"),
        ({"alpha": 0}, "greater than 0"),
        ({"dropout": 1.0}, "less than 1"),
        ({"target_modules": []}, "at least 1"),
        ({"target_modules": ["q_proj", "q_proj"]}, "lists a name twice"),
        ({"target_modules": ["model.layers.*"]}, "module names like"),
        ({"rnak": 8}, "Extra inputs"),
    ):
        with pytest.raises(ValueError, match=message):
            RunConfig.model_validate({"lora": {"enabled": True, **bad}})


def test_only_the_adapters_train_and_the_optimizer_holds_nothing_else() -> None:
    model = lora_model()
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    assert len(trainable) == 2 * 2 * len(TARGETS)  # A and B, 2 layers, 3 targets
    optimizer = make_optimizer(model, GRPOConfig())
    assert sum(len(group["params"]) for group in optimizer.param_groups) == len(trainable)


def test_a_version_publishes_the_adapter_in_peft_file_names_only() -> None:
    model = lora_model()
    state = publication_state(model)
    assert len(state) == 2 * 2 * len(TARGETS)
    assert all(name.startswith(PEFT_PREFIX) and name.endswith((".lora_A.weight", ".lora_B.weight")) for name in state)
    assert state[f"{PEFT_PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 32)  # (r, in)
    assert state[f"{PEFT_PREFIX}model.layers.0.mlp.down_proj.lora_B.weight"].shape == (32, 4)  # (out, r)


def test_the_merged_state_is_peft_merge_and_unload_and_leaves_the_base_alone() -> None:
    model = lora_model(tied=False)
    base_q = model.model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    merged = lora.merged_state(model)
    reference = copy.deepcopy(model)
    plain = tiny_qwen2(vocab_size=20, tied=False)
    plain.load_state_dict(merged)  # plain HF names and shapes, strict
    ids = torch.tensor([[1, 5, 7, 3, 2]])
    with torch.no_grad():
        expected = reference(input_ids=ids).logits  # the LoRA model's forward: base + adapter, unmerged
        torch.testing.assert_close(plain(input_ids=ids).logits, expected, atol=1e-5, rtol=0)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.base_layer.weight, base_q)
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base_q)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ids = torch.tensor([[1, 5, 7, 3, 2]])
    optimizer.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def lora_policy(model_dir: Path, enabled: bool = True) -> Policy:
    """The learner's Policy on the folder's tiny model, with rank-4 adapters on TARGETS when `enabled`."""
    lora_config = LoraConfig(enabled=enabled, rank=4, alpha=8.0, target_modules=TARGETS)
    return Policy(model_dir, RunConfig(lora=lora_config, grpo=GRPOConfig(learning_rate=1e-2)))


def test_a_checkpoint_holds_the_adapter_and_optimizer_only_and_resumes_exactly(tmp_path: Path) -> None:
    model_dir = build_char_folder(tmp_path / "model")
    policy = lora_policy(model_dir)
    step(policy.model, policy.optimizer)
    path = tmp_path / "latest.pt"
    save_checkpoint(path, capture(*policy.checkpoint_state(), 1, {}, []))
    checkpoint = load_checkpoint(path)
    assert checkpoint is not None
    assert set(checkpoint.model_state) == set(lora.adapter_state(policy.model))  # no base weight in it
    step(policy.model, policy.optimizer)
    after_two = lora.adapter_state(policy.model)

    torch.manual_seed(99)
    resumed = lora_policy(model_dir)  # the base from the folder, an adapter that is not the run's
    resumed.restore(checkpoint.model_state, checkpoint.optimizer_state)
    step(resumed.model, resumed.optimizer)
    for name, tensor in lora.adapter_state(resumed.model).items():
        torch.testing.assert_close(tensor, after_two[name], atol=0, rtol=0)


def test_a_full_weight_checkpoint_does_not_restore_into_a_lora_model(tmp_path: Path) -> None:
    model_dir = build_char_folder(tmp_path / "model")
    full_model_state, full_optimizer_state = lora_policy(model_dir, enabled=False).checkpoint_state()
    with pytest.raises(ValueError, match="does not hold this run's LoRA adapter"):
        lora_policy(model_dir).restore(full_model_state, full_optimizer_state)


def test_lora_refuses_a_multi_rank_learner_and_targets_the_model_lacks() -> None:
    with pytest.raises(ValueError, match="target_modules"):
        lora.apply_lora(tiny_qwen2(vocab_size=20), LoraConfig(enabled=True, target_modules=("c_attn",)))
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        lora.apply_lora(tiny_qwen2(vocab_size=20), LoraConfig(enabled=True), world_size=2)


def test_the_signed_manifest_names_the_adapter_and_a_full_weight_manifest_is_as_before() -> None:
    from shared.weight_channel import LoraAdapter, ManifestError, verify_signature
    from shared.weight_channel.manifest import build_manifest
    from tests.weights_keys import PUBLIC_KEY, SIGNING_KEY

    full, _ = build_manifest(b"w" * 5000, run_id="r", policy_version=1, chunk_size_bytes=1024, signing_key=SIGNING_KEY)
    assert b"lora" not in full.to_json() and b"lora" not in full.body_bytes()  # older receivers take it
    adapter = LoraAdapter(rank=8, alpha=16.0, target_modules=["q_proj", "v_proj"], base_fingerprint="a" * 64)
    signed, _ = build_manifest(
        b"w" * 5000, run_id="r", policy_version=1, chunk_size_bytes=1024, signing_key=SIGNING_KEY, lora=adapter
    )
    verify_signature(signed, PUBLIC_KEY)
    assert type(signed).from_json(signed.to_json()).lora == adapter
    other_base = adapter.model_copy(update={"base_fingerprint": "b" * 64})
    for tampered in (signed.model_copy(update={"lora": None}), signed.model_copy(update={"lora": other_base})):
        with pytest.raises(ManifestError, match="forged or corrupt signature"):
            verify_signature(tampered, PUBLIC_KEY)
