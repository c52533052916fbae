from pathlib import Path

import pytest

from shared.config import RunConfig, load_run_config


def test_the_demo_config_loads_and_derives_the_in_flight_bound(repo_root: Path) -> None:
    run = load_run_config(repo_root / "configs" / "demo.toml")
    assert run.grpo.group_size == 8
    assert run.max_groups_in_flight == run.grpo.groups_per_step * max(1, run.schedule.staleness_bound - 1)


def test_the_in_flight_bound_keeps_at_least_one_step_even_when_synchronous() -> None:
    assert RunConfig.model_validate({"schedule": {"staleness_bound": 0}}).max_groups_in_flight == 64
    assert RunConfig.model_validate({"schedule": {"staleness_bound": 5}}).max_groups_in_flight == 4 * 64
    assert RunConfig.model_validate({"data": {"max_groups_in_flight": 7}}).max_groups_in_flight == 7


def test_the_verified_work_window_covers_the_lease_time() -> None:
    assert RunConfig().verified_work_window_s == 60.0  # 4 x 15 s
    assert RunConfig.model_validate({"rollout": {"claim_idle_ms": 600_000}}).verified_work_window_s == 2400.0
    assert RunConfig.model_validate({"activation": {"verified_work_window_s": 30.0}}).verified_work_window_s == 30.0
    with pytest.raises(ValueError, match="verified_work_window_s"):  # shorter than the lease: honest work unbilled
        RunConfig.model_validate({"activation": {"verified_work_window_s": 10.0}})


def test_overrides_replace_top_level_keys(repo_root: Path) -> None:
    assert load_run_config(repo_root / "configs" / "demo.toml", run_id="other").run_id == "other"


def test_bad_values_and_unknown_keys_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[grpo]\ngroup_size = 1\nlearning_rat = 0.1\n")
    with pytest.raises(ValueError) as excinfo:
        load_run_config(bad)
    assert "group_size" in str(excinfo.value) and "learning_rat" in str(excinfo.value)


def test_staleness_bound_cannot_be_negative() -> None:
    with pytest.raises(ValueError):
        RunConfig.model_validate({"schedule": {"staleness_bound": -1}})


def test_every_shipped_run_file_loads(repo_root: Path) -> None:
    files = sorted((repo_root / "configs").glob("*.toml"))
    assert len(files) >= 2
    for path in files:
        load_run_config(path)  # raises with the offending field named


def test_the_real_model_template_is_not_the_demo(repo_root: Path) -> None:
    """The demo's values fit a 124k-parameter model answering one character; a pretrained checkpoint
    needs its own (issue 9, item 11): a model folder, a fine-tuning learning rate, room to answer."""
    demo = load_run_config(repo_root / "configs" / "demo.toml")
    real = load_run_config(repo_root / "configs" / "qwen3.toml")
    assert real.model.path is not None and real.model.init is None
    assert real.grpo.learning_rate <= 1e-5 < demo.grpo.learning_rate
    assert real.grpo.max_new_tokens >= 64 > demo.grpo.max_new_tokens
    assert real.learner.micro_batch_size > 0 and real.learner.gradient_checkpointing
    assert real.rollout.engine == "auto" and demo.rollout.engine == "torch"
