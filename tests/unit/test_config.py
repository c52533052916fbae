import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from shared.config import KEPT_AT_DEFAULT, RunConfig, load_run_config
from shared.run_file import read_run_file


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


def run_file_settings() -> list[str]:
    """Every run-file setting as "section.key" (top-level keys as "key")."""
    names = []
    for section, field in RunConfig.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            names += [f"{section}.{key}" for key in model.model_fields]
        else:
            names.append(section)
    return names


def settings_changed_in_the_repo(repo_root: Path) -> set[str]:
    """What a shipped run file (configs/, benchmarks/, tests/e2e/) sets, and what a benchmark's code writes into a
    run file or config (the key quoted, or followed by `=`, as a cell's overrides and TOML text do)."""
    changed = set()
    run_files = [*(repo_root / "configs").glob("*.toml"), *(repo_root / "benchmarks").rglob("*.toml")]
    for path in [*run_files, *(repo_root / "tests" / "e2e").glob("*.toml")]:
        for key, value in read_run_file(path).items():
            changed |= {f"{key}.{name}" for name in value} if isinstance(value, dict) else {key}
    code = "\n".join(path.read_text() for path in (repo_root / "benchmarks").rglob("*.py"))
    for name in run_file_settings():
        key = name.rpartition(".")[2]
        if re.search(rf"[\"']{key}[\"']|{key}\s*=[^=]", code):
            changed.add(name)
    return changed


def test_every_setting_is_changed_by_a_shipped_run_or_says_why_it_is_one(repo_root: Path) -> None:
    unchanged = set(run_file_settings()) - settings_changed_in_the_repo(repo_root)
    assert sorted(unchanged - KEPT_AT_DEFAULT.keys()) == [], "remove them or say why in shared.config.KEPT_AT_DEFAULT"
    assert sorted(KEPT_AT_DEFAULT.keys() - unchanged) == [], "changed by a shipped run or gone: drop them from the list"
    assert all(0 < len(why) <= 120 and "\n" not in why for why in KEPT_AT_DEFAULT.values())
