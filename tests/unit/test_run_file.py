"""Run files that extend another (shared/run_file.py): the overlay, its errors, and the shipped overlays."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from shared.config import load_run_config
from shared.run_file import RunFileError, dump_run_file, read_run_file

BASE = """\
run_id = "base"

[grpo]
group_size = 4
groups_per_step = 8

[lora]
target_modules = ["q_proj", "v_proj"]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_an_overlay_replaces_the_keys_it_sets_and_keeps_the_rest_of_each_section(tmp_path: Path) -> None:
    write(tmp_path, "base.toml", BASE)
    overlay = write(
        tmp_path,
        "top.toml",
        'extends = "base.toml"\nrun_id = "top"\n[grpo]\ngroups_per_step = 2\n[lora]\ntarget_modules = ["o_proj"]\n',
    )
    raw = read_run_file(overlay)
    assert raw == {
        "run_id": "top",
        "grpo": {"group_size": 4, "groups_per_step": 2},
        "lora": {"target_modules": ["o_proj"]},
    }
    run = load_run_config(overlay)
    assert (run.run_id, run.grpo.group_size, run.grpo.groups_per_step) == ("top", 4, 2)


def test_a_chain_resolves_relative_to_each_file_and_a_loop_is_named(tmp_path: Path) -> None:
    (tmp_path / "bases").mkdir()
    write(tmp_path / "bases", "base.toml", BASE)
    write(tmp_path / "bases", "middle.toml", 'extends = "base.toml"\n[grpo]\ngroup_size = 6\n')
    top = write(tmp_path, "top.toml", 'extends = "bases/middle.toml"\n[grpo]\ngroups_per_step = 1\n')
    assert read_run_file(top)["grpo"] == {"group_size": 6, "groups_per_step": 1}

    write(tmp_path, "a.toml", 'extends = "b.toml"\n')
    write(tmp_path, "b.toml", 'extends = "a.toml"\n')
    with pytest.raises(RunFileError, match="loops back"):
        read_run_file(tmp_path / "a.toml")


def test_a_missing_base_names_both_files_and_a_bad_key_in_the_overlay_is_still_named(tmp_path: Path) -> None:
    orphan = write(tmp_path, "orphan.toml", 'extends = "gone.toml"\n')
    with pytest.raises(RunFileError, match=r"gone\.toml.*extended by .*orphan\.toml"):
        read_run_file(orphan)
    write(tmp_path, "base.toml", BASE)
    typo = write(tmp_path, "typo.toml", 'extends = "base.toml"\n[grpo]\ngroup_sizes = 2\n')
    with pytest.raises(ValueError, match="group_sizes"):
        load_run_config(typo)


def test_dumped_run_files_read_back_equal_with_no_extends_left(repo_root: Path) -> None:
    for path in sorted((repo_root / "configs").glob("*.toml")):
        raw = read_run_file(path)
        text = dump_run_file(raw)
        assert "extends" not in tomllib.loads(text) and tomllib.loads(text) == raw, path.name


def test_the_shipped_overlays_are_their_base_plus_what_they_say(repo_root: Path) -> None:
    """Each near-copy is an overlay: a reader sees at the top of the file what differs from its base."""
    overlays = {
        "demo_lora.toml": "demo.toml",
        "smollm2_lora.toml": "smollm2.toml",
        "gpu_check_smoke.toml": "gpu_check.toml",
        "gpu_smoke_cpu.toml": "gpu_smoke.toml",
    }
    for overlay, base in overlays.items():
        own = tomllib.loads((repo_root / "configs" / overlay).read_text())
        assert own.pop("extends") == base, overlay
        resolved, base_raw = read_run_file(repo_root / "configs" / overlay), read_run_file(repo_root / "configs" / base)
        for section, values in own.items():  # what the overlay says wins
            assert resolved[section] == (base_raw.get(section, {}) | values if isinstance(values, dict) else values)
        for section, values in base_raw.items():  # what it does not say is the base's
            if isinstance(values, dict):
                assert all(
                    resolved[section][key] == value for key, value in values.items() if key not in own.get(section, {})
                )
    lora = load_run_config(repo_root / "configs" / "demo_lora.toml")
    demo = load_run_config(repo_root / "configs" / "demo.toml")
    assert lora.lora.enabled and not demo.lora.enabled
    assert lora.model_dump(exclude={"run_id", "lora"}) == demo.model_dump(exclude={"run_id", "lora"})
