"""The whole cluster in LoRA mode (`python -m cluster.local --lora` with a short run file): the learner
publishes adapter-only versions, every worker applies them onto the base it holds and keeps sampling,
the checkpoint holds the adapter, and model_final is a plain HF folder with the adapter merged in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cluster.local import ClusterOptions
from services.learner.checkpoint import checkpoint_path, load_checkpoint
from shared.run_records import read_publish_journal
from shared.weight_channel import PEFT_PREFIX
from tests.cluster_runs import run_to_completion

pytestmark = pytest.mark.e2e


@pytest.mark.slow  # ~90 s on the shared 2-core machine, mostly starting the services
def test_a_lora_run_publishes_adapters_that_every_worker_applies(tmp_path: Path, repo_root: Path) -> None:
    cluster, report = run_to_completion(
        ClusterOptions(
            config_path=repo_root / "tests" / "e2e" / "lora_test.toml",
            lora=True,
            num_workers=2,
            runs_dir=tmp_path,
            progress_interval_s=1.0,
        )
    )

    assert report.num_steps == cluster.run.schedule.num_steps
    assert report.num_dead_letters == 0
    assert all(w.policy_version > 0 and w.num_groups_done > 0 for w in report.workers), report.workers
    base_bytes = (cluster.model_dir / "model.safetensors").stat().st_size
    published = read_publish_journal(cluster.run_dir / "broadcast.jsonl")
    assert len(published) == cluster.run.schedule.num_steps + 1  # version 0, then one per step
    assert all(p.payload == "full" and p.payload_size_bytes < base_bytes / 3 for p in published), published
    checkpoint = load_checkpoint(checkpoint_path(cluster.run_dir))
    assert checkpoint is not None and checkpoint.policy_version == cluster.run.schedule.num_steps
    assert checkpoint.model_state and all(name.startswith(PEFT_PREFIX) for name in checkpoint.model_state)

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(cluster.run_dir / "model_final", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(cluster.model_dir, dtype=torch.float32)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(final.state_dict()[name], base.state_dict()[name])  # the trained adapter, merged
    assert torch.equal(final.state_dict()["model.embed_tokens.weight"], base.state_dict()["model.embed_tokens.weight"])


def test_the_lora_flag_refuses_a_run_file_without_lora(repo_root: Path, tmp_path: Path) -> None:
    from cluster.local import LocalCluster

    with pytest.raises(ValueError, match="does not enable \\[lora\\]"):
        LocalCluster(ClusterOptions(config_path=repo_root / "configs" / "demo.toml", lora=True, runs_dir=tmp_path))
