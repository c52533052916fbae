"""`python -m benchmarks.gpu_check --smoke`: the GPU check's four parts on CPU at tiny sizes, the cluster part
booting the whole cluster for 3 steps; every part must come back with numbers (~2 min on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_smoke_run_fills_every_section(tmp_path: Path, repo_root: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "OUT"}  # no copy into a device's $OUT
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--smoke", "--out", str(tmp_path)]
    done = subprocess.run(
        [*command, "--runs-dir", str(tmp_path / "runs")], cwd=repo_root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check_smoke.json").read_text())

    assert results["failed_parts"] == [] and results["imports"]["not_importable"] == []
    assert results["device"].startswith("cpu") and results["torch"] and results["date"]
    learner = results["learner_step"]
    assert learner["precision"] == "mixed" and learner["compute_dtype"] == "torch.bfloat16"
    assert len(learner["steps"]) == 3  # two lengths, then the longest with gradient checkpointing
    for step in learner["steps"]:
        assert step["tokens_per_s"] > 0 and step["peak_memory_gib"] > 0
        assert step["mfu_with_attention"] > step["mfu"] > 0
    fsdp = results["fsdp"]
    assert fsdp["backend"] == "gloo" and fsdp["gathered_weights_finite"]
    assert fsdp["first_step_loss"] == pytest.approx(fsdp["plain_first_step_loss"], abs=1e-3)
    assert fsdp["tokens_per_s"] > 0
    engine = results["engine"]
    assert {engine["worker"]["dtype"], engine["other_dtype"]["dtype"]} == {"torch.float32", "torch.bfloat16"}
    assert min(engine["worker"]["tokens_per_s"] + engine["other_dtype"]["tokens_per_s"]) > 0
    cluster = results["cluster"]
    assert cluster["finished"] and cluster["num_steps"] == cluster["num_steps_target"] == 3
    assert cluster["reward_mean_first10"] is not None and cluster["wall_s"] > 0
