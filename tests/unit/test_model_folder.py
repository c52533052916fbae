"""Which model folder a run uses (issue 9, items 6 and 7): the run file names it (`[model] path`) or
asks for the demo's tiny one (`[model] init = "tiny-random"`); the local runner takes --model-dir;
nothing builds a random model unasked."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.local import ClusterOptions, LocalCluster
from shared.config import RunConfig, load_run_config, resolve_model_dir
from shared.tokenization import ModelFolderError
from tests.hf_folders import CHAT_TEMPLATE, build_folder


def write_run(tmp_path: Path, model_section: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'run_id = "folder"\n[model]\n{model_section}\n')
    return path


def test_the_run_file_names_a_folder_or_asks_for_the_tiny_random_one_never_both(
    tmp_path: Path, repo_root: Path
) -> None:
    assert load_run_config(repo_root / "configs" / "demo.toml").model.init == "tiny-random"
    assert load_run_config(repo_root / "tests" / "e2e" / "cluster_test.toml").model.init == "tiny-random"
    run = load_run_config(write_run(tmp_path, 'path = "/models/qwen3-0.6b"'))
    assert run.model.path == Path("/models/qwen3-0.6b") and run.model.init is None
    with pytest.raises(ValueError, match="both path"):
        load_run_config(write_run(tmp_path, 'path = "/m"\ninit = "tiny-random"'))
    with pytest.raises(ValueError, match="init"):
        load_run_config(write_run(tmp_path, 'init = "random"'))


def test_rl_model_dir_wins_over_the_path_which_wins_over_the_run_dir(tmp_path: Path) -> None:
    named = RunConfig.model_validate({"model": {"path": "/models/a"}})
    assert resolve_model_dir(Path("/here/b"), named.model, tmp_path) == Path("/here/b")
    assert resolve_model_dir(None, named.model, tmp_path) == Path("/models/a")
    assert resolve_model_dir(None, RunConfig().model, tmp_path) == tmp_path / "model"


def test_the_local_runner_takes_model_dir_and_builds_nothing(tmp_path: Path) -> None:
    folder = build_folder(tmp_path / "user_model", chat_template=CHAT_TEMPLATE)
    config = write_run(tmp_path, "")
    cluster = LocalCluster(ClusterOptions(config_path=config, runs_dir=tmp_path / "runs", model_dir=folder))
    cluster.build_initial_policy()
    assert cluster.model_dir == folder.resolve()
    assert not (cluster.run_dir / "model").exists()

    named = write_run(tmp_path, f'path = "{folder}"')
    assert LocalCluster(ClusterOptions(config_path=named, runs_dir=tmp_path / "runs")).model_dir == folder.resolve()


def test_a_missing_folder_is_an_error_at_start_not_a_random_model(tmp_path: Path) -> None:
    cluster = LocalCluster(ClusterOptions(config_path=write_run(tmp_path, ""), runs_dir=tmp_path / "runs"))
    with pytest.raises(ModelFolderError, match="does not exist"):
        cluster.build_initial_policy()
    assert not (cluster.run_dir / "model" / "config.json").exists()
    missing = LocalCluster(
        ClusterOptions(config_path=write_run(tmp_path, ""), runs_dir=tmp_path / "runs", model_dir=tmp_path / "typo")
    )
    with pytest.raises(ModelFolderError, match="typo"):
        missing.build_initial_policy()


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_the_tiny_random_tokenizer_round_trips_prompts_for_every_architecture(
    tmp_path: Path, architecture: str
) -> None:
    """The character tokenizer decodes without separators whatever tokenizer class transformers picks
    for the model type (qwen3's joined characters with spaces: every prompt was refused as unencodable)."""
    from transformers import AutoTokenizer

    from services.learner.model_init import build_initial_policy
    from shared.config import ModelConfig
    from shared.tasks import TASKS
    from shared.tokenization import encode_prompt

    config = ModelConfig(init="tiny-random", architecture=architecture)
    folder = build_initial_policy(config, TASKS["arithmetic_mod10"].alphabet, tmp_path / architecture)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = encode_prompt(tokenizer, "12+7=")  # raises PromptEncodingError when decoding loses characters
    assert tokenizer.decode(ids) == "12+7="
    assert tokenizer.decode([*ids, tokenizer.eos_token_id], skip_special_tokens=True) == "12+7="
